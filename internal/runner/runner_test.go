package runner

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keysync/confd/internal/redact"
)

func TestExitStatusEnvAndStreams(t *testing.T) {
	var out, errOut strings.Builder
	r := Run(context.Background(), Spec{Argv: Shell(`echo "$FOO"; echo oops >&2; exit 3`), Env: []string{"FOO=bar"},
		Stdout: &out, Stderr: &errOut, Timeout: time.Minute})
	if r.ExitCode != 3 || r.Err == nil || r.TimedOut || !strings.Contains(r.Err.Error(), "status 3") {
		t.Fatalf("result %+v", r)
	}
	if out.String() != "bar\n" || errOut.String() != "oops\n" {
		t.Fatalf("stdout %q stderr %q", out.String(), errOut.String())
	}
	if r := Run(context.Background(), Spec{Argv: []string{"true"}}); r.Err != nil || r.ExitCode != 0 {
		t.Fatalf("true: %+v", r)
	}
	if _, err := Start(context.Background(), Spec{Argv: []string{"/nonexistent/cmd"}}); err == nil || !strings.Contains(err.Error(), "/nonexistent/cmd") {
		t.Fatalf("start error %v", err)
	}
}

func TestOwnProcessGroup(t *testing.T) {
	var lines []string
	r := Run(context.Background(), Spec{Argv: []string{"/bin/sh", "-c", "ps -o pgid= -p $$; echo $$"}, OnLine: func(_ Stream, l string) {
		lines = append(lines, strings.TrimSpace(l))
	}})
	if r.Err != nil || len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("pgid/pid %q, %+v", lines, r)
	}
}

// A reload that starts a daemon which inherits stdout must count as
// success, promptly, and the daemon must survive our stopping to read.
func TestBackgroundChildHoldingStdoutIsSuccess(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	var mu sync.Mutex
	var lines []string
	r := Run(context.Background(), Spec{
		Argv:      Shell(`sleep 300 & echo $! > ` + pidFile + `; echo started`),
		Timeout:   time.Minute,
		PipeDrain: 50 * time.Millisecond,
		OnLine: func(_ Stream, l string) {
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
		},
	})
	if r.Err != nil || !r.PipeHeld || r.ExitCode != 0 {
		t.Fatalf("result %+v", r)
	}
	mu.Lock()
	if len(lines) != 1 || lines[0] != "started" {
		t.Fatalf("lines %q", lines)
	}
	mu.Unlock()
	pid := readPid(t, pidFile)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("background child %d is gone: %v", pid, err)
	}
}

func TestTimeoutSendsTermAndWaitsForGrace(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "term")
	// The command catches SIGTERM and exits cleanly: no SIGKILL is owed.
	// The timeout leaves ample time for the shell to set its trap.
	r := Run(context.Background(), Spec{
		Argv:    Shell(`trap 'echo term > ` + mark + `; exit 7' TERM; echo ready; while :; do sleep 1; done`),
		Timeout: time.Second,
		Grace:   time.Minute,
	})
	if !r.TimedOut || r.Killed || r.Err == nil || r.ExitCode != 7 || !strings.Contains(r.Err.Error(), "did not finish within 1s") {
		t.Fatalf("result %+v", r)
	}
	if b, err := os.ReadFile(mark); err != nil || string(b) != "term\n" {
		t.Fatalf("SIGTERM not seen: %q %v", b, err)
	}
}

func TestTimeoutKillsAfterGrace(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child")
	// Shell and child ignore SIGTERM from their start (no race with a
	// trap), so only SIGKILL after the grace ends them; the background
	// child goes with its group.
	r := Run(context.Background(), Spec{
		Argv:    []string{"env", "--ignore-signal=TERM", "sh", "-c", `sleep 300 & echo $! > ` + pidFile + `; wait; wait`},
		Timeout: 100 * time.Millisecond,
		Grace:   100 * time.Millisecond,
	})
	if !r.TimedOut || !r.Killed || r.Signal != syscall.SIGKILL || !strings.Contains(r.Err.Error(), "SIGKILL after 100ms grace") {
		t.Fatalf("result %+v", r)
	}
	waitGone(t, readPid(t, pidFile))
}

func TestContextCancelTerminatesWithGrace(t *testing.T) {
	dir := t.TempDir()
	mark := filepath.Join(dir, "term")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var once sync.Once
	p, err := Start(ctx, Spec{
		Argv:   Shell(`trap 'sleep 0.2; echo term > ` + mark + `; exit 0' TERM; echo ready; while :; do sleep 1; done`),
		Grace:  time.Minute,
		OnLine: func(Stream, string) { once.Do(func() { close(started) }) },
	})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	cancel()
	r := p.Wait()
	// It finished its work in the grace and said so with status 0.
	if !r.Terminated || r.Killed || r.Err != nil {
		t.Fatalf("result %+v", r)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the command's TERM handler did not finish: %v", err)
	}
	// Stopped and not finished: a failure that says so.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	r = Run(ctx, Spec{Argv: []string{"sleep", "60"}})
	if !r.Terminated || r.Err == nil || r.Signal != syscall.SIGTERM || !strings.Contains(r.Err.Error(), "stopped before it finished; its process group got SIGTERM") {
		t.Fatalf("result %+v", r)
	}
}

func TestLinesOneByOneAndTailOfMegabytes(t *testing.T) {
	var got []string
	Run(context.Background(), Spec{Argv: Shell(`printf 'a\nb\r\n\nc'`),
		OnLine: func(_ Stream, l string) { got = append(got, l) }})
	if want := []string{"a", "b", "", "c"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("lines %q, want %q", got, want)
	}
	// About 2 MB of output: the end, where the real error is, is kept.
	r := Run(context.Background(), Spec{Argv: Shell(`seq 1 300000 >&2; echo last-error >&2; exit 1`)})
	want := make([]string, 0, TailLines)
	for i := 300000 - TailLines + 2; i <= 300000; i++ {
		want = append(want, strconv.Itoa(i))
	}
	if want = append(want, "last-error"); !slices.Equal(r.Tail, want) || r.Dropped != 300001-TailLines {
		t.Fatalf("tail %q dropped %d", r.Tail, r.Dropped)
	}
}

func TestOverlongLineIsCut(t *testing.T) {
	r := Run(context.Background(), Spec{Argv: Shell(`head -c 100000 /dev/zero | tr '\0' x; echo; echo next`)})
	if len(r.Tail) != 2 || r.Tail[1] != "next" || !strings.HasSuffix(r.Tail[0], fmt.Sprintf(" [%d more bytes of this line dropped]", 100000-MaxLine)) ||
		!strings.HasPrefix(r.Tail[0], strings.Repeat("x", MaxLine)) {
		t.Fatalf("tail %d lines, first ends %q", len(r.Tail), r.Tail[0][max(0, len(r.Tail[0])-60):])
	}
}

func TestOutputIsRedacted(t *testing.T) {
	var all []string
	r := Run(context.Background(), Spec{Argv: Shell(`printf -- '-----BEGIN RSA PRIVATE KEY-----\nMIIsecretbody\n-----END RSA PRIVATE KEY-----\n'; exit 1`),
		OnLine: func(_ Stream, l string) { all = append(all, l) }})
	for _, l := range append(all, r.Tail...) {
		if strings.Contains(l, "MIIsecretbody") {
			t.Fatalf("secret in output: %q / %q", all, r.Tail)
		}
	}
	if len(all) != 3 || all[1] != redact.Mask {
		t.Fatalf("lines %q", all)
	}
}

// TestEncodedKeyOutputInChunksIsRedacted: `base64 -w0` of a key file
// written in pieces (as a pipe delivers it), and wrapped `base64` output,
// are judged per whole line and per whole block.
func TestEncodedKeyOutputInChunksIsRedacted(t *testing.T) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalECPrivateKey(k)
	file := "# comment\n" + string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
	enc := base64.StdEncoding.EncodeToString([]byte(file))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "k"), []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cmd := range map[string]string{
		"w0-chunks": fmt.Sprintf("printf %%s %s; printf %%s %s; echo; echo after", enc[:50], enc[50:]),
		"wrapped":   "base64 " + filepath.Join(dir, "k") + "; echo after",
	} {
		var all []string
		r := Run(context.Background(), Spec{Argv: Shell(cmd), OnLine: func(_ Stream, l string) { all = append(all, l) }})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		out := strings.Join(all, "\n")
		if strings.Contains(out, enc[60:80]) || !strings.Contains(out, redact.Mask) || all[len(all)-1] != "after" {
			t.Errorf("%s: output %q", name, all)
		}
	}
}

func TestWithoutVars(t *testing.T) {
	got := WithoutVars([]string{"A=1", "CONFD_PASSWORD=x", "B=2=3", "CONFD_PASSWORDX=y", "CONFD_USERNAME=u"}, "CONFD_PASSWORD", "CONFD_USERNAME")
	if strings.Join(got, " ") != "A=1 B=2=3 CONFD_PASSWORDX=y" {
		t.Fatalf("got %q", got)
	}
}

func TestQuote(t *testing.T) {
	if got := Quote([]string{"systemctl", "restart", "a b", "it's"}); got != `systemctl restart 'a b' 'it'\''s'` {
		t.Fatal(got)
	}
	if got := Quote(Shell("echo hi")); got != `'echo hi'` {
		t.Fatal(got)
	}
}

// TestParentDeathSignal kills a parent that started a command with
// ParentDeathSignal; the kernel must then kill the command. The parent is
// this test binary re-executed (see TestMain).
func TestParentDeathSignal(t *testing.T) {
	// Orphans get reparented to us, so that we can reap and observe them.
	if err := prctlSubreaper(); err != nil {
		t.Skipf("cannot become a child subreaper: %v", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(exe, "-test.run=^$")
	helper.Env = append(os.Environ(), "RUNNER_TEST_PDEATHSIG=1")
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Fscan(stdout, &pid); err != nil {
		t.Fatalf("helper did not report its child: %v", err)
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	// The orphan is now our child: wait4 returns once it has died.
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatalf("wait4 %d: %v", pid, err)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended %v, want killed by SIGKILL", ws)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv("RUNNER_TEST_PDEATHSIG") == "1" {
		p, err := Start(context.Background(), Spec{Argv: []string{"sleep", "300"}, ParentDeathSignal: syscall.SIGKILL})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		// Give the runtime every chance to move this goroutine elsewhere.
		for i := 0; i < 100; i++ {
			go func() {}()
		}
		fmt.Println(p.Pid())
		p.Wait()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func prctlSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

func readPid(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits for a process that is not our child to disappear (or
// become a zombie), through a pidfd: an event, not a polling guess.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 60_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("process %d still alive after a minute (poll %d, %v)", pid, n, err)
		}
		return
	}
}

func TestCombinedOutputKeepsOrder(t *testing.T) {
	var got []string
	r := Run(context.Background(), Spec{Argv: Shell(`for i in 1 2 3 4 5 6 7 8; do echo out$i; echo err$i >&2; done`), CombinedOutput: true,
		OnLine: func(s Stream, l string) {
			got = append(got, map[Stream]string{Stdout: "stdout", Stderr: "stderr"}[s]+":"+l)
		}})
	want := "stdout:out1 stdout:err1 stdout:out2 stdout:err2 stdout:out3 stdout:err3 stdout:out4 stdout:err4 stdout:out5 stdout:err5 stdout:out6 stdout:err6 stdout:out7 stdout:err7 stdout:out8 stdout:err8"
	if r.Err != nil || strings.Join(got, " ") != want {
		t.Fatalf("got %q, %+v", got, r)
	}
}

// What the command wrote before it exited is delivered in full, however
// slow the consumer: only an idle pipe held by someone else is cut off.
func TestSlowConsumerGetsEverything(t *testing.T) {
	var last string
	n := 0
	r := Run(context.Background(), Spec{Argv: Shell(`seq 1 300`), PipeDrain: 50 * time.Millisecond,
		OnLine: func(_ Stream, l string) { time.Sleep(time.Millisecond); last = l; n++ }})
	if r.Err != nil || r.PipeHeld || n != 300 || last != "300" {
		t.Fatalf("got %d lines, last %q, %+v", n, last, r)
	}
}

// Terminate, as safe-restart uses it when its lease is lost: SIGTERM now,
// SIGKILL after the given grace for a command that ignores SIGTERM.
func TestTerminateKillsAfterItsGrace(t *testing.T) {
	ready := make(chan struct{})
	var once sync.Once
	p, err := Start(context.Background(), Spec{
		Argv:   []string{"env", "--ignore-signal=TERM", "sh", "-c", "echo ready; while :; do sleep 1; done"},
		Grace:  time.Hour, // Terminate's own grace applies, not the Spec's
		OnLine: func(Stream, string) { once.Do(func() { close(ready) }) },
	})
	if err != nil {
		t.Fatal(err)
	}
	<-ready
	p.Terminate(50 * time.Millisecond)
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("not ended a minute after Terminate")
	}
	if r := p.Wait(); !r.Terminated || !r.Killed || r.Signal != syscall.SIGKILL || r.Err == nil {
		t.Fatalf("result %+v", r)
	}
}
