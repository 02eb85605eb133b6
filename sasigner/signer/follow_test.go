package signer

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/logfmt"
)

type follow struct {
	ks      *KeySet
	changes chan *Snapshot
	synced  chan struct{}
	log     *syncBuffer
	metrics *Metrics
}

// startFollower follows endpoint into ks; opts change the Follower before
// it runs.
func startFollower(t *testing.T, endpoint string, ks *KeySet, opts ...func(*Follower)) *follow {
	t.Helper()
	f := &follow{ks: ks, changes: make(chan *Snapshot, 100), synced: make(chan struct{}), log: &syncBuffer{}, metrics: NewMetrics()}
	ks.OnDiff = func(Change) { f.changes <- ks.Snapshot() }
	log := logrus.New()
	log.SetOutput(io.MultiWriter(testWriter{t}, f.log))
	fl := &Follower{
		Connect: connectOnce(t, endpoint),
		Prefix:  "/keys/", Keys: ks, Log: log, RequestTimeout: 2 * time.Second, Retry: 100 * time.Millisecond, Probe: 200 * time.Millisecond,
		Metrics: f.metrics,
	}
	for _, o := range opts {
		o(fl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fl.Run(ctx, func() { close(f.synced) }); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// waitFor waits for a snapshot satisfying ok.
func (f *follow) waitFor(t *testing.T, what string, ok func(*Snapshot) bool) *Snapshot {
	t.Helper()
	if s := f.ks.Snapshot(); ok(s) {
		return s
	}
	timeout := time.After(20 * time.Second)
	for {
		select {
		case s := <-f.changes:
			if ok(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("%s: not seen; serving %v", what, f.ks.Snapshot().IDs())
		}
	}
}

func has(ids ...string) func(*Snapshot) bool {
	return func(s *Snapshot) bool {
		for _, id := range ids {
			if !slices.Contains(s.IDs(), id) {
				return false
			}
		}
		return true
	}
}

func lacks(id string) func(*Snapshot) bool {
	return func(s *Snapshot) bool { return !slices.Contains(s.IDs(), id) }
}

// TestFollowEtcd follows a real etcd: published keys appear and go, a
// refused value keeps the host's previous keys, and a key deeper than
// PREFIX/HOST or beside the prefix is not read.
func TestFollowEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	sk := mustSigningKey(t, keytest.EC(t))
	k1, k2, k3, k4 := keytest.RSA(t, 2048), keytest.EC(t), keytest.EC(t), keytest.EC(t)
	id := func(pub any) string { return keytest.KeyID(t, pub) }
	e.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	e.Put(t, "/keys/h2", string(keytest.PublicPEM(t, &k2.PublicKey)))
	e.Put(t, "/keys/h2/deeper", string(keytest.PublicPEM(t, &k3.PublicKey)))
	e.Put(t, "/keys-trust/h1", string(keytest.PublicPEM(t, &k3.PublicKey)))
	sec1, _ := x509.MarshalECPrivateKey(k4)
	e.Put(t, "/keys/h3", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})))

	f := startFollower(t, e.Endpoint, NewKeySet(nil, sk))
	<-f.synced
	s := f.ks.Snapshot()
	if want := []string{sk.KeyID, id(&k1.PublicKey), id(&k2.PublicKey)}; !has(want...)(s) || len(s.Keys) != 3 {
		t.Fatalf("after the first read: %v, want %v", s.IDs(), want)
	}

	// A new key for h1 replaces its old one.
	e.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k3.PublicKey)))
	f.waitFor(t, "h1's new key", func(s *Snapshot) bool { return has(id(&k3.PublicKey))(s) && lacks(id(&k1.PublicKey))(s) })

	// h2 publishes garbage: its previous key stays served. (The later put
	// of h4 is seen after it, the watch delivering in order.)
	e.Put(t, "/keys/h2", "garbage")
	e.Put(t, "/keys/h4", string(keytest.PublicPEM(t, &k4.PublicKey)))
	s = f.waitFor(t, "h4's key", has(id(&k4.PublicKey)))
	if !has(id(&k2.PublicKey))(s) {
		t.Fatalf("h2's previous key dropped after a refused value: %v", s.IDs())
	}

	// A deleted host's keys are withdrawn.
	if _, err := e.Client(t).Delete(context.Background(), "/keys/h4"); err != nil {
		t.Fatal(err)
	}
	f.waitFor(t, "h4 withdrawn", lacks(id(&k4.PublicKey)))
}

// TestFollowEtcdDown: while etcd is down the set served is kept whole;
// when it is back, changes made meanwhile are read.
func TestFollowEtcdDown(t *testing.T) {
	e := etcdtest.Start(t)
	sk := mustSigningKey(t, keytest.EC(t))
	k1, k2 := keytest.RSA(t, 2048), keytest.EC(t)
	e.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	f := startFollower(t, e.Endpoint, NewKeySet(nil, sk))
	<-f.synced
	before := f.ks.Snapshot()

	e.Stop()
	f.waitLog(t, "etcd unreachable: serving the last good key set")
	if s := f.ks.Snapshot(); s != before {
		t.Fatalf("set changed while etcd was down: %v, was %v", s.IDs(), before.IDs())
	}
	e.Restart(t)
	e.Put(t, "/keys/h2", string(keytest.PublicPEM(t, &k2.PublicKey)))
	f.waitFor(t, "h2 after etcd came back", has(keytest.KeyID(t, &k1.PublicKey), keytest.KeyID(t, &k2.PublicKey)))
	f.waitLog(t, "etcd reachable again")
}

// TestStartWithEtcdDown: a signer started while etcd is unreachable serves
// the cached set, and follows etcd once it answers.
func TestStartWithEtcdDown(t *testing.T) {
	sk := mustSigningKey(t, keytest.EC(t))
	k1 := keytest.RSA(t, 2048)
	old := NewKeySet(nil, sk)
	old.SetHost("h1", []Key{keyOf(t, &k1.PublicKey)})
	cache := old.Cache()

	ks := NewKeySet(nil, sk)
	ks.Restore(cache.Hosts, cache.IDs, cache.Time)
	f := startFollower(t, etcdtest.UnusedEndpoint(t), ks)
	f.waitLog(t, "etcd unreachable: serving the last good key set")
	s := ks.Snapshot()
	if !slices.Equal(s.IDs(), cache.IDs) || !s.Time.Equal(cache.Time) {
		t.Fatalf("serving %v at %s while etcd is down, want the cached %v at %s", s.IDs(), s.Time, cache.IDs, cache.Time)
	}
}

// TestFollowLogs: in the text log format, which prints fields raw, an
// etcd key with a newline stays on its line; a private key published over
// a value already refused is logged, not only counted; an RSA key under
// 2048 bits is served, warned once and counted once.
func TestFollowLogs(t *testing.T) {
	e := etcdtest.Start(t)
	sk := mustSigningKey(t, keytest.EC(t))
	text := &syncBuffer{}
	log := logrus.New()
	log.SetFormatter(&logfmt.ConfdFormatter{Tag: "kube-apiserver-sa-signer", Hostname: "m1", PID: 1})
	log.SetOutput(io.MultiWriter(testWriter{t}, text))
	f := startFollower(t, e.Endpoint, NewKeySet(nil, sk), func(fl *Follower) { fl.Log = log })
	<-f.synced

	forged := "/keys/evil\n2026-01-01T00:00:00Z m1 kube-apiserver-sa-signer[1]: INFO forged"
	e.Put(t, forged, "garbage")
	e.Put(t, "/keys/h2", "garbage")
	k := keytest.EC(t)
	sec1, _ := x509.MarshalECPrivateKey(k)
	e.Put(t, "/keys/h2", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1})))
	weak := keytest.RSA(t, 1024)
	e.Put(t, "/keys/h3", string(keytest.PublicPEM(t, &weak.PublicKey)))
	f.waitFor(t, "h3's RSA-1024 key served", has(keytest.KeyID(t, &weak.PublicKey)))
	e.Put(t, "/keys/h4", string(keytest.PublicPEM(t, &weak.PublicKey))) // the same key again
	// Seen after every put above: the watch delivers in order.
	last := keytest.EC(t)
	e.Put(t, "/keys/h5", string(keytest.PublicPEM(t, &last.PublicKey)))
	f.waitFor(t, "h5", has(keytest.KeyID(t, &last.PublicKey)))

	out := text.String()
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "2026-01-01T00:00:00Z") {
			t.Errorf("a forged line in the log: %q", line)
		}
	}
	if !strings.Contains(out, "private key must never be published") {
		t.Errorf("the private key published over a refused value is not logged:\n%s", out)
	}
	if !strings.Contains(out, `key="/keys/evil\n2026`) {
		t.Errorf("the key with a newline is not quoted:\n%s", out)
	}
	if n := strings.Count(out, "under 2048 bits"); n != 1 {
		t.Errorf("RSA-1024 key warned %d times, want once:\n%s", n, out)
	}
	if n := metricValue(t, f.metrics, "kube_apiserver_sa_signer_published_weak_keys_total", "", ""); n != 1 {
		t.Errorf("published_weak_keys_total %v, want 1", n)
	}
}
