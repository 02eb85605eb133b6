package saferestart

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

// TestSafeRestart runs the scenarios that can share one etcd (each under
// its own lock name) in parallel.
func TestSafeRestart(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	for name, f := range map[string]func(*testing.T, *etcdtest.Server, *clientv3.Client){
		"FiveHostsNeverOverlap":           testFiveNeverOverlap,
		"KilledHolderReplacedWithinTTL":   testKilledHolderReplaced,
		"CutConnectionLosesLease":         testCutConnectionLosesLease,
		"EtcdctlHoldsBinaryWaits":         testEtcdctlHoldsBinaryWaits,
		"BinaryHoldsEtcdctlWaits":         testBinaryHoldsEtcdctlWaits,
		"HealthGateHoldsLockUntilReady":   testHealthGateHoldsLock,
		"HealthGateUnauthorizedHolds":     testHealthGateUnauthorized,
		"FailedRestartStopsTheLine":       testFailedRestartStopsTheLine,
		"RestartTimeoutKillsCommand":      testRestartTimeout,
		"SigtermWhileWaitingLeavesQueue":  testSigtermWhileWaiting,
		"SigtermWhileRestartingHolds":     testSigtermWhileRestarting,
		"LockTimeout":                     testLockTimeout,
		"StatusShowsHolderWaitersAndHold": testStatus,
		"EnvAndFlagPrecedence":            testEnvPrecedence,
		"GuardStartsOnlyUnderTheLock":     testGuardUnderLock,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, s, cli)
		})
	}
}

func testFiveNeverOverlap(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	var procs []*proc
	for i := 0; i < 5; i++ {
		procs = append(procs, bin(t, env(s), lockArgs("five", "--", "sh", "-c", timeline(log, fmt.Sprint("p", i), "0.1"))...))
	}
	for i, p := range procs {
		if code := p.wait(t); code != codeOK {
			t.Fatalf("process %d exit %d:\n%s", i, code, p.stderr)
		}
	}
	spans := readSpans(t, log)
	if len(spans) != 5 {
		t.Fatalf("%d runs recorded, want 5", len(spans))
	}
	assertSerial(t, spans)
	var lastRev int64
	for _, sp := range spans {
		if len(sp.fields) != 2 || !strings.HasPrefix(sp.fields[0], "five/") {
			t.Fatalf("ETCD_LOCK_KEY/ETCD_LOCK_REV not passed: %v", sp.fields)
		}
		rev, err := strconv.ParseInt(sp.fields[1], 10, 64)
		if err != nil || rev <= lastRev {
			t.Fatalf("ETCD_LOCK_REV %q after %d", sp.fields[1], lastRev)
		}
		lastRev = rev
	}
	if keys := queueKeys(t, cli, "five"); len(keys) != 0 {
		t.Fatalf("lock keys left: %v", keys)
	}
}

func testKilledHolderReplaced(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	const ttl = 2
	const margin = 1500 * time.Millisecond
	dir := t.TempDir()
	g := newGate(t, dir, "a")
	acquired := filepath.Join(dir, "b-acquired")
	a := bin(t, env(s), lockArgs("killed", "--ttl", fmt.Sprint(ttl), "--", "sh", "-c", g.script())...)
	pid := g.awaitReady(t)
	b := bin(t, env(s), lockArgs("killed", "--ttl", fmt.Sprint(ttl), "--", "sh", "-c", `date +%s%N > `+acquired)...)
	waitQueue(t, cli, "killed", 2)
	killedAt := time.Now()
	a.signal(t, syscall.SIGKILL)
	if code := b.wait(t); code != codeOK {
		t.Fatalf("second holder exit %d", code)
	}
	data, err := os.ReadFile(acquired)
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	took := time.Unix(0, ns).Sub(killedAt)
	t.Logf("second holder ran %s after the first was killed (ttl %ds)", took, ttl)
	if took < 0 || took > ttl*time.Second+margin {
		t.Fatalf("second holder ran %s after the kill, want within (0, %s]", took, ttl*time.Second+margin)
	}
	awaitGone(t, pid) // the killed holder's command died with it
}

func testCutConnectionLosesLease(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	g := newGate(t, dir, "cut")
	finished := filepath.Join(dir, "finished")
	ended := filepath.Join(dir, "ended")
	secondStarted := filepath.Join(dir, "second-started")
	proxy := etcdtest.NewProxy(t, s.Endpoint)
	// The command records when SIGTERM ended it; left alone it would block
	// at the gate for ever.
	script := fmt.Sprintf(`trap 'date +%%s%%N > %q; exit 143' TERM; %s; touch %q`, ended, g.script(), finished)
	a := bin(t, env(s), lockArgs("cut", "--endpoints", proxy.Endpoint(), "--ttl", "2", "--dial-timeout", "500ms",
		"--command-timeout", "1s", "--", "sh", "-c", script)...)
	g.awaitReady(t)
	key := queueKeys(t, cli, "cut")[0]
	proxy.Cut()
	// Another host queues at once; it may only run once the first command is gone.
	b := bin(t, env(s), lockArgs("cut", "--", "sh", "-c", fmt.Sprintf("date +%%s%%N > %q", secondStarted))...)
	// The cut holder's command ran, so it must stop the line; etcd is
	// unreachable for it, so it keeps trying while the next host runs.
	a.stderr.waitFor(t, "cannot write the hold")
	if code := b.wait(t); code != codeOK {
		t.Fatalf("next holder exit %d:\n%s", code, b.stderr)
	}
	proxy.Restore()
	if code := a.wait(t); code != codeLeaseLost {
		t.Fatalf("exit %d, want %d (lease lost)", code, codeLeaseLost)
	}
	errOut := a.stderr.String()
	if !strings.Contains(errOut, "LOCK LOST") || !strings.Contains(errOut, key) || !strings.Contains(errOut, ": ERROR ") {
		t.Fatalf("log does not say LOCK LOST naming lock key %s at error level:\n%s", key, errOut)
	}
	if _, err := os.Stat(finished); err == nil {
		t.Fatal("the command ran on after the lease was lost")
	}
	endNs, startNs := readNs(t, ended), readNs(t, secondStarted)
	t.Logf("next holder started %s after the cut holder's command ended", time.Duration(startNs-endNs))
	if startNs <= endNs {
		t.Fatalf("the next holder's command started %s before the cut holder's command ended", time.Duration(endNs-startNs))
	}
	if v, ok := getKey(t, cli, "cut-hold"); !ok || !strings.Contains(v, "lock lost") {
		t.Fatalf("a holder whose command ran and whose lease was lost wrote no hold once etcd was back: %q", v)
	}
}

func readNs(t *testing.T, path string) int64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return ns
}

func testEtcdctlHoldsBinaryWaits(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	g := newGate(t, dir, "ctl")
	ctl := etcdctl(t, env(s), "lock", "interop1", "--", "sh", "-c", `echo "start $(date +%s%N) etcdctl" >> `+log+"; "+g.script()+`; echo "end $(date +%s%N) etcdctl" >> `+log)
	g.awaitReady(t)
	b := bin(t, env(s), lockArgs("interop1", "--", "sh", "-c", timeline(log, "binary", "0"))...)
	waitQueue(t, cli, "interop1", 2)
	if b.exited() {
		t.Fatalf("binary did not wait for etcdctl's lock: exit %d", b.code)
	}
	g.release(t)
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	if code := b.wait(t); code != codeOK {
		t.Fatalf("binary exit %d", code)
	}
	spans := readSpans(t, log)
	if len(spans) != 2 || spans[0].id != "etcdctl" {
		t.Fatalf("runs %+v", spans)
	}
	assertSerial(t, spans)
}

func testBinaryHoldsEtcdctlWaits(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	g := newGate(t, dir, "bin")
	b := bin(t, env(s), lockArgs("interop2", "--", "sh", "-c", `echo "start $(date +%s%N) binary" >> `+log+"; "+g.script()+`; echo "end $(date +%s%N) binary" >> `+log)...)
	g.awaitReady(t)
	ctl := etcdctl(t, env(s), "lock", "interop2", "--", "sh", "-c", timeline(log, "etcdctl", "0"))
	waitQueue(t, cli, "interop2", 2)
	if ctl.exited() {
		t.Fatalf("etcdctl did not wait for the binary's lock: exit %d", ctl.code)
	}
	g.release(t)
	if code := b.wait(t); code != codeOK {
		t.Fatalf("binary exit %d", code)
	}
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	spans := readSpans(t, log)
	if len(spans) != 2 || spans[0].id != "binary" {
		t.Fatalf("runs %+v", spans)
	}
	assertSerial(t, spans)
}

// healthServer is an HTTPS /readyz whose answer the test sets; every probe
// is counted and announced.
type healthServer struct {
	*httptest.Server
	status atomic.Int32
	probes atomic.Int64
	mu     sync.Mutex
	probed chan struct{}
	caFile string
}

func newHealthServer(t *testing.T, status int) *healthServer {
	h := &healthServer{probed: make(chan struct{})}
	h.status.Store(int32(status))
	h.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := int(h.status.Load())
		w.WriteHeader(code)
		fmt.Fprintln(w, http.StatusText(code))
		h.probes.Add(1)
		h.mu.Lock()
		close(h.probed)
		h.probed = make(chan struct{})
		h.mu.Unlock()
	}))
	t.Cleanup(h.Close)
	h.caFile = writeFile(t, filepath.Join(t.TempDir(), "ca.pem"),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.Certificate().Raw}))
	return h
}

// awaitProbes blocks until the server has answered at least n probes.
func (h *healthServer) awaitProbes(t *testing.T, n int64) {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		h.mu.Lock()
		ch := h.probed
		h.mu.Unlock()
		if h.probes.Load() >= n {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("only %d health probes, want %d", h.probes.Load(), n)
		}
	}
}

func (h *healthServer) args() []string {
	return []string{"--health-url", h.URL + "/readyz", "--health-cacert", h.caFile, "--health-interval", "50ms",
		"--health-settle", "0s", "--health-timeout", "20s"}
}

func testHealthGateHoldsLock(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	h := newHealthServer(t, http.StatusServiceUnavailable)
	dir := t.TempDir()
	acquired := filepath.Join(dir, "etcdctl-acquired")
	b := bin(t, env(s), append(lockArgs("gate"), append(h.args(), "--", "true")...)...)
	// The first probe is the check of the running apiserver before
	// queueing, when etcdctl could still take the lock first: wait for the
	// gate itself, and for one of its probes.
	b.stderr.waitFor(t, "holding the lock until the apiserver is ready")
	h.awaitProbes(t, h.probes.Load()+1)
	ctl := etcdctl(t, env(s), "lock", "gate", "--", "sh", "-c", `date +%s%N > `+acquired)
	waitQueue(t, cli, "gate", 2)
	// While /readyz says 503 the gate keeps probing and etcdctl keeps waiting.
	h.awaitProbes(t, h.probes.Load()+3)
	if ctl.exited() || b.exited() {
		t.Fatalf("lock given up while the apiserver was not ready (etcdctl exited %v, binary exited %v)", ctl.exited(), b.exited())
	}
	if _, err := os.Stat(acquired); err == nil {
		t.Fatal("etcdctl acquired the lock while the apiserver was not ready")
	}
	readyAt := time.Now()
	h.status.Store(http.StatusOK)
	if code := b.wait(t); code != codeOK {
		t.Fatalf("binary exit %d", code)
	}
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	data, err := os.ReadFile(acquired)
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if at := time.Unix(0, ns); at.Before(readyAt) {
		t.Fatalf("etcdctl ran at %s, before the apiserver turned ready at %s", at, readyAt)
	}
}

func testHealthGateUnauthorized(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	h := newHealthServer(t, http.StatusUnauthorized)
	runs := filepath.Join(t.TempDir(), "runs")
	p := runBin(t, env(s), append(lockArgs("unauth", "--attempts", "3"), append(h.args(), "--", "sh", "-c", "echo run >> "+runs)...)...)
	// The credentials are tried on the running apiserver before the
	// restart: refused there, nothing is restarted and the line not stopped.
	if p.code != codePreflight {
		t.Fatalf("exit %d, want %d (gate refused before the restart)", p.code, codePreflight)
	}
	if data, err := os.ReadFile(runs); err == nil {
		t.Fatalf("401 is a configuration error found before the restart; yet the command ran: %q", data)
	}
	if v, ok := getKey(t, cli, "unauth-hold"); ok {
		t.Fatalf("hold written although nothing was restarted: %s", v)
	}
	if keys := queueKeys(t, cli, "unauth"); len(keys) != 0 {
		t.Fatalf("lock not released after writing the hold: %v", keys)
	}
}

func testFailedRestartStopsTheLine(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	runs, second := filepath.Join(dir, "runs"), filepath.Join(dir, "second")
	p := runBin(t, env(s), lockArgs("failed", "--", "sh", "-c", "echo run >> "+runs+"; exit 1")...)
	if p.code != codeRestart {
		t.Fatalf("exit %d, want %d (restart failed)", p.code, codeRestart)
	}
	if data, _ := os.ReadFile(runs); strings.Count(string(data), "run") != 2 {
		t.Fatalf("want the default 2 attempts, runs: %q", data)
	}
	if _, ok := getKey(t, cli, "failed-hold"); !ok {
		t.Fatal("no hold written")
	}
	next := runBin(t, env(s), lockArgs("failed", "--", "touch", second)...)
	if next.code != codeHold {
		t.Fatalf("next host exit %d, want %d (hold active)", next.code, codeHold)
	}
	msg := next.stderr.String()
	if !strings.Contains(msg, hostname(t)) || !strings.Contains(msg, "exited with status 1") {
		t.Fatalf("refusal does not name host and reason:\n%s", msg)
	}
	if _, err := os.Stat(second); err == nil {
		t.Fatal("next host restarted despite the hold")
	}
	if keys := queueKeys(t, cli, "failed"); len(keys) != 0 {
		t.Fatalf("refused host queued anyway: %v", keys)
	}
	// --ignore-hold overrides; --dry-run reports and runs nothing.
	dry := runBin(t, env(s), lockArgs("failed", "--dry-run", "--ignore-hold", "--", "touch", second)...)
	if dry.code != codeOK || !strings.Contains(dry.stdout.String(), "hold: ACTIVE") || !strings.Contains(dry.stdout.String(), "would run: touch") {
		t.Fatalf("dry run exit %d:\n%s%s", dry.code, dry.stdout, dry.stderr)
	}
	un := runBin(t, env(s), "unhold", "--lock-name", "failed")
	if un.code != codeOK || !strings.Contains(un.stdout.String(), "hold removed") {
		t.Fatalf("unhold exit %d: %s%s", un.code, un.stdout, un.stderr)
	}
	if again := runBin(t, env(s), lockArgs("failed", "--", "touch", second)...); again.code != codeOK {
		t.Fatalf("after unhold: exit %d\n%s", again.code, again.stderr)
	}
	if _, err := os.Stat(second); err != nil {
		t.Fatal("restart after unhold did not run the command")
	}
}

func testRestartTimeout(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	p := runBin(t, env(s), lockArgs("slow", "--attempts", "1", "--restart-timeout", "300ms", "--", "sleep", "30")...)
	if p.code != codeRestart {
		t.Fatalf("exit %d, want %d", p.code, codeRestart)
	}
	v, ok := getKey(t, cli, "slow-hold")
	if !ok || !strings.Contains(v, "did not finish within 300ms") {
		t.Fatalf("hold %q", v)
	}
}

func testSigtermWhileWaiting(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	g := newGate(t, t.TempDir(), "holder")
	ctl := etcdctl(t, env(s), "lock", "sigterm", "--", "sh", "-c", g.script())
	g.awaitReady(t)
	w := bin(t, env(s), lockArgs("sigterm", "--", "true")...)
	waitQueue(t, cli, "sigterm", 2)
	waiterKey := queueKeys(t, cli, "sigterm")[1]
	w.signal(t, syscall.SIGTERM)
	if code := w.wait(t); code != codeInterrupted {
		t.Fatalf("exit %d, want %d", code, codeInterrupted)
	}
	if keys := queueKeys(t, cli, "sigterm"); len(keys) != 1 || keys[0] == waiterKey {
		t.Fatalf("waiter key not removed: %v", keys)
	}
	lease, _ := strconv.ParseInt(strings.TrimPrefix(waiterKey, "sigterm/"), 16, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(lease)); err != nil || ttl.TTL != -1 {
		t.Fatalf("waiter lease not revoked: %+v %v", ttl, err)
	}
	if _, ok := getKey(t, cli, "sigterm-hold"); ok {
		t.Fatal("leaving the queue must not stop the line")
	}
	g.release(t)
	ctl.wait(t)
}

func testSigtermWhileRestarting(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	g := newGate(t, dir, "cmd")
	finished := filepath.Join(dir, "finished")
	b := bin(t, env(s), lockArgs("sigterm2", "--", "sh", "-c", g.script()+"; touch "+finished)...)
	g.awaitReady(t)
	b.signal(t, syscall.SIGTERM)
	b.stderr.waitFor(t, "interrupted while the restart command runs")
	g.release(t)
	if code := b.wait(t); code != codeInterrupted {
		t.Fatalf("exit %d, want %d", code, codeInterrupted)
	}
	if _, err := os.Stat(finished); err != nil {
		t.Fatal("the restart command was not let finish")
	}
	if v, ok := getKey(t, cli, "sigterm2-hold"); !ok || !strings.Contains(v, "interrupted") {
		t.Fatalf("hold after an interrupted restart: %q", v)
	}
	if keys := queueKeys(t, cli, "sigterm2"); len(keys) != 0 {
		t.Fatalf("lock not released: %v", keys)
	}
}

func testLockTimeout(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	g := newGate(t, t.TempDir(), "holder")
	ctl := etcdctl(t, env(s), "lock", "locktimeout", "--", "sh", "-c", g.script())
	g.awaitReady(t)
	holderKey := queueKeys(t, cli, "locktimeout")[0]
	p := runBin(t, env(s), lockArgs("locktimeout", "--lock-timeout", "300ms", "--", "true")...)
	if p.code != codeLockTimeout {
		t.Fatalf("exit %d, want %d", p.code, codeLockTimeout)
	}
	if !strings.Contains(p.stderr.String(), holderKey) {
		t.Fatalf("timeout message does not name the holder %s:\n%s", holderKey, p.stderr)
	}
	if keys := queueKeys(t, cli, "locktimeout"); len(keys) != 1 {
		t.Fatalf("waiter key left behind: %v", keys)
	}
	g.release(t)
	ctl.wait(t)
}

func testStatus(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	g := newGate(t, dir, "holder")
	holder := bin(t, env(s), lockArgs("status", "--", "sh", "-c", g.script())...)
	g.awaitReady(t)
	waiter := bin(t, env(s), lockArgs("status", "--", "true")...)
	waitQueue(t, cli, "status", 2)
	ctl := etcdctl(t, env(s), "lock", "status", "--", "true")
	waitQueue(t, cli, "status", 3)
	if p := runBin(t, env(s), "hold", "--lock-name", "status", "--reason", "maintenance window"); p.code != codeOK {
		t.Fatalf("hold exit %d: %s", p.code, p.stderr)
	}

	p := runBin(t, env(s), "status", "--lock-name", "status", "--output", "json")
	if p.code != codeHold {
		t.Fatalf("status exit %d under a hold, want %d: %s", p.code, codeHold, p.stderr)
	}
	type info struct {
		Host     string     `json:"host"`
		PID      int        `json:"pid"`
		Started  time.Time  `json:"started"`
		Acquired *time.Time `json:"acquired"`
	}
	type entry struct {
		Key  string `json:"key"`
		Info *info  `json:"info"`
	}
	var st struct {
		Holder  *entry  `json:"holder"`
		Waiters []entry `json:"waiters"`
		Hold    *struct {
			Host   string `json:"host"`
			Reason string `json:"reason"`
		} `json:"hold"`
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, p.stdout)
	}
	if st.Holder == nil || st.Holder.Info == nil || st.Holder.Info.PID != holder.cmd.Process.Pid ||
		st.Holder.Info.Host != hostname(t) || st.Holder.Info.Started.IsZero() || st.Holder.Info.Acquired == nil {
		t.Fatalf("holder %+v", st.Holder)
	}
	if len(st.Waiters) != 2 || st.Waiters[0].Info == nil || st.Waiters[0].Info.PID != waiter.cmd.Process.Pid ||
		st.Waiters[0].Info.Acquired != nil || st.Waiters[1].Info != nil || !strings.HasPrefix(st.Waiters[1].Key, "status/") {
		t.Fatalf("waiters (want binary, then etcdctl without info) %+v", st.Waiters)
	}
	if st.Hold == nil || st.Hold.Reason != "maintenance window" || st.Hold.Host != hostname(t) {
		t.Fatalf("hold %+v", st.Hold)
	}

	text := runBin(t, env(s), "status", "--lock-name", "status")
	if text.code != codeHold {
		t.Errorf("status exit %d under a hold, want %d", text.code, codeHold)
	}
	for _, want := range []string{"holder:  status/", fmt.Sprintf("pid %d", holder.cmd.Process.Pid), "waiters: 2",
		"1. status/", "2. status/", "no holder info", "hold:    ACTIVE", "maintenance window"} {
		if !strings.Contains(text.stdout.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, text.stdout)
		}
	}

	// The waiter re-checks the hold once it gets the lock, and refuses.
	g.release(t)
	if code := holder.wait(t); code != codeOK {
		t.Fatalf("holder exit %d", code)
	}
	if code := waiter.wait(t); code != codeHold {
		t.Fatalf("waiter exit %d, want %d: the hold appeared while it waited", code, codeHold)
	}
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	empty := runBin(t, env(s), "status", "--lock-name", "status")
	if !strings.Contains(empty.stdout.String(), "holder:  none") || !strings.Contains(empty.stdout.String(), "waiters: none") {
		t.Fatalf("status after all left:\n%s", empty.stdout)
	}
}

func testEnvPrecedence(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dead := etcdtest.UnusedEndpoint(t)
	short := []string{"--dial-timeout", "300ms", "--command-timeout", "700ms"}
	base := slices.Clip(env(nil)) // appends below must not share a backing array
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want int
	}{
		{"env only", append(base, "ETCDCTL_ENDPOINTS="+s.Endpoint), nil, codeOK},
		{"flag beats env", append(base, "ETCDCTL_ENDPOINTS="+dead), []string{"--endpoints", s.Endpoint}, codeOK},
		{"flag beats env, other way", append(base, "ETCDCTL_ENDPOINTS="+s.Endpoint), []string{"--endpoints", dead}, codeError},
		{"env timeouts used", append(base, "ETCDCTL_ENDPOINTS="+dead, "ETCDCTL_DIAL_TIMEOUT=300ms", "ETCDCTL_COMMAND_TIMEOUT=700ms"), nil, codeError},
	} {
		args := append([]string{"status", "--lock-name", "envprec"}, tc.args...)
		if tc.want != codeOK && len(tc.args) > 0 {
			args = append(args, short...)
		}
		start := time.Now()
		if p := runBin(t, tc.env, args...); p.code != tc.want {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, p.code, tc.want, p.stderr)
		}
		if el := time.Since(start); tc.want != codeOK && el > 10*time.Second {
			t.Errorf("%s: took %s; timeouts not applied", tc.name, el)
		}
	}
}

// TestTLSEnvAndFlags: etcdctl's TLS variables work, and flags beat them.
func TestTLSEnvAndFlags(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t, etcdtest.WithTLS())
	tlsEnv := env(s) // ETCDCTL_ENDPOINTS, _CACERT, _CERT, _KEY
	if p := runBin(t, tlsEnv, "status", "--lock-name", "tls"); p.code != codeOK {
		t.Fatalf("status over TLS from env: exit %d\n%s", p.code, p.stderr)
	}
	p := runBin(t, tlsEnv, "status", "--lock-name", "tls", "--cert", s.TLS.UntrustedClientCert, "--key", s.TLS.UntrustedClientKey,
		"--dial-timeout", "300ms", "--command-timeout", "700ms")
	if p.code != codeError {
		t.Fatalf("untrusted client cert from flags must beat env and be refused: exit %d", p.code)
	}
	if strings.Contains(p.stderr.String(), "PRIVATE KEY") {
		t.Fatal("key material in the log")
	}
	// A full restart over TLS, flags only.
	args := append(lockArgs("tls"), "--endpoints", s.Endpoint, "--cacert", s.TLS.CA, "--cert", s.TLS.ClientCert, "--key", s.TLS.ClientKey, "--", "true")
	if p := runBin(t, env(nil), args...); p.code != codeOK {
		t.Fatalf("restart over TLS: exit %d\n%s", p.code, p.stderr)
	}
}

// guardsFor lists the group guards (pid → parent pid) whose command line
// names the file mark, which only the command under test does.
func guardsFor(t *testing.T, mark string) map[int]int {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	found := map[int]int{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "\x00__group-guard\x00") || !strings.Contains(string(b), mark) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces, not ")".
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		found[pid], _ = strconv.Atoi(f[1])
	}
	return found
}

// The command's group guard is started while the helper waits for the
// lock, and handed the command only once the lock is held: a wait that
// ends without it (a signal; a hold found under the lock) runs nothing
// and leaves no guard behind.
// testGuardUnderLock: a restart waiting for the lock has started nothing,
// not even the command's group guard; interrupted, or refused by a hold
// written while it waited, it leaves nothing behind; given the lock, it
// runs the command.
func testGuardUnderLock(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	g := newGate(t, dir, "holder")
	ctl := etcdctl(t, env(s), "lock", "warm", "--", "sh", "-c", g.script())
	// Should the test fail while etcdctl holds the lock, let its command go
	// (a non-blocking open finds it waiting, or nobody), so that etcdctl's
	// cleanup, which runs after this one, does not wait on it forever.
	t.Cleanup(func() {
		if f, err := os.OpenFile(g.Release, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
		}
	})
	g.awaitReady(t)

	w := bin(t, env(s), lockArgs("warm", "--", "touch", mark)...)
	waitQueue(t, cli, "warm", 2)
	if guards := guardsFor(t, mark); len(guards) != 0 {
		t.Fatalf("a guard runs while the helper %d waits for the lock: %v", w.cmd.Process.Pid, guards)
	}
	w.signal(t, syscall.SIGTERM)
	if code := w.wait(t); code != codeInterrupted {
		t.Fatalf("interrupted waiter: exit %d, want %d", code, codeInterrupted)
	}
	if guards := guardsFor(t, mark); len(guards) != 0 {
		t.Fatalf("guards left behind by an interrupted waiter: %v", guards)
	}
	if strings.Contains(w.stderr.String(), "restart command") {
		t.Fatalf("a command run was logged:\n%s", w.stderr)
	}

	// A hold written while it waits: refused under the lock.
	w = bin(t, env(s), lockArgs("warm", "--", "touch", mark)...)
	waitQueue(t, cli, "warm", 2)
	if guards := guardsFor(t, mark); len(guards) != 0 {
		t.Fatalf("a guard runs while waiting for the lock: %v", guards)
	}
	if p := runBin(t, env(s), "--lock-name", "warm", "hold", "--reason", "stop"); p.code != codeOK {
		t.Fatalf("hold: exit %d\n%s", p.code, p.stderr)
	}
	g.release(t)
	ctl.wait(t)
	if code := w.wait(t); code != codeHold {
		t.Fatalf("waiter under a hold: exit %d, want %d\n%s", code, codeHold, w.stderr)
	}
	if guards := guardsFor(t, mark); len(guards) != 0 {
		t.Fatalf("guards left behind by a refused restart: %v", guards)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the command ran without the lock")
	}
	if p := runBin(t, env(s), "--lock-name", "warm", "unhold"); p.code != codeOK {
		t.Fatalf("unhold: exit %d\n%s", p.code, p.stderr)
	}
	if p := runBin(t, env(s), lockArgs("warm", "--", "touch", mark)...); p.code != codeOK {
		t.Fatalf("restart: exit %d\n%s", p.code, p.stderr)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the command did not run under the lock: %v", err)
	}
}
