package sasigner

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/trust"
)

// publisher is `publish-key --watch` as a signer master runs it
// (sa-key-publish.service with no public-key configured): --signing-key
// alone, whose public half it publishes.
type publisher struct {
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
}

func startPublisher(t *testing.T, endpoint, host, keyFile, stateDir string) *publisher {
	t.Helper()
	p := &publisher{out: newLogBuffer(), done: make(chan struct{})}
	p.cmd = exec.Command(safeRestartBin, "publish-key", "--watch", "--config=", "--endpoints="+endpoint, "--host="+host,
		"--signing-key="+keyFile, "--state-dir="+stateDir, "--grace=0s", "--ttl=2", "--reconcile-interval=5s")
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	p.out.waitFor(t, "alive record written", 30*time.Second)
	return p
}

// stop ends the publisher and waits until its alive record's lease is
// revoked (SIGTERM), as systemd stops it.
func (p *publisher) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
}

// waitServed waits until s's FetchKeys answer is exactly want (sorted),
// asking again each time the signer logs something (a key set change is
// logged) and at least every second: a key set change may be logged
// before the answer is asked for.
func waitServed(t *testing.T, s *signer, what string, want ...string) {
	t.Helper()
	sort.Strings(want)
	deadline := time.After(30 * time.Second)
	for {
		s.out.mu.Lock()
		wake := s.out.cond
		s.out.mu.Unlock()
		got := kids(s.fetch(t))
		if slices.Equal(got, want) {
			return
		}
		select {
		case <-wake:
		case <-time.After(time.Second):
		case <-deadline:
			t.Fatalf("%s: FetchKeys serves %v, want %v\nsigner:\n%s", what, got, want, tail(s.out.String(), 20))
		}
	}
}

// retire runs retire-keys from a master (host, its signing key) as
// sa-key-retire.timer does: it must exit 0.
func retire(t *testing.T, endpoint, host, keyFile string) string {
	t.Helper()
	out, err := runRotateEnv(t, nil, "retire-keys", "--config=", "--endpoints="+endpoint, "--host="+host,
		"--signing-key="+keyFile, "--public-key="+filepath.Join(filepath.Dir(keyFile), "sa.pub"))
	if err != nil {
		t.Fatalf("retire-keys on %s: %v\n%s", host, err, out)
	}
	return out
}

// waitEtcd returns once key's value satisfies ok, woken by etcd's watch.
func waitEtcd(t *testing.T, e *etcdtest.Server, key string, ok func(v string, exists bool) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := e.Client(t)
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) > 0 && ok(string(resp.Kvs[0].Value), true) || len(resp.Kvs) == 0 && ok("", false) {
		return
	}
	for w := range cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range w.Events {
			if ok(string(ev.Kv.Value), ev.Type == clientv3.EventTypePut) {
				return
			}
		}
	}
	t.Fatalf("%s: the value wanted never came; now %q", key, etcdValue(t, e, key))
}

func etcdValue(t *testing.T, e *etcdtest.Server, key string) string {
	t.Helper()
	resp, err := e.Client(t).Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// TestSignerReimageServesSupersededUntilRetired is issue 31 point 8 on two
// signer masters, each with its publisher (--signing-key only). m1 is
// reimaged: a new sa.key, no cache file, no publisher state. Its publisher
// supersedes the lost key, and every signer, m1's new one included, keeps
// serving it, so that tokens m1's old apiserver signed verify everywhere:
// after the value is deleted by mistake (republished), and while m1's
// trust record still says its apiserver signs with it (retire-keys keeps
// it). m1's new signer signs only once m2's apiserver fetched its new key
// (the barrier), then its record names the new key, and retire-keys
// retires the old one: every signer stops serving it. An etcd restored
// from before the retirement brings the key back (the signers follow the
// restored etcd, as they must); m1's publisher, which kept the tombstone
// on disk, retires it again and the signers drop it again.
func TestSignerReimageServesSupersededUntilRetired(t *testing.T) {
	e := etcdtest.Start(t)
	ep := e.Endpoint
	d1, d2 := shortDir(t), shortDir(t)
	old1, k2 := newSAKey(t, "ecdsa"), newSAKey(t, "ecdsa")
	key1, key2 := filepath.Join(d1, "sa.key"), filepath.Join(d2, "sa.key")
	old1.write(t, key1)
	k2.write(t, key2)
	pub1 := startPublisher(t, ep, "m1", key1, filepath.Join(d1, "state"))
	e.Put(t, keysPrefix+"m2", k2.pub)
	s1 := startSigner(t, signerArgs(d1, ep, key1, "--host=m1", "--trust-timeout=5m")...)
	s2 := startSigner(t, signerArgs(d2, ep, key2, "--host=m2", "--trust-timeout=5m")...)
	// Each apiserver fetches: the records list both keys, and each
	// signer's barrier for its first key passes.
	waitServed(t, s1, "before the reimage", old1.kid, k2.kid)
	waitServed(t, s2, "before the reimage", old1.kid, k2.kid)
	s1.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)
	s2.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)
	s1.fetch(t) // the apiserver's next fetch records what it signs with now
	waitRecord(t, e, "m1", `"signing":"`+old1.kid+`"`)

	// m1 reimaged: its signer, publisher, cache and state are gone with
	// its disk; it boots with a new key.
	s1.stop(syscall.SIGTERM)
	pub1.stop()
	d1 = shortDir(t)
	new1 := newSAKey(t, "ecdsa")
	key1 = filepath.Join(d1, "sa.key")
	new1.write(t, key1)
	pub1 = startPublisher(t, ep, "m1", key1, filepath.Join(d1, "state"))
	both := func(v string, _ bool) bool {
		return strings.Contains(v, strings.TrimSpace(old1.pub)) && strings.Contains(v, strings.TrimSpace(new1.pub))
	}
	waitEtcd(t, e, keysPrefix+"m1", both)

	// Point 2: the value deleted by mistake comes back whole, the
	// superseded key with it, from the key record.
	if _, err := e.Client(t).Delete(context.Background(), keysPrefix+"m1"); err != nil {
		t.Fatal(err)
	}
	waitEtcd(t, e, keysPrefix+"m1", both)
	pub1.out.waitFor(t, "value-missing", 30*time.Second)
	backup := e.Backup(t) // m1's old key superseded, due (grace 0), not retired

	// Point 5: due, but m1's record (its old signer's) says its apiserver
	// signs with it: kept.
	out := retire(t, ep, "m2", key2)
	if !strings.Contains(out, "the apiserver on m1 signs with it (trust record): kept") {
		t.Fatalf("retire-keys did not keep m1's old key for m1's record:\n%s", out)
	}

	// Point 6: m1's new signer (a new master: no cache) serves every
	// published key, m1's old one too, and signs only once m2's apiserver
	// fetched its new key: nothing has asked m2's signer since the reimage.
	s1 = startSigner(t, signerArgs(d1, ep, key1, "--host=m1", "--trust-timeout=5m")...)
	waitServed(t, s1, "m1's new signer", old1.kid, new1.kid, k2.kid)
	waitRecord(t, e, "m1", new1.kid)
	if strings.Contains(s1.out.String(), "fetched this host's key: signing") {
		t.Fatalf("m1's new signer signs before m2's apiserver fetched its key:\n%s", s1.out.String())
	}
	// m2's apiserver fetches: m1's old key still served there too, and
	// m2's record now lists m1's new key.
	waitServed(t, s2, "m2 after m1's reimage", old1.kid, new1.kid, k2.kid)
	s1.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)
	if kid := signKid(t, s1); kid != new1.kid {
		t.Fatalf("m1's new signer signs with %s, want %s", kid, new1.kid)
	}
	s1.fetch(t) // m1's apiserver's next fetch records what it signs with now
	waitRecord(t, e, "m1", `"signing":"`+new1.kid+`"`)

	// No apiserver signs with the old key any more: retired, and no
	// signer serves it.
	out = retire(t, ep, "m2", key2)
	if !strings.Contains(out, "key "+old1.kid+" retired") {
		t.Fatalf("retire-keys did not retire m1's old key:\n%s", out)
	}
	waitServed(t, s1, "m1 after the retirement", new1.kid, k2.kid)
	waitServed(t, s2, "m2 after the retirement", new1.kid, k2.kid)
	pub1.out.waitFor(t, "tombstones seen kept on disk", 30*time.Second)

	// etcd restored from before the retirement: the signers serve what
	// etcd holds (the old key, superseded there), until m1's publisher
	// retires it again from its tombstones.
	pub1.stop()
	e.RestoreBackup(t, backup)
	waitServed(t, s2, "m2 on the restored etcd", old1.kid, new1.kid, k2.kid)
	s2.out.waitFor(t, "etcd restore", 30*time.Second)
	pub1 = startPublisher(t, ep, "m1", key1, filepath.Join(d1, "state"))
	pub1.out.waitFor(t, "tombstone-missing", 30*time.Second)
	waitServed(t, s1, "m1 after the publisher retired the key again", new1.kid, k2.kid)
	waitServed(t, s2, "m2 after the publisher retired the key again", new1.kid, k2.kid)
	if v := etcdValue(t, e, keysPrefix+"m1"); strings.Count(v, "BEGIN PUBLIC KEY") != 1 {
		t.Fatalf("m1's value after the repair:\n%s", v)
	}
}

// bundleRecord writes the trust record a bundle-mode master's helper
// writes at its apiserver's restart: the keys of the bundle confd rendered
// from every published value, and the key its apiserver signs with.
func bundleRecord(t *testing.T, e *etcdtest.Server, host, signing string, trusted ...string) {
	t.Helper()
	sort.Strings(trusted)
	rec := trust.Record{Host: host, Trusted: trusted, Signing: signing, Time: time.Now()}
	if err := trust.Put(context.Background(), e.Client(t), strings.TrimSuffix(trustPrefix, "/"), "", rec); err != nil {
		t.Fatal(err)
	}
}

// TestMixedFleetServesSupersededUntilRetired is issue 31 point 8 in a mixed
// fleet: m1 a binary master in bundle mode (sa.pub published with
// publish-key --public-key, its trust record written at its restarts), m2
// a signer master (publish-key --watch with --signing-key alone). Each is
// reimaged in turn; the other keeps its superseded key (m2's signer serves
// m1's, m1's bundle holds m2's: confd renders m2's value, which keeps it)
// until retire-keys, run on the other master, retires it, which it does
// only once the reimaged host's record no longer says its apiserver signs
// with it.
func TestMixedFleetServesSupersededUntilRetired(t *testing.T) {
	e := etcdtest.Start(t)
	ep := e.Endpoint
	d1, d2 := shortDir(t), shortDir(t)
	a1, b1 := newSAKey(t, "rsa"), newSAKey(t, "ecdsa")
	key1, pub1, key2 := filepath.Join(d1, "sa.key"), filepath.Join(d1, "sa.pub"), filepath.Join(d2, "sa.key")
	publishBundle := func(k saKey) {
		t.Helper()
		k.write(t, key1)
		writeFile(t, pub1, k.pub)
		if out, err := runRotateEnv(t, nil, "publish-key", "--config=", "--endpoints="+ep, "--host=m1", "--public-key="+pub1, "--grace=0s"); err != nil {
			t.Fatalf("publish-key on m1: %v\n%s", err, out)
		}
	}
	publishBundle(a1)
	b1.write(t, key2)
	pubM2 := startPublisher(t, ep, "m2", key2, filepath.Join(d2, "state"))
	bundleRecord(t, e, "m1", a1.kid, a1.kid, b1.kid)
	s2 := startSigner(t, signerArgs(d2, ep, key2, "--host=m2", "--trust-timeout=5m")...)
	waitServed(t, s2, "before the reimages", a1.kid, b1.kid)
	s2.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)
	s2.fetch(t) // m2's apiserver's next fetch records what it signs with now
	waitRecord(t, e, "m2", `"signing":"`+b1.kid+`"`)

	// m1 (bundle) reimaged: its old key is superseded; m2's signer serves
	// it while m1's record says its apiserver signs with it.
	a2 := newSAKey(t, "rsa")
	publishBundle(a2)
	waitServed(t, s2, "m2 after m1's reimage", a1.kid, a2.kid, b1.kid)
	if out := retire(t, ep, "m2", key2); !strings.Contains(out, "the apiserver on m1 signs with it (trust record): kept") {
		t.Fatalf("retire-keys on m2 did not keep m1's old key:\n%s", out)
	}
	waitServed(t, s2, "m2 after retire-keys kept m1's old key", a1.kid, a2.kid, b1.kid)
	// m1's apiserver restarted on the new key (its bundle: every value).
	bundleRecord(t, e, "m1", a2.kid, a1.kid, a2.kid, b1.kid)
	if out := retire(t, ep, "m2", key2); !strings.Contains(out, "key "+a1.kid+" retired") {
		t.Fatalf("retire-keys on m2 did not retire m1's old key:\n%s", out)
	}
	waitServed(t, s2, "m2 after m1's old key was retired", a2.kid, b1.kid)

	// m2 (signer) reimaged: its publisher supersedes the lost key; m1's
	// bundle is rendered from m2's value, which keeps it.
	s2.stop(syscall.SIGTERM)
	pubM2.stop()
	d2 = shortDir(t)
	b2 := newSAKey(t, "ecdsa")
	key2 = filepath.Join(d2, "sa.key")
	b2.write(t, key2)
	startPublisher(t, ep, "m2", key2, filepath.Join(d2, "state"))
	waitEtcd(t, e, keysPrefix+"m2", func(v string, _ bool) bool {
		return strings.Contains(v, strings.TrimSpace(b1.pub)) && strings.Contains(v, strings.TrimSpace(b2.pub))
	})
	if out := retire(t, ep, "m1", key1); !strings.Contains(out, "the apiserver on m2 signs with it (trust record): kept") {
		t.Fatalf("retire-keys on m1 did not keep m2's old key while m2's record says it signs with it:\n%s", out)
	}
	s2 = startSigner(t, signerArgs(d2, ep, key2, "--host=m2", "--trust-timeout=5m")...)
	waitServed(t, s2, "m2's new signer", a2.kid, b1.kid, b2.kid)
	// m1's confd renders the new key into its bundle and restarts its
	// apiserver: its record lists it, and m2's signer starts signing.
	bundleRecord(t, e, "m1", a2.kid, a2.kid, b1.kid, b2.kid)
	s2.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)
	s2.fetch(t)
	waitRecord(t, e, "m2", `"signing":"`+b2.kid+`"`)
	if out := retire(t, ep, "m1", key1); !strings.Contains(out, "key "+b1.kid+" retired") {
		t.Fatalf("retire-keys on m1 did not retire m2's old key:\n%s", out)
	}
	waitServed(t, s2, "m2 after its old key was retired", a2.kid, b2.kid)
	waitEtcd(t, e, keysPrefix+"m2", func(v string, _ bool) bool {
		return strings.Count(v, "BEGIN PUBLIC KEY") == 1 && strings.Contains(v, strings.TrimSpace(b2.pub))
	})
}

// TestForgetHostReleasesSignerBarrier is point 4 with the real signer: a
// rotation's barrier waits for m3, a dead master whose trust record lacks
// the new key; forget-host m3 (run on m1) deletes that record, and the
// waiting barrier passes at once: the new key signs, m3's key is still
// served (superseded, until retire-keys after the grace).
func TestForgetHostReleasesSignerBarrier(t *testing.T) {
	e := etcdtest.Start(t)
	ep := e.Endpoint
	dir := shortDir(t)
	old, next, k3 := newSAKey(t, "ecdsa"), newSAKey(t, "ecdsa"), newSAKey(t, "ecdsa")
	keyFile := filepath.Join(dir, "sa.key")
	old.write(t, keyFile)
	e.Put(t, keysPrefix+"m1", old.pub)
	e.Put(t, keysPrefix+"m3", k3.pub)
	bundleRecord(t, e, "m3", k3.kid, old.kid, k3.kid)
	s := startSigner(t, signerArgs(dir, ep, keyFile, "--host=m1", "--trust-timeout=5m")...)
	waitServed(t, s, "before the rotation", old.kid, k3.kid)
	s.out.waitFor(t, "fetched this host's key: signing", 30*time.Second)

	e.Put(t, keysPrefix+"m1", old.pub+next.pub)
	next.write(t, keyFile)
	_ = s.cmd.Process.Signal(syscall.SIGHUP)
	s.out.waitFor(t, "new signing key served", 10*time.Second)
	waitServed(t, s, "during the barrier", old.kid, next.kid, k3.kid) // m1's record lists the new key
	waitRecord(t, e, "m1", next.kid)
	s.out.waitFor(t, `"hosts":"m3"`, 30*time.Second) // the barrier names the host it waits for
	if kid := signKid(t, s); kid != old.kid {
		t.Fatalf("signing with %s while m3's record lacks it, want the previous %s", kid, old.kid)
	}

	if out, err := runRotateEnv(t, nil, "forget-host", "--config=", "--endpoints="+ep, "--host=m1", "--grace=1h", "m3"); err != nil {
		t.Fatalf("forget-host m3: %v\n%s", err, out)
	}
	s.out.waitFor(t, "every recorded host's apiserver fetched the new key: signing with it", 30*time.Second)
	if kid := signKid(t, s); kid != next.kid {
		t.Fatalf("signing with %s after forget-host m3, want %s", kid, next.kid)
	}
	waitServed(t, s, "after forget-host", old.kid, next.kid, k3.kid)
}
