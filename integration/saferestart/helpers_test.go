// Package saferestart tests the kube-apiserver-safe-restart binary end to
// end: built once, run as separate processes against a real etcd on
// loopback, next to a real etcdctl.
package saferestart

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

var (
	binPath string
	// The Makefile's version stamp, so that `version` is shown to print it.
	buildFlags = []string{"-ldflags=-X github.com/keysync/confd/internal/version.Version=" + stampedVersion}
)

const stampedVersion = "v0.0.0-itest"

func TestMain(m *testing.M) {
	bins, cleanup, err := testbin.Build(buildFlags, map[string]string{"kube-apiserver-safe-restart": "./cmd/kube-apiserver-safe-restart"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = bins["kube-apiserver-safe-restart"]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// Exit codes, as documented in the binary's --help.
const (
	codeOK          = 0
	codeError       = 1
	codeUsage       = 2
	codePreflight   = 3
	codeHold        = 4
	codeLockTimeout = 5
	codeRestart     = 6
	codeHealth      = 7
	codeLeaseLost   = 8
	codeInterrupted = 9
	codeStale       = 10
)

// waitLimit bounds every wait of these tests; nothing should take this long.
const waitLimit = 30 * time.Second

// watchBuf is an output buffer that can be waited on for a substring.
type watchBuf struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func newWatchBuf() *watchBuf { return &watchBuf{changed: make(chan struct{})} }

func (w *watchBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.b.Write(p)
	close(w.changed)
	w.changed = make(chan struct{})
	return n, err
}

func (w *watchBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// waitFor blocks until the output contains s.
func (w *watchBuf) waitFor(t *testing.T, s string) {
	t.Helper()
	timer := time.NewTimer(waitLimit)
	defer timer.Stop()
	for {
		w.mu.Lock()
		have, ch := w.b.String(), w.changed
		w.mu.Unlock()
		if strings.Contains(have, s) {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("output never contained %q; got:\n%s", s, have)
		}
	}
}

// proc is a started process (the binary or etcdctl).
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout *watchBuf
	stderr *watchBuf
	done   chan struct{}
	code   int
}

func startProc(t *testing.T, env []string, path string, args ...string) *proc {
	t.Helper()
	p := &proc{name: filepath.Base(path), stdout: newWatchBuf(), stderr: newWatchBuf(), done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s %q exit %d\nstdout:\n%s\nstderr:\n%s", p.name, args, p.code, p.stdout, p.stderr)
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait returns the exit code; the process must end within waitLimit.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(waitLimit):
		t.Fatalf("%s did not exit; stderr:\n%s", p.name, p.stderr)
		return -1
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s: %v", p.name, err)
	}
}

// env is the environment for the binary and etcdctl: this process's,
// without ETCDCTL_* settings, pointed at s, plus extra.
func env(s *etcdtest.Server, extra ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ETCDCTL_") {
			out = append(out, e)
		}
	}
	if s != nil {
		out = append(out, s.EtcdctlEnv()...)
	}
	return append(out, extra...)
}

// bin starts the binary; runBin runs it to the end. Neither reads the
// host's configuration file: --config= (none) unless the test names one.
func bin(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, binPath, append([]string{"--config="}, args...)...)
}

func runBin(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := bin(t, env, args...)
	p.wait(t)
	return p
}

func etcdctl(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startProc(t, env, toolbin.Etcd(t, "etcdctl"), args...)
}

// lockArgs are the flags every restart in these tests uses: its own lock
// name, no health gate unless a test adds one, short retries.
func lockArgs(name string, more ...string) []string {
	return append([]string{"--lock-name", name, "--health-url", "", "--retry-delay", "10ms"}, more...)
}

// gate is a pair of FIFOs through which a test and a command run under the
// lock meet: the command announces it runs (writing its pid to Ready) and
// blocks until the test opens Release.
type gate struct {
	Ready, Release string
	pgid           int
}

func newGate(t *testing.T, dir, name string) *gate {
	t.Helper()
	g := &gate{Ready: filepath.Join(dir, name+".ready"), Release: filepath.Join(dir, name+".release")}
	for _, f := range []string{g.Ready, g.Release} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if g.pgid > 0 { // never leave a blocked command behind
			_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
		}
	})
	return g
}

// script is the shell snippet that meets the test at this gate.
func (g *gate) script() string {
	return fmt.Sprintf(`echo $$ > %q; cat %q > /dev/null`, g.Ready, g.Release)
}

// awaitReady blocks until the command has started, and returns its pid.
func (g *gate) awaitReady(t *testing.T) int {
	t.Helper()
	type res struct {
		data []byte
		err  error
	}
	ch := make(chan res, 1)
	go func() { b, err := os.ReadFile(g.Ready); ch <- res{b, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(r.data)))
		if err != nil {
			t.Fatalf("ready fifo: %q", r.data)
		}
		g.pgid = pid
		return pid
	case <-time.After(waitLimit):
		t.Fatalf("command at %s never started", g.Ready)
		return 0
	}
}

// release lets the command go on.
func (g *gate) release(t *testing.T) {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(g.Release, os.O_WRONLY, 0)
		if err == nil {
			err = f.Close()
		}
		ch <- err
	}()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("command never opened %s", g.Release)
	}
}

// waitQueue blocks until the lock has exactly n keys (holder + waiters),
// following a watch rather than polling.
func waitQueue(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatalf("queue of %s never reached %d keys: %v", name, n, err)
		}
		if int(resp.Count) == n {
			return
		}
		wctx, wcancel := context.WithCancel(ctx)
		wc := cli.Watch(wctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wc:
		case <-ctx.Done():
		}
		wcancel()
	}
}

func queueKeys(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys
}

func getKey(t *testing.T, cli *clientv3.Client, key string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}

// span is one command run recorded in a log file as "start NS ..." and
// "end NS ..." lines by timeline().
type span struct {
	id         string
	start, end int64
	fields     []string
}

// timeline is a shell snippet appending "start <ns> <id> <lock key> <lock
// rev>" to log, staying busy for busy, then appending "end <ns> <id>".
func timeline(log, id, busy string) string {
	return fmt.Sprintf(`echo "start $(date +%%s%%N) %s $ETCD_LOCK_KEY $ETCD_LOCK_REV" >> %q; sleep %s; echo "end $(date +%%s%%N) %s" >> %q`, id, log, busy, id, log)
}

func readSpans(t *testing.T, log string) []span {
	t.Helper()
	f, err := os.Open(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	byID := map[string]*span{}
	var order []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) < 3 {
			t.Fatalf("bad log line %q", sc.Text())
		}
		ns, err := strconv.ParseInt(w[1], 10, 64)
		if err != nil {
			t.Fatalf("bad time in %q", sc.Text())
		}
		s := byID[w[2]]
		if s == nil {
			s = &span{id: w[2]}
			byID[w[2]] = s
			order = append(order, w[2])
		}
		switch w[0] {
		case "start":
			s.start, s.fields = ns, w[3:]
		case "end":
			s.end = ns
		}
	}
	var out []span
	for _, id := range order {
		out = append(out, *byID[id])
	}
	return out
}

// assertSerial fails when two recorded runs overlap or one is unfinished.
func assertSerial(t *testing.T, spans []span) {
	t.Helper()
	for i, s := range spans {
		if s.start == 0 || s.end == 0 || s.end < s.start {
			t.Fatalf("run %s incomplete: %+v", s.id, s)
		}
		if i > 0 && s.start < spans[i-1].end {
			t.Fatalf("runs overlap: %s started %s before %s ended", s.id,
				time.Duration(spans[i-1].end-s.start), spans[i-1].id)
		}
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func writeFile(t *testing.T, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func clientCountOnlyPrefix() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
}
