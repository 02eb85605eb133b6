package saferestart

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/saferestart/internal/restart"

	"golang.org/x/sys/unix"
)

// TestMain lets this test binary be the group guard, as the real binary is
// (guardedArgv re-executes os.Executable()), and the helper process that a
// test SIGKILLs.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == guardArg {
		os.Exit(groupGuard(os.Args[2:]))
	}
	if os.Getenv("SAFE_RESTART_TEST_WARM_HELPER") == "1" {
		warmHelper()
	}
	os.Exit(m.Run())
}

// warmHelper warms a guard, reports its pid, and waits to be killed.
func warmHelper() {
	r := &commandRunner{stdout: os.Stderr, stderr: os.Stderr, timeout: time.Minute, env: os.Environ()}
	if err := r.warm([]string{"sleep", "300"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(r.warmed.p.Pid())
	r.warmed.p.Wait()
	os.Exit(3)
}

// waitTimeout bounds every wait here; nothing should take this long.
const waitTimeout = 30 * time.Second

// lines is an output writer whose lines a test can wait for.
type lines struct {
	mu  sync.Mutex
	buf bytes.Buffer
	ch  chan string
}

func newLines() *lines { return &lines{ch: make(chan string, 100)} }

func (l *lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(b)
	for _, s := range strings.SplitAfter(string(b), "\n") {
		if s != "" {
			l.ch <- strings.TrimSuffix(s, "\n")
		}
	}
	return len(b), nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *lines) next(t *testing.T) string {
	t.Helper()
	select {
	case s := <-l.ch:
		return s
	case <-time.After(waitTimeout):
		t.Fatalf("no output line within %s", waitTimeout)
		return ""
	}
}

func newRunner(timeout time.Duration) (*commandRunner, *lines) {
	out := newLines()
	// Built with -race, the guard would sleep a second before it exits.
	env := append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	return &commandRunner{stdout: out, stderr: out, timeout: timeout, env: env}, out
}

// done waits for a process of ours to end.
func done(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(waitTimeout):
		t.Fatalf("%s did not end within %s", what, waitTimeout)
	}
}

// cmdlinesWith lists the processes whose command line holds s.
func cmdlinesWith(t *testing.T, s string) []string {
	t.Helper()
	paths, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(s)) {
			found = append(found, p+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// A warm guard that is never handed its command (lock refused, hold,
// preflight, signal) runs nothing, prints nothing, and is reaped.
func TestWarmGuardWithoutHandoverRunsNothing(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "ran")
	r, out := newRunner(time.Minute)
	argv := []string{"touch", mark}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	g := r.warmed
	if got := cmdlinesWith(t, mark); len(got) != 1 {
		t.Fatalf("want the one warm guard, waiting, with the command on its command line: %q", got)
	}
	r.close()
	done(t, g.p.Done(), "the warm guard")
	if res := g.p.Wait(); res.ExitCode != 0 || res.Signal != 0 {
		t.Fatalf("guard ended %+v, want a quiet exit", res)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("the command ran without a hand-over")
	}
	if s := out.String(); s != "" {
		t.Fatalf("output %q", s)
	}
	if err := syscall.Kill(g.p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("guard %d not reaped: %v", g.p.Pid(), err)
	}
	if got := cmdlinesWith(t, mark); len(got) != 0 {
		t.Fatalf("processes remain: %q", got)
	}
}

// The command's environment reaches it through the warm guard's stdin: on
// no command line, not in the guard's own environment. The command runs
// under the warm guard, with /dev/null as its stdin.
func TestHandoverEnvReachesCommandOnly(t *testing.T) {
	const secret = "s3cr3t-lock-value-31337"
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", `echo "ppid=$PPID stdin=$(readlink /proc/$$/fd/0) v=$WARM_TEST_SECRET"; exec sleep 300`}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	guardPid := r.warmed.p.Pid()
	p, err := r.Start(argv, []string{"PATH=" + os.Getenv("PATH"), "WARM_TEST_SECRET=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Terminate(0)
		done(t, p.Done(), "the command")
	}()
	if p.Pid() != guardPid {
		t.Fatalf("ran under guard %d, not the warm one %d", p.Pid(), guardPid)
	}
	want := fmt.Sprintf("ppid=%d stdin=/dev/null v=%s", guardPid, secret)
	if l := out.next(t); l != want {
		t.Fatalf("command printed %q, want %q", l, want)
	}
	if got := cmdlinesWith(t, secret); len(got) != 0 {
		t.Fatalf("the environment is on a command line: %q", got)
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", guardPid))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(environ, []byte(secret)) {
		t.Fatal("the command's environment is in the guard's own")
	}
}

// The timeout counts from the hand-over: a guard warmed long before (here
// three timeouts) leaves the command all of its time.
func TestTimeoutCountsFromHandover(t *testing.T) {
	const timeout = 300 * time.Millisecond
	r, _ := newRunner(timeout)
	argv := []string{"sh", "-c", "exit 0"}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.warmed.p.Done():
		t.Fatalf("warm guard ended before the hand-over: %+v", r.warmed.p.Wait())
	case <-time.After(3 * timeout):
	}
	p, err := r.Start(argv, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("the wait before the hand-over ate the command's timeout: %v", err)
	}
	// And the timeout still applies, from the hand-over.
	slow := []string{"sleep", "60"}
	if err := r.warm(slow); err != nil {
		t.Fatal(err)
	}
	p, err = r.Start(slow, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.Wait()
	if err == nil || !strings.Contains(err.Error(), "did not finish within 300ms; its process group got SIGTERM") {
		t.Fatalf("slow command: %v", err)
	}
	if took := time.Since(start); took > 10*timeout {
		t.Fatalf("timed out after %s", took)
	}
}

// A warm guard that died before the hand-over (killed by someone else)
// ran nothing; a fresh guard runs the command, as without warming.
func TestDeadWarmGuardReplaced(t *testing.T) {
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", "echo ran"}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	dead := r.warmed.p
	if err := syscall.Kill(dead.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done(t, dead.Done(), "the killed guard")
	p, err := r.Start(argv, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil || p.Pid() == dead.Pid() {
		t.Fatalf("pid %d (dead %d): %v", p.Pid(), dead.Pid(), err)
	}
	if l := out.next(t); l != "ran" {
		t.Fatalf("output %q", l)
	}
}

// A later attempt (the warm guard already used) starts its own guard.
func TestSecondStartSpawnsItsGuard(t *testing.T) {
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", `echo "$N"`}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"1", "2"} {
		p, err := r.Start(argv, []string{"N=" + n})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		if l := out.next(t); l != n {
			t.Fatalf("attempt %s printed %q", n, l)
		}
	}
}

// A helper SIGKILLed while its guard waits for the hand-over leaves no
// process behind.
func TestHelperKilledDuringWarmWait(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(exe, "-test.run=^$")
	helper.Env = append(os.Environ(), "SAFE_RESTART_TEST_WARM_HELPER=1")
	helper.Stderr = os.Stderr
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = helper.Process.Kill()
		t.Fatalf("helper did not report its guard: %v", err)
	}
	guard, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	// Held before the kill, so that a recycled pid cannot pass for it.
	fd, err := unix.PidfdOpen(guard, 0)
	if err != nil {
		t.Fatalf("warm guard %d: %v", guard, err)
	}
	defer unix.Close(fd)
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	_, _ = io.Copy(io.Discard, stdout)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(waitTimeout/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("warm guard %d still runs %s after its helper was killed (poll %d, %v)", guard, waitTimeout, n, err)
		}
		return
	}
}

// A guard killed (by anyone, SIGKILL included) while its command runs: Wait
// reports restart.ErrGuardDied only once the command's whole group is gone.
func TestGuardKilledDuringCommandKillsGroup(t *testing.T) {
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", `sleep 300 & echo "child=$!"; wait`}
	p, err := r.Start(argv, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	line := out.next(t)
	child, err := strconv.Atoi(strings.TrimPrefix(line, "child="))
	if err != nil {
		t.Fatalf("output %q", line)
	}
	fd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = p.Wait()
	if !errors.Is(err, restart.ErrGuardDied) || errors.Is(err, restart.ErrGroupAlive) {
		t.Fatalf("Wait = %v, want ErrGuardDied", err)
	}
	// Gone already when Wait returned: no waiting here.
	if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0); n != 1 {
		t.Fatalf("the command's child %d still runs after Wait", child)
	}
	if err := syscall.Kill(-p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("group %d: %v, want ESRCH", p.Pid(), err)
	}
}

// A command that cannot start is reported as such by its guard, warm or
// not: restart.ErrNotStarted names the command and why, not exit 127.
func TestCommandThatCannotStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-restart")
	for _, warm := range []bool{true, false} {
		r, _ := newRunner(time.Minute)
		argv := []string{missing, "now"}
		if warm {
			if err := r.warm(argv); err != nil {
				t.Fatal(err)
			}
		}
		p, err := r.Start(argv, os.Environ())
		if !errors.Is(err, restart.ErrNotStarted) || p != nil {
			t.Fatalf("warm %v: Start = %v, %v; want ErrNotStarted", warm, p, err)
		}
		want := "restart command could not start: " + missing + " now: fork/exec " + missing + ": no such file or directory"
		if err.Error() != want {
			t.Fatalf("warm %v: error %q, want %q", warm, err, want)
		}
	}
}

// A failed command's error, which becomes the hold's reason, names the
// command as the operator gave it, not the guard running it.
func TestCommandErrorNamesTheCommand(t *testing.T) {
	r, _ := newRunner(time.Minute)
	argv := []string{"sh", "-c", "exit 3"}
	if err := r.warm(argv); err != nil {
		t.Fatal(err)
	}
	p, err := r.Start(argv, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	err = p.Wait()
	if err == nil || err.Error() != "sh -c 'exit 3' exited with status 3" {
		t.Fatalf("error %v, want the command and its status", err)
	}
}
