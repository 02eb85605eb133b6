package saferestart

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// waitingFleet is m1, a master whose trust record does not list m2's new
// key yet, and m2's new key file: what wait-trusted on a reimaged m2 waits
// for.
type waitingFleet struct {
	srv    *etcdtest.Server
	keyPEM string // m2's new public key file
	kid    string
}

func newWaitingFleet(t *testing.T) *waitingFleet {
	t.Helper()
	s := etcdtest.Start(t)
	old, next := keytest.EC(t), keytest.EC(t)
	f := &waitingFleet{srv: s, kid: keytest.KeyID(t, &next.PublicKey),
		keyPEM: writeFile(t, filepath.Join(t.TempDir(), "sa.pub"), keytest.PublicPEM(t, &next.PublicKey))}
	s.Put(t, keysPrefix+"/m1", string(keytest.PublicPEM(t, &old.PublicKey)))
	s.Put(t, keysPrefix+"/m2", string(keytest.PublicPEM(t, &next.PublicKey)))
	f.trustM1(t, keytest.KeyID(t, &old.PublicKey))
	return f
}

// trustM1 records m1's apiserver as loading kids.
func (f *waitingFleet) trustM1(t *testing.T, kids ...string) {
	t.Helper()
	cli := f.srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := trust.Put(ctx, cli, trustPrefix, "", trust.Record{Host: "m1", Trusted: kids, Signing: kids[0], Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// waitingRecord is m2's waiting record, "" when there is none.
func (f *waitingFleet) waitingRecord(t *testing.T) string {
	t.Helper()
	v, _ := getKey(t, f.srv.Client(t), rotationPrefix+"/m2/waiting")
	return v
}

// waitGone returns once key is deleted (its lease revoked or expired),
// woken by etcd's watch, not a timer.
func waitGone(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return
	}
	for w := range cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range w.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatalf("%s still there after %s", key, waitLimit)
}

// After a whole-site power cut the apiserver's ExecStartPre may run before
// etcd answers: wait-trusted keeps trying etcd until --timeout (it used to
// exit 1 at once, and systemd's start limit then left the apiserver down),
// logs the outage's start and end, and succeeds once the key is trusted.
// While it waits it keeps a lease-bound waiting record, removed when it ends.
func TestWaitTrustedOutlastsEtcdOutage(t *testing.T) {
	f := newWaitingFleet(t)
	f.srv.Stop()
	w := bin(t, env(f.srv), "wait-trusted", "--public-key", f.keyPEM, "--host", "m2", "--exclude-host", "m2",
		"--dial-timeout", "500ms", "--timeout", "2m")
	w.stderr.waitFor(t, "etcd does not answer")
	if w.exited() {
		t.Fatalf("wait-trusted gave up while etcd was down: exit %d", w.code)
	}
	f.srv.Restart(t)
	w.stderr.waitFor(t, "etcd answers again")
	w.stderr.waitFor(t, "waiting record "+rotationPrefix+"/m2/waiting written")
	var rec struct {
		Host  string    `json:"host"`
		Keys  []string  `json:"keys"`
		Since time.Time `json:"since"`
		PID   int       `json:"pid"`
	}
	if err := json.Unmarshal([]byte(f.waitingRecord(t)), &rec); err != nil || rec.Host != "m2" || strings.Join(rec.Keys, ",") != f.kid ||
		rec.PID != w.cmd.Process.Pid || rec.Since.IsZero() {
		t.Fatalf("waiting record %+v (%v), want m2 waiting for %s, pid %d", rec, err, f.kid, w.cmd.Process.Pid)
	}
	f.trustM1(t, f.kid)
	if code := w.wait(t); code != codeOK {
		t.Fatalf("wait-trusted: exit %d, want 0", code)
	}
	if v := f.waitingRecord(t); v != "" {
		t.Fatalf("waiting record left behind: %s", v)
	}
}

// Killed (SIGKILL: nothing cleans up), wait-trusted's record goes with its
// lease (--ttl), so that it never excuses a host that no longer waits.
func TestWaitTrustedRecordGoesWithProcess(t *testing.T) {
	f := newWaitingFleet(t)
	w := bin(t, env(f.srv), "wait-trusted", "--public-key", f.keyPEM, "--host", "m2", "--exclude-host", "m2", "--ttl", "2", "--timeout", "2m")
	w.stderr.waitFor(t, "waiting record "+rotationPrefix+"/m2/waiting written")
	if f.waitingRecord(t) == "" {
		t.Fatal("no waiting record while wait-trusted waits")
	}
	w.signal(t, syscall.SIGKILL)
	w.wait(t)
	waitGone(t, f.srv.Client(t), rotationPrefix+"/m2/waiting")
}

// etcd that never answers: exit 5 at --timeout, naming what it waited for.
func TestWaitTrustedEtcdNeverAnswers(t *testing.T) {
	f := newWaitingFleet(t)
	f.srv.Stop()
	p := runBin(t, env(f.srv), "wait-trusted", "--public-key", f.keyPEM, "--host", "m2", "--dial-timeout", "300ms", "--timeout", "2s")
	if p.code != codeLockTimeout || !strings.Contains(p.stderr.String(), "etcd did not answer within --timeout 2s") || !strings.Contains(p.stderr.String(), f.kid) {
		t.Fatalf("exit %d, want %d naming etcd and key %s\n%s", p.code, codeLockTimeout, f.kid, p.stderr)
	}
}

// After an etcd restore every trust record is the snapshot's: m1's says its
// apiserver loads m1's old key only, though its bundle on disk also holds
// m2's new key. m2, signing with that new key, waits in its wait-trusted
// for m1's record to list it. m1's apiserver started by systemd (its
// wait-trusted --if-new-key passes at once: same signing key) records what
// it is about to load, so m2's wait ends; before, only a restart by the
// helper wrote the record, and m2 waited until --timeout.
func TestWaitTrustedRecordsTheStartingApiserver(t *testing.T) {
	f := newWaitingFleet(t)
	dir := t.TempDir()
	m1key := keytest.EC(t)
	m1pub := string(keytest.PublicPEM(t, &m1key.PublicKey))
	m1kid := keytest.KeyID(t, &m1key.PublicKey)
	f.srv.Put(t, keysPrefix+"/m1", m1pub)
	f.trustM1(t, m1kid)
	key := writeFile(t, filepath.Join(dir, "sa.key"), keytest.PKCS8PEM(t, m1key))
	bundle := writeFile(t, filepath.Join(dir, "sa-bundle.pem"), append([]byte(m1pub), mustRead(t, f.keyPEM)...))
	flags := writeFile(t, filepath.Join(dir, "apiserver-sa.env"),
		[]byte("KUBE_APISERVER_SA_ARGS=\"--service-account-key-file="+bundle+" --service-account-signing-key-file="+key+"\"\n"))

	m2 := bin(t, env(f.srv), "wait-trusted", "--public-key", f.keyPEM, "--host", "m2", "--if-new-key", "--skip-unrecorded", "--timeout", "1m")
	m2.stderr.waitFor(t, "waiting record "+rotationPrefix+"/m2/waiting written")
	// The site's safe-restart.toml names the apiserver's flags file, as the
	// shipped drop-in's --config does.
	cfg := writeFile(t, filepath.Join(dir, "safe-restart.toml"), []byte("preflight-flags-file = [\""+flags+"\"]\n"))
	m1 := runBin(t, env(f.srv), "--config", cfg, "wait-trusted", "--public-key", key, "--host", "m1", "--if-new-key", "--skip-unrecorded", "--timeout", "1m")
	if m1.code != codeOK {
		t.Fatalf("m1's wait-trusted: exit %d, want 0", m1.code)
	}
	if code := m2.wait(t); code != codeOK {
		t.Fatalf("m2's wait-trusted: exit %d, want 0 (m1's apiserver loads its key)", code)
	}
	v, _ := getKey(t, f.srv.Client(t), trustPrefix+"/m1")
	var rec trust.Record
	if err := json.Unmarshal([]byte(v), &rec); err != nil || rec.Signing != m1kid || strings.Join(rec.Trusted, ",") != m1kid+","+f.kid {
		t.Fatalf("m1's trust record %s (%v), want signing %s, trusting %s and %s", v, err, m1kid, m1kid, f.kid)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
