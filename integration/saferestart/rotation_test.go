package saferestart

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

const (
	keysPrefix     = "/kubernetes/service-account-keys"
	trustPrefix    = "/kubernetes/service-account-keys-trust"
	rotationPrefix = "/kubernetes/service-account-keys-rotation"
)

// miniHost is one control-plane host of a miniature fleet: its key files, a
// flags file naming them, and a stand-in for confd that renders the bundle
// of every published key and restarts through the real binary.
type miniHost struct {
	name, dir string
	mu        sync.Mutex
	down      bool
	wake      chan struct{}
}

func (h *miniHost) path(name string) string { return filepath.Join(h.dir, name) }

func (h *miniHost) setDown(down bool) {
	h.mu.Lock()
	h.down = down
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

func (h *miniHost) isDown() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.down
}

type miniFleet struct {
	t      *testing.T
	srv    *etcdtest.Server
	cli    *clientv3.Client
	env    []string
	events string // one bundle + key snapshot per "apiserver start", named by time
	hosts  []*miniHost
	lock   string
}

func newKeyPair(t testing.TB) (priv, pub []byte) {
	t.Helper()
	k := keytest.EC(t)
	return keytest.SEC1PEM(t, k), keytest.PublicPEM(t, &k.PublicKey)
}

func fileKids(t *testing.T, path string) []string {
	t.Helper()
	f, err := pemcheck.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	kids, err := f.KeyIDs()
	if err != nil {
		t.Fatal(err)
	}
	return kids
}

func newMiniFleet(t *testing.T, n int) *miniFleet {
	t.Helper()
	srv := etcdtest.Start(t)
	f := &miniFleet{t: t, srv: srv, cli: srv.Client(t), env: env(srv), events: t.TempDir(), lock: "rotation-lock"}
	for i := 1; i <= n; i++ {
		h := &miniHost{name: fmt.Sprintf("m%d.example", i), dir: t.TempDir(), wake: make(chan struct{}, 1)}
		priv, pub := newKeyPair(t)
		writeFile(t, h.path("sa.key"), priv)
		writeFile(t, h.path("sa.pub"), pub)
		writeFile(t, h.path("apiserver.env"), []byte(fmt.Sprintf("KUBE_APISERVER_SA_ARGS=\"--service-account-key-file=%s --service-account-signing-key-file=%s\"\n", h.path("sa-bundle.pem"), h.path("sa.key"))))
		f.srv.Put(t, keysPrefix+"/"+h.name, string(pub))
		f.hosts = append(f.hosts, h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, h := range f.hosts {
		wg.Add(1)
		go func() { defer wg.Done(); f.confd(ctx, h) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return f
}

// restartArgs are the flags of a restart of h; the command records what the
// "apiserver" loaded: the bundle and the signing key, named by time.
func (f *miniFleet) restartArgs(h *miniHost, more ...string) []string {
	script := fmt.Sprintf(`n=$(date +%%s%%N); cp %q %q/$n-%s.bundle && cp %q %q/$n-%s.key`,
		h.path("sa-bundle.pem"), f.events, h.name, h.path("sa.key"), f.events, h.name)
	args := append([]string{"--config=", "--lock-name", f.lock, "--health-url", "", "--retry-delay", "10ms", "--ttl", "2",
		"--host", h.name, "--preflight-flags-file", h.path("apiserver.env")}, more...)
	return append(args, "--", "sh", "-c", script)
}

// confd renders h's bundle from every published key and, when it changed,
// restarts h through the binary, as the example resource does.
func (f *miniFleet) confd(ctx context.Context, h *miniHost) {
	for ctx.Err() == nil {
		resp, err := f.cli.Get(ctx, keysPrefix+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return
		}
		var bundle []byte
		for _, kv := range resp.Kvs {
			bundle = append(bundle, kv.Value...)
		}
		old, _ := os.ReadFile(h.path("sa-bundle.pem"))
		if !h.isDown() && !bytes.Equal(old, bundle) {
			tmp := h.path(".sa-bundle.tmp")
			if err := os.WriteFile(tmp, bundle, 0o644); err == nil {
				_ = os.Rename(tmp, h.path("sa-bundle.pem"))
			}
			cmd := exec.CommandContext(ctx, binPath, f.restartArgs(h)...)
			cmd.Env = f.env
			if out, err := cmd.CombinedOutput(); err != nil && ctx.Err() == nil {
				f.t.Errorf("confd stand-in of %s: restart: %v\n%s", h.name, err, out)
			}
			continue
		}
		wctx, cancel := context.WithCancel(ctx)
		select {
		case <-f.cli.Watch(wctx, keysPrefix+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)):
		case <-h.wake:
		case <-ctx.Done():
		}
		cancel()
	}
}

// checkNoRejections replays every apiserver start in order and fails if at
// any point a started apiserver signed with a key some other started
// apiserver had not loaded: a token it issued would have been refused there.
// It returns what each apiserver loaded last.
func (f *miniFleet) checkNoRejections(t *testing.T) map[string][]string {
	t.Helper()
	entries, err := os.ReadDir(f.events)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".key"); ok {
			names = append(names, n)
		}
		if strings.HasSuffix(e.Name(), ".stopped") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	loaded, signing := map[string][]string{}, map[string]string{}
	for _, n := range names {
		_, host, _ := strings.Cut(n, "-")
		if h, ok := strings.CutSuffix(host, ".stopped"); ok {
			delete(loaded, h)
			delete(signing, h)
			continue
		}
		loaded[host] = fileKids(t, filepath.Join(f.events, n+".bundle"))
		signing[host] = fileKids(t, filepath.Join(f.events, n+".key"))[0]
		for s, kid := range signing {
			for v, keys := range loaded {
				if !slices.Contains(keys, kid) {
					t.Errorf("after %s's start (%s): tokens of %s (key %s) refused by %s", host, n, s, kid, v)
				}
			}
		}
	}
	return loaded
}

type trustRep struct {
	Published []string
	Hosts     []struct {
		Host   string
		Stale  bool
		Record *struct {
			Trusted []string
			Signing string
		}
	}
}

// waitTrust blocks until the `trust -o json` report satisfies ok, woken by
// changes to the trust records.
func (f *miniFleet) waitTrust(t *testing.T, what string, ok func(trustRep) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	w := f.cli.Watch(ctx, trustPrefix+"/", clientv3.WithPrefix())
	for !ok(f.trustReport(t)) {
		select {
		case <-w:
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// trustReport runs `trust -o json`: exit 0, or 10 exactly when a host is
// stale.
func (f *miniFleet) trustReport(t *testing.T) (rep trustRep) {
	t.Helper()
	p := runBin(t, f.env, "trust", "-o", "json")
	if p.code != codeOK && p.code != codeStale {
		t.Fatalf("trust: exit %d", p.code)
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &rep); err != nil {
		t.Fatalf("trust -o json: %v\n%s", err, p.stdout)
	}
	stale := false
	for _, h := range rep.Hosts {
		stale = stale || h.Stale
	}
	if stale != (p.code == codeStale) {
		t.Fatalf("trust: exit %d with stale hosts %v, want 10 exactly when a host is stale\n%s", p.code, stale, p.stdout)
	}
	return rep
}

// waitConverged runs wait-trusted for every host's published keys.
func (f *miniFleet) waitConverged(t *testing.T) {
	t.Helper()
	for _, h := range f.hosts {
		if p := runBin(t, f.env, "wait-trusted", "--public-key", h.path("sa.pub"), "--timeout", "25s"); p.code != codeOK {
			t.Fatalf("wait-trusted %s: exit %d\n%s", h.name, p.code, p.stderr)
		}
	}
}

func (f *miniFleet) rotateArgs(h *miniHost, more ...string) []string {
	args := append([]string{"rotate-key", "--signing-key", h.path("sa.key"), "--public-key", h.path("sa.pub")}, more...)
	return append(args, f.restartArgs(h)...)
}

func TestRotateKeyZeroRejections(t *testing.T) {
	f := newMiniFleet(t, 3)
	m1, m3 := f.hosts[0], f.hosts[2]
	f.waitConverged(t)
	prev := fileKids(t, m1.path("sa.key"))[0]

	// One master down during the wait: the rotation times out naming it,
	// and nothing is installed.
	m3.setDown(true)
	p := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "3s", "--grace", "2s")...)
	if p.code != codeLockTimeout || !strings.Contains(p.stderr.String(), m3.name) {
		t.Fatalf("rotate-key with %s down: exit %d, want %d naming it\n%s", m3.name, p.code, codeLockTimeout, p.stderr)
	}
	if got := fileKids(t, m1.path("sa.key"))[0]; got != prev {
		t.Fatal("signing key installed although a host did not trust it")
	}
	if _, err := os.Stat(m1.path("sa.key.previous")); !os.IsNotExist(err) {
		t.Fatal("backup written although nothing was installed")
	}
	next := fileKids(t, m1.path("sa.key.next"))[0]
	if p := runBin(t, f.env, "wait-trusted", "--public-key", m1.path("sa.key.next"), "--timeout", "2s"); p.code != codeLockTimeout || !strings.Contains(p.stdout.String(), m3.name) {
		t.Fatalf("wait-trusted during the outage: exit %d, want 5 naming %s\n%s", p.code, m3.name, p.stdout)
	}
	stale := false
	for _, h := range f.trustReport(t).Hosts {
		stale = stale || (h.Host == m3.name && h.Stale)
	}
	if !stale {
		t.Fatalf("trust does not report %s stale", m3.name)
	}

	// The master comes back; the rotation is re-run and killed at each
	// later step, then completes.
	m3.setDown(false)
	for _, marker := range []string{"published the current and the next public key", "every host trusts the next key", "restarting this apiserver through the lock"} {
		r := bin(t, f.env, f.rotateArgs(m1, "--timeout", "25s", "--grace", "15s")...)
		r.stderr.waitFor(t, marker)
		r.signal(t, syscall.SIGKILL)
		r.wait(t)
	}
	if p := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "25s", "--grace", "15s")...); p.code != codeOK {
		t.Fatalf("rotate-key re-run: exit %d\n%s", p.code, p.stderr)
	}
	if got := fileKids(t, m1.path("sa.key"))[0]; got != next {
		t.Fatalf("signing key %s, want the next key %s generated by the first run", got, next)
	}
	if got := fileKids(t, m1.path("sa.key.previous"))[0]; got != prev {
		t.Fatal("previous key not kept as the backup")
	}
	for _, path := range []string{m1.path("sa.key"), m1.path("sa.key.previous")} {
		if st, _ := os.Stat(path); st.Mode().Perm()&0o077 != 0 {
			t.Fatalf("%s mode %o: readable by others", path, st.Mode().Perm())
		}
	}
	rep := f.trustReport(t)
	for _, h := range rep.Hosts {
		if h.Stale || h.Record == nil || !slices.Contains(h.Record.Trusted, next) || !slices.Contains(h.Record.Trusted, prev) {
			t.Fatalf("after the rotation %s: %+v, want trusting both keys", h.Host, h)
		}
		if h.Host == m1.name && h.Record.Signing != next {
			t.Fatalf("%s signs with %s, want %s", h.Host, h.Record.Signing, next)
		}
	}
	// A second run is a no-op.
	if p := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "5s")...); p.code != codeOK || !strings.Contains(p.stderr.String(), "rotation already done") {
		t.Fatalf("idempotent re-run: exit %d\n%s", p.code, p.stderr)
	}

	// Retire: not before the grace period (15 s: the steps since the install
	// take seconds under the race detector) is over, then the old key goes
	// from every bundle.
	if p := runBin(t, f.env, "retire-keys", "--host", m1.name, "--signing-key", m1.path("sa.key"), "--public-key", m1.path("sa.pub")); p.code != codeOK {
		t.Fatalf("retire-keys early: exit %d\n%s", p.code, p.stderr)
	}
	if got := fileKids(t, m1.path("sa.pub")); len(got) != 2 {
		t.Fatalf("retired before the grace period was over: sa.pub holds %v", got)
	}
	var st struct {
		RetireAfter time.Time `json:"retire_after"`
	}
	v, _ := getKey(t, f.cli, rotationPrefix+"/"+m1.name+"/state")
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		t.Fatal(err)
	}
	// The grace period is wall-clock time by definition.
	time.Sleep(time.Until(st.RetireAfter) + 100*time.Millisecond)
	if p := runBin(t, f.env, "retire-keys", "--host", m1.name, "--signing-key", m1.path("sa.key"), "--public-key", m1.path("sa.pub")); p.code != codeOK {
		t.Fatalf("retire-keys: exit %d\n%s", p.code, p.stderr)
	}
	if got := fileKids(t, m1.path("sa.pub")); !slices.Equal(got, []string{next}) {
		t.Fatalf("after retire sa.pub holds %v, want only %s", got, next)
	}
	f.waitConverged(t)
	f.waitTrust(t, "every host to drop the retired key", func(rep trustRep) bool {
		for _, h := range rep.Hosts {
			if h.Record == nil || slices.Contains(h.Record.Trusted, prev) {
				return false
			}
		}
		return true
	})
	for host, keys := range f.checkNoRejections(t) {
		if slices.Contains(keys, prev) {
			t.Errorf("%s's apiserver still loads the retired key", host)
		}
	}
}

// A reimaged host comes back with a new key: its apiserver does not start
// signing with it before every other host trusts it, and wait-trusted (the
// drop-in's ExecStartPre) says when that is.
func TestReimagedHostWaitsForTrust(t *testing.T) {
	f := newMiniFleet(t, 3)
	m2 := f.hosts[1]
	f.waitConverged(t)
	m2.setDown(true)
	// Reimaged: its apiserver is gone with its key.
	writeFile(t, filepath.Join(f.events, fmt.Sprintf("%d-%s.stopped", time.Now().UnixNano(), m2.name)), nil)
	priv, pub := newKeyPair(t)
	writeFile(t, m2.path("sa.key"), priv)
	writeFile(t, m2.path("sa.pub"), pub)
	waiter := bin(t, f.env, "wait-trusted", "--public-key", m2.path("sa.pub"), "--exclude-host", m2.name, "--timeout", "25s")
	f.srv.Put(t, keysPrefix+"/"+m2.name, string(pub)) // the publisher at boot
	m2.setDown(false)
	if code := waiter.wait(t); code != codeOK {
		t.Fatalf("wait-trusted: exit %d\n%s", code, waiter.stderr)
	}
	f.waitConverged(t)
	f.checkNoRejections(t)
}

// --dry-run shows the steps and touches nothing; a second rotate-key of the
// same host while one runs exits 5; a rotation killed right after generating
// its key resumes.
func TestRotateKeyDryRunAndOneAtATime(t *testing.T) {
	f := newMiniFleet(t, 2)
	m1, m2 := f.hosts[0], f.hosts[1]
	f.waitConverged(t)
	pubBefore, _ := os.ReadFile(m1.path("sa.pub"))
	p := runBin(t, f.env, f.rotateArgs(m1, "--dry-run")...)
	if p.code != codeOK {
		t.Fatalf("dry run: exit %d\n%s", p.code, p.stderr)
	}
	for _, want := range []string{"would  generate", "would  publish", "would  wait-trusted", "would  install", "would  restart", "dry run: no lock taken"} {
		if !strings.Contains(p.stdout.String(), want) {
			t.Errorf("dry run output lacks %q:\n%s", want, p.stdout)
		}
	}
	if _, err := os.Stat(m1.path("sa.key.next")); !os.IsNotExist(err) {
		t.Fatal("dry run wrote the next key")
	}
	if after, _ := os.ReadFile(m1.path("sa.pub")); !bytes.Equal(after, pubBefore) {
		t.Fatal("dry run changed sa.pub")
	}
	if v, ok := getKey(t, f.cli, rotationPrefix+"/"+m1.name+"/state"); ok {
		t.Fatalf("dry run wrote a rotation state: %s", v)
	}

	// Killed right after generating. m2 goes down first: SIGKILL lands some
	// time after the log line, and a rotation that got as far as publishing
	// before it died would otherwise let m2 trust the next key, so the run
	// below would never wait.
	m2.setDown(true)
	r := bin(t, f.env, f.rotateArgs(m1, "--timeout", "25s")...)
	r.stderr.waitFor(t, "next key pair ready")
	r.signal(t, syscall.SIGKILL)
	r.wait(t)

	// One waits (m2 down), a second is refused while it runs.
	first := bin(t, f.env, f.rotateArgs(m1, "--timeout", "25s")...)
	first.stderr.waitFor(t, "waiting until every host's apiserver trusts the next key")
	second := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "25s")...)
	if second.code != codeLockTimeout || !strings.Contains(second.stderr.String(), "another rotate-key is running") {
		t.Fatalf("second rotate-key: exit %d, want %d\n%s", second.code, codeLockTimeout, second.stderr)
	}
	m2.setDown(false)
	if code := first.wait(t); code != codeOK {
		t.Fatalf("rotate-key: exit %d\n%s", code, first.stderr)
	}
	f.checkNoRejections(t)
}

// A hold stops a rotation before it generates or publishes anything.
func TestRotateKeyRefusedByHold(t *testing.T) {
	f := newMiniFleet(t, 1)
	m1 := f.hosts[0]
	f.waitConverged(t)
	if p := runBin(t, f.env, "hold", "--lock-name", f.lock, "--reason", "maintenance"); p.code != codeOK {
		t.Fatalf("hold: exit %d\n%s", p.code, p.stderr)
	}
	p := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "5s")...)
	if p.code != codeHold || !strings.Contains(p.stderr.String(), "maintenance") {
		t.Fatalf("rotate-key under a hold: exit %d, want %d\n%s", p.code, codeHold, p.stderr)
	}
	if _, err := os.Stat(m1.path("sa.key.next")); !os.IsNotExist(err) {
		t.Fatal("a next key was generated under a hold")
	}
}
