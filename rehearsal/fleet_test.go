//go:build rehearsal

package rehearsal

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/testbin"
	"github.com/keysync/confd/internal/toolbin"
)

// The built binaries, shared by every host (each host links them into its
// own /usr/local/bin).
var built map[string]string

const (
	keyPrefix = "/kubernetes/service-account-keys/"
	lockName  = "kube-apiserver-restart"
	holdKey   = lockName + "-hold"
)

func TestMain(m *testing.M) {
	// The test binary doubles as each host's systemctl (see standin.go's
	// script): it then talks to the fake systemd of its host and exits.
	if os.Getenv("REHEARSAL_STANDIN") == "systemctl" {
		os.Exit(systemctlMain(os.Getenv("REHEARSAL_SYSTEMD"), os.Args[1:]))
	}
	if code, ok := standinMain(); ok {
		os.Exit(code)
	}
	bins, cleanup, err := testbin.Build([]string{"-ldflags", "-X github.com/keysync/confd/internal/version.Version=rehearsal"},
		map[string]string{"confd": "./cmd/confd", "kube-apiserver-safe-restart": "./cmd/kube-apiserver-safe-restart", "kube-apiserver-sa-signer": "./cmd/kube-apiserver-sa-signer"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	built = bins
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// fleet is the machine: one TLS etcd, the cluster PKI, N hosts and the
// timeline of every host's readiness.
type fleet struct {
	t     *testing.T
	etcd  *etcdtest.Server
	cli   *clientv3.Client
	ca    *clusterCA
	admin *http.Client // client certificate in system:masters
	hosts []*host
	tl    *timeline
	// reported holds overlaps already reported, so that each fails
	// only the scenario in which it happened.
	reported map[string]bool
	// superseded is the key reimaged leaves published as superseded, for
	// retire-timers to retire (nil when none is left).
	superseded *supersededKey
}

func newFleet(t *testing.T, n int) *fleet {
	kas := toolbin.Kube(t, "kube-apiserver")
	f := &fleet{t: t, etcd: etcdtest.Start(t, etcdtest.WithTLS()), ca: newClusterCA(t), tl: newTimeline(), reported: map[string]bool{}}
	f.cli = f.etcd.Client(t)
	adminCert, adminKey := f.ca.issue(t, "fleet-admin", []string{"system:masters"}, false)
	f.admin = httpClient(t, f.ca.pem, adminCert, adminKey)
	base := t.TempDir()
	for i := 1; i <= n; i++ {
		h := newHost(t, f, filepath.Join(base, fmt.Sprintf("m%d", i)), fmt.Sprintf("m%d.fleet.test", i), kas)
		f.hosts = append(f.hosts, h)
	}
	return f
}

// httpClient trusts ca and presents the given client certificate (none
// when certPEM is nil). HTTP/1.1 only: every request is a fresh answer.
func httpClient(t *testing.T, caPEM, certPEM, keyPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	tr := &http.Transport{TLSClientConfig: tc, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}, DisableKeepAlives: true}
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// host is one control-plane master: its root directory with the examples
// installed, its apiserver (run by its fake systemd), its confd.
type host struct {
	Host
	t    *testing.T
	f    *fleet
	name string
	port int
	sa   saKey

	systemd *systemd
	confd   *process
}

func newHost(t *testing.T, f *fleet, root, name, kas string) *host {
	t.Helper()
	port := etcdtest.FreePort(t)
	h := &host{
		Host: Host{Root: root, EtcdURL: f.etcd.Endpoint, APIServerURL: fmt.Sprintf("https://127.0.0.1:%d", port),
			ConfdMetricsAddr: fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))},
		t: t, f: f, name: name, port: port, sa: newSAKey(t),
	}
	h.install(kas)
	h.systemd = startSystemd(t, h)
	go h.pollReady()
	return h
}

// install lays out the host as Puppet and kubeadm would have: the shipped
// examples (rewritten), the binaries, the PKI, the apiserver's own unit
// and flags, and the stand-ins for systemctl and hostname.
func (h *host) install(kas string) {
	t := h.t
	files := map[string]string{} // absolute host path -> example path
	ex := filepath.Join(etcdtest.RepoRoot(), "examples")
	files["/etc/confd/confd.toml"] = "confd/confd.toml"
	files[configPath] = "safe-restart.toml"
	for _, dir := range []string{"conf.d", "templates"} {
		ents, err := os.ReadDir(filepath.Join(ex, "confd", dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			files["/etc/confd/"+dir+"/"+e.Name()] = "confd/" + dir + "/" + e.Name()
		}
	}
	// Units and drop-in directories (kube-apiserver.service.d/).
	err := filepath.WalkDir(filepath.Join(ex, "systemd"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join(ex, "systemd"), p)
		files["/etc/systemd/system/"+filepath.ToSlash(rel)] = "systemd/" + filepath.ToSlash(rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dst, src := range files {
		data, err := os.ReadFile(filepath.Join(ex, src))
		if err != nil {
			t.Fatal(err)
		}
		h.write(dst, h.Rewrite(string(data)), 0o644)
	}
	for _, d := range []string{"/usr/local/bin", "/usr/bin", "/bin", "/run/systemd", "/var/lib/kubernetes/pki", "/var/log"} {
		if err := os.MkdirAll(h.Path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"/usr/local/bin/confd":                       built["confd"],
		"/usr/local/bin/kube-apiserver-safe-restart": built["kube-apiserver-safe-restart"],
		"/usr/local/bin/kube-apiserver-sa-signer":    built["kube-apiserver-sa-signer"],
		"/usr/local/bin/kube-apiserver":              kas,
		"/usr/bin/etcdctl":                           toolbin.Etcd(t, "etcdctl"),
	}
	for dst, src := range links {
		if err := os.Symlink(src, h.Path(dst)); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h.write("/bin/systemctl", fmt.Sprintf("#!/bin/sh\nREHEARSAL_STANDIN=systemctl REHEARSAL_SYSTEMD=%s exec %s \"$@\"\n", h.Path("/run/systemd/private"), self), 0o755)
	h.write("/bin/hostname", "#!/bin/sh\necho "+h.name+"\n", 0o755)

	f := h.f
	pki := "/etc/kubernetes/pki/"
	for dst, src := range map[string]string{"etcd/ca.crt": f.etcd.TLS.CA, "apiserver-etcd-client.crt": f.etcd.TLS.ClientCert, "apiserver-etcd-client.key": f.etcd.TLS.ClientKey} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		h.write(pki+dst, string(data), 0o600)
	}
	h.write(pki+"ca.crt", string(f.ca.pem), 0o644)
	c, k := f.ca.issue(t, "kube-apiserver", nil, true)
	h.write(pki+"apiserver.crt", string(c), 0o644)
	h.write(pki+"apiserver.key", string(k), 0o600)
	c, k = f.ca.issue(t, "kube-apiserver-kubelet-client", []string{"system:masters"}, false)
	h.write(pki+"apiserver-kubelet-client.crt", string(c), 0o644)
	h.write(pki+"apiserver-kubelet-client.key", string(k), 0o600)
	h.write(pki+"sa.key", string(h.sa.private), 0o600)
	h.write(pki+"sa.pub", string(h.sa.public), 0o644)

	// The host's own apiserver unit and base flags: not part of the
	// examples (the site has them already), written with the same paths.
	// The service-account flags come from the shipped drop-in
	// (20-sa-keys.conf); the site names $KUBE_APISERVER_SA_ARGS, as the
	// docs say.
	h.write("/etc/systemd/system/kube-apiserver.service", h.Rewrite(`[Service]
EnvironmentFile=/etc/kubernetes/apiserver.env
ExecStart=/usr/local/bin/kube-apiserver $KUBE_APISERVER_ARGS $KUBE_APISERVER_SA_ARGS
`), 0o644)
	h.writeAPIServerEnv(exampleEtcdURL)
	// Site tuning of the helper for a test-sized fleet: one attempt, a short
	// gate. The examples read it through $SAFE_RESTART_ARGS.
	h.write("/etc/kubernetes/safe-restart.env", `SAFE_RESTART_ARGS="--attempts=1 --health-timeout=40s --health-settle=3s --health-interval=250ms --lock-timeout=8m"`+"\n", 0o644)
}

// writeAPIServerEnv writes the apiserver's base flags with the given etcd
// URL (the examples' address is moved to the fleet's etcd).
//
// --shutdown-watch-termination-grace-period: without it (the default, 0)
// kube-apiserver ends no watch when it is stopped, so net/http's graceful
// Shutdown waits out its timeout (--request-timeout, 1 min) whenever a
// client holds one open: the kube-controller-manager's informers did, and
// every stop of its apiserver took the stand-in systemd's whole 60 s
// before SIGKILL. With it the apiserver closes active watches once it
// stops accepting requests (their clients re-watch elsewhere) and waits
// at most this long for them to drain, as an HA site sets it.
func (h *host) writeAPIServerEnv(etcdURL string) {
	args := strings.Join(apiserverArgs(h.port, etcdURL), " ")
	h.write("/etc/kubernetes/apiserver.env", h.Rewrite(`KUBE_APISERVER_ARGS="`+args+`"`+"\n"), 0o644)
}

// apiserverArgs are the apiserver's flags but its service-account ones, as
// the examples' paths name them (not rewritten yet).
func apiserverArgs(port int, etcdURL string) []string {
	return []string{
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port), "--advertise-address=127.0.0.1",
		"--etcd-servers=" + etcdURL, "--etcd-prefix=/registry",
		"--etcd-cafile=/etc/kubernetes/pki/etcd/ca.crt",
		"--etcd-certfile=/etc/kubernetes/pki/apiserver-etcd-client.crt",
		"--etcd-keyfile=/etc/kubernetes/pki/apiserver-etcd-client.key",
		"--client-ca-file=/etc/kubernetes/pki/ca.crt",
		"--tls-cert-file=/etc/kubernetes/pki/apiserver.crt", "--tls-private-key-file=/etc/kubernetes/pki/apiserver.key",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/12",
		"--endpoint-reconciler-type=none", "--cert-dir=/var/lib/kubernetes/pki",
		"--shutdown-watch-termination-grace-period=10s",
	}
}

func (h *host) write(abs, content string, mode os.FileMode) {
	h.t.Helper()
	p := h.Path(abs)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) read(abs string) []byte {
	data, _ := os.ReadFile(h.Path(abs))
	return data
}

// baseEnv is what systemd gives a unit before its own settings: a PATH
// whose first entry holds the host's systemctl and hostname stand-ins.
func (h *host) baseEnv() []string {
	return []string{"PATH=" + h.Path("/bin") + ":/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=" + h.Path("/root")}
}

// unit parses one of the host's installed systemd units.
func (h *host) unit(t *testing.T, name string) *Unit {
	t.Helper()
	u, err := LoadUnit(h.Path("/etc/systemd/system"), name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// runUnit runs a oneshot unit's ExecStartPre and ExecStart lines as
// systemd would and returns the exit code of the first that failed.
// publisherUnit is the long-running publisher (publish-key --watch).
const publisherUnit = "sa-key-publish.service"

// unitCtl runs `systemctl VERB UNIT` against the host's stand-in systemd
// and fails the test when it fails. start and restart answer once a
// Type=notify unit sent READY=1: the publisher, after its first reconcile
// published the host's keys.
func (h *host) unitCtl(t *testing.T, verb, unit string) {
	t.Helper()
	if code, out := h.systemctl(t, verb, unit); code != 0 {
		t.Fatalf("%s: systemctl %s %s exited %d:\n%s", h.name, verb, unit, code, out)
	}
}

func (h *host) runUnit(t *testing.T, name string, edit func(argv []string) []string) (int, string) {
	t.Helper()
	u := h.unit(t, name)
	env, err := u.Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for _, line := range append(append([]string(nil), u.ExecStartPre...), u.ExecStart...) {
		argv, ignore, err := Command(line, env)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if edit != nil {
			argv = edit(argv)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, &out, &out
		err = cmd.Run()
		if code := exitCode(err); code != 0 && !ignore {
			return code, out.String()
		}
	}
	return 0, out.String()
}

// oneshot is a oneshot unit's command lines, read in the test's goroutine
// so that run may be called from any goroutine.
type oneshot struct {
	name  string
	env   []string
	lines [][]string
}

func (h *host) oneshot(t *testing.T, name string) *oneshot {
	t.Helper()
	u := h.unit(t, name)
	env, err := u.Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	o := &oneshot{name: name, env: env}
	for _, line := range append(append([]string(nil), u.ExecStartPre...), u.ExecStart...) {
		argv, ignore, err := Command(line, env)
		if err != nil || ignore {
			t.Fatalf("%s: %q: %v (a leading - is not expected here)", name, line, err)
		}
		o.lines = append(o.lines, argv)
	}
	return o
}

// run runs the lines in order as systemd would and returns the exit code
// of the first that failed, and the output.
func (o *oneshot) run() (int, string) {
	var out bytes.Buffer
	for _, argv := range o.lines {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env, cmd.Stdout, cmd.Stderr = o.env, &out, &out
		if code := exitCode(cmd.Run()); code != 0 {
			return code, out.String()
		}
	}
	return 0, out.String()
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// confdCommand is confd.service's ExecStart and environment, as systemd
// would run it.
func (h *host) confdCommand(t *testing.T) (env, argv []string) {
	t.Helper()
	u := h.unit(t, "confd.service")
	env, err := u.Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	argv, _, err = Command(u.ExecStart[0], env)
	if err != nil {
		t.Fatal(err)
	}
	return env, argv
}

// startConfd runs confd.service's ExecStart in the background as systemd
// would.
func (h *host) startConfd(t *testing.T) {
	t.Helper()
	env, argv := h.confdCommand(t)
	// Registered with the fleet's test: confd outlives the scenario that started it.
	h.confd = startProcess(h.t, h.name+" confd", env, argv)
}

// stopConfd stops confd as systemd's KillMode=mixed would at the end: the
// main process gets SIGTERM and lets a running reload finish.
func (h *host) stopConfd(t *testing.T) {
	t.Helper()
	if h.confd != nil {
		h.confd.stop(t, 2*time.Minute)
		h.confd = nil
	}
}

// process is a background command whose output is kept and watched.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *logBuf
	done chan struct{}
	err  error
}

func startProcess(t *testing.T, name string, env, argv []string) *process {
	t.Helper()
	p := &process{name: name, out: newLogBuf(), done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = env, p.out, p.out
	// Pdeathsig: a test binary killed by its -timeout leaves no confd
	// running (no thread of this process ever exits: see systemd.start).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output (last 8 KiB):\n%s", name, tail(p.out.String(), 8192))
		}
	})
	return p
}

func (p *process) stop(t *testing.T, grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		t.Errorf("%s did not stop within %s of SIGTERM", p.name, grace)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// logBuf is an output buffer that tells waiters when it grows.
type logBuf struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newLogBuf() *logBuf { return &logBuf{changed: make(chan struct{})} }

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor reports whether the output has a line containing sub, waiting
// for more output (or done) up to within.
func (l *logBuf) waitFor(sub string, done <-chan struct{}, within time.Duration) bool {
	deadline := time.After(within)
	for {
		l.mu.Lock()
		found, changed := strings.Contains(l.b.String(), sub), l.changed
		l.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-changed:
		case <-done:
			return strings.Contains(l.String(), sub)
		case <-deadline:
			return false
		}
	}
}

// count is how many lines contain every one of subs.
func (l *logBuf) count(subs ...string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// await re-evaluates cond whenever something the fleet watches changes
// (and at least every 250 ms for state outside it: files, etcd, HTTP),
// until it holds or within passes.
func (f *fleet) await(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(within)
	for !cond() {
		select {
		case <-deadline:
			t.Fatalf("%s: not within %s", what, within)
		case <-f.tl.wait():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// etcdKeys lists the keys under prefix.
func (f *fleet) etcdKeys(t *testing.T, prefix string) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func (f *fleet) put(t *testing.T, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := f.cli.Put(ctx, key, value); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func (f *fleet) del(t *testing.T, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := f.cli.Delete(ctx, key); err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
}

// publishedKids is the set of key ids that etcd's published keys hold.
func (f *fleet) publishedKids(t *testing.T) []string {
	t.Helper()
	var kids []string
	for _, v := range f.etcdKeys(t, keyPrefix) {
		kids = append(kids, valueKids([]byte(v))...)
	}
	sort.Strings(kids)
	return kids
}

// jwksKids asks a host's apiserver which service-account keys it loaded.
func (f *fleet) jwksKids(h *host) ([]string, error) {
	resp, err := f.admin.Get(h.APIServerURL + "/openid/v1/jwks")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jwks: HTTP %d", resp.StatusCode)
	}
	var doc struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	var kids []string
	for _, k := range doc.Keys {
		kids = append(kids, k.Kid)
	}
	sort.Strings(kids)
	return kids, nil
}

// converged reports why the fleet is not (yet) at want: every live bundle
// holds exactly want's keys, every apiserver is ready and serves exactly
// them, nobody holds or waits for the restart lock.
func (f *fleet) converged(t *testing.T, want []string) string {
	if q := f.etcdKeys(t, lockName+"/"); len(q) > 0 {
		return fmt.Sprintf("%d in the restart lock queue", len(q))
	}
	first := f.hosts[0].read("/etc/kubernetes/pki/sa-bundle.pem")
	for _, h := range f.hosts {
		bundle := h.read("/etc/kubernetes/pki/sa-bundle.pem")
		if !bytes.Equal(bundle, first) {
			return h.name + ": bundle differs from " + f.hosts[0].name + "'s"
		}
		if n := pemBlocks(bundle); n != len(bundleKids(bundle)) {
			return fmt.Sprintf("%s: bundle has %d PEM blocks that are not public keys", h.name, n-len(bundleKids(bundle)))
		}
		got := bundleKids(bundle)
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(want, ",") {
			return fmt.Sprintf("%s: bundle has %d keys, want %d", h.name, len(got), len(want))
		}
		if !f.tl.isReady(h.name) {
			return h.name + ": apiserver not ready"
		}
		kids, err := f.jwksKids(h)
		if err != nil {
			return h.name + ": " + err.Error()
		}
		if strings.Join(kids, ",") != strings.Join(want, ",") {
			return fmt.Sprintf("%s: apiserver serves %d keys, want %d", h.name, len(kids), len(want))
		}
	}
	return ""
}

func (f *fleet) awaitConverged(t *testing.T, within time.Duration) {
	t.Helper()
	want := f.publishedKids(t)
	var why string
	deadline := time.After(within)
	for {
		if why = f.converged(t, want); why == "" {
			return
		}
		if err := f.etcd.Alive(); err != nil {
			t.Fatalf("fleet not converged on %d published keys: %v", len(want), err)
		}
		select {
		case <-deadline:
			t.Fatalf("fleet not converged on %d published keys within %s: %s", len(want), within, why)
		case <-f.tl.wait():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// tokenMatrix requests a token from every apiserver and presents each to
// every apiserver: accepted[i][j] is whether host j accepted host i's token.
func (f *fleet) tokenMatrix(t *testing.T) [][]bool {
	t.Helper()
	f.ensureServiceAccount(t)
	out := make([][]bool, len(f.hosts))
	for i, signer := range f.hosts {
		tok := f.token(t, signer)
		out[i] = make([]bool, len(f.hosts))
		for j, verifier := range f.hosts {
			out[i][j] = f.review(t, verifier, tok)
		}
	}
	return out
}

func (f *fleet) assertAllTokensAccepted(t *testing.T) {
	t.Helper()
	m := f.tokenMatrix(t)
	n := 0
	for i := range m {
		for j := range m[i] {
			if m[i][j] {
				n++
			} else {
				t.Errorf("%s refused the token %s signed", f.hosts[j].name, f.hosts[i].name)
			}
		}
	}
	t.Logf("tokens accepted: %d of %d", n, len(m)*len(m))
}

func (f *fleet) ensureServiceAccount(t *testing.T) {
	t.Helper()
	body := `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"fleet"}}`
	resp, err := f.admin.Post(f.hosts[0].APIServerURL+"/api/v1/namespaces/default/serviceaccounts", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
		t.Fatalf("create service account: HTTP %d", resp.StatusCode)
	}
}

// tryToken is a TokenRequest answered by h's apiserver, or why there is none.
func (f *fleet) tryToken(h *host) (string, error) {
	return tryTokenWith(f.admin, h)
}

// tryTokenWith is tryToken with the client c (its own timeout).
func tryTokenWith(c *http.Client, h *host) (string, error) {
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}`
	resp, err := c.Post(h.APIServerURL+"/api/v1/namespaces/default/serviceaccounts/fleet/token", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil || resp.StatusCode != http.StatusCreated || tr.Status.Token == "" {
		return "", fmt.Errorf("token from %s: HTTP %d, %v", h.name, resp.StatusCode, err)
	}
	return tr.Status.Token, nil
}

// tryReview presents token to h's apiserver (SelfSubjectReview) with c
// and returns the HTTP status.
func tryReview(c *http.Client, h *host, token string) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, h.APIServerURL+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// token is a TokenRequest answered by h's apiserver (signed with h's key).
func (f *fleet) token(t *testing.T, h *host) string {
	t.Helper()
	tok, err := f.tryToken(h)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// review presents token to h's apiserver (SelfSubjectReview): true if accepted.
func (f *fleet) review(t *testing.T, h *host, token string) bool {
	t.Helper()
	code, err := tryReview(httpClient(t, f.ca.pem, nil, nil), h, token)
	if err != nil {
		t.Fatalf("review on %s: %v", h.name, err)
	}
	switch code {
	case http.StatusCreated:
		return true
	case http.StatusUnauthorized:
		return false
	}
	t.Fatalf("review on %s: HTTP %d", h.name, code)
	return false
}

// restarts is how many times each host's kube-apiserver was started.
func (f *fleet) restarts() []int64 {
	var n []int64
	for _, h := range f.hosts {
		n = append(n, h.systemd.restarts.Load())
	}
	return n
}

// hold returns the hold record, if any.
func (f *fleet) hold(t *testing.T) (string, bool) {
	kv := f.etcdKeys(t, holdKey)
	v, ok := kv[holdKey]
	return v, ok
}

// configPath is the helper's default configuration file, where the
// examples install safe-restart.toml.
const configPath = "/etc/kubernetes/safe-restart.toml"

// withConfig is args as an operator's command on h reads them: with the
// host's configuration file, the binary's default (which lies outside h's
// root, so it is named).
func (h *host) withConfig(args []string) []string {
	return append([]string{"--config", h.Path(configPath)}, args...)
}

// helper runs kube-apiserver-safe-restart on h with confd.service's
// environment (as the bundle's reload_cmd gets it).
func (h *host) helper(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(h.Path("/usr/local/bin/kube-apiserver-safe-restart"), h.withConfig(args)...)
	var out bytes.Buffer
	cmd.Env, cmd.Stdout, cmd.Stderr = h.helperEnv(t), &out, &out
	err := cmd.Run()
	return exitCode(err), out.String()
}

// helperEnv is the environment the helper gets from confd.service.
func (h *host) helperEnv(t *testing.T) []string {
	t.Helper()
	env, err := h.unit(t, "confd.service").Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// helperKilledAt runs the helper with args and SIGKILLs it (the helper
// alone, as the OOM killer or a crash would) as soon as its output has a
// line containing msg; it fails the test if the helper ended or did not
// get there within 5 minutes. It returns the output.
func (h *host) helperKilledAt(t *testing.T, msg string, args ...string) string {
	t.Helper()
	p := startProcess(t, h.name+" kube-apiserver-safe-restart "+args[0], h.helperEnv(t), append([]string{h.Path("/usr/local/bin/kube-apiserver-safe-restart")}, h.withConfig(args)...))
	if !p.out.waitFor(msg, p.done, 5*time.Minute) {
		p.stop(t, 30*time.Second)
		t.Fatalf("%s %s never logged %q (exit %d):\n%s", h.name, args[0], msg, exitCode(p.err), tail(p.out.String(), 6000))
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return p.out.String()
}

// pollReady samples the host's /readyz (anonymous, as any client would see
// it) into the timeline until the test ends.
func (h *host) pollReady() {
	c := httpClient(h.t, h.f.ca.pem, nil, nil)
	c.Timeout = time.Second
	for !h.f.tl.closed() {
		gen := h.f.tl.generation(h.name)
		resp, err := c.Get(h.APIServerURL + "/readyz")
		ok := err == nil && resp.StatusCode == http.StatusOK
		if err == nil {
			resp.Body.Close()
		}
		h.f.tl.sample(h.name, gen, ok)
		time.Sleep(50 * time.Millisecond) // the sampling period, not a wait for an outcome
	}
}

// readLines reads newline-terminated requests from a connection.
func readLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	return strings.TrimSpace(s), err
}
