package restartcmd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keysync/confd/internal/groupguard"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restart"
)

// TestMain lets this test binary be the group guard, as the real binary is
// (groupguard.Start re-executes os.Executable()).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == groupguard.Arg {
		os.Exit(groupguard.Main(cmdkit.ProgName, os.Args[2:]))
	}
	os.Exit(m.Run())
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
	return &commandRunner{stdout: out, stderr: out, timeout: timeout}, out
}

// testEnv is a command's environment here. Built with -race, the guard
// would sleep a second before it exits.
func testEnv(extra ...string) []string {
	return append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), extra...)
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

// A guard killed (by anyone, SIGKILL included) while its command runs: Wait
// reports restart.ErrGuardDied only once the command's whole group is gone.
func TestGuardKilledDuringCommandKillsGroup(t *testing.T) {
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", `sleep 300 & echo "child=$!"; wait`}
	p, err := r.Start(argv, testEnv())
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

// The command's environment (the lock's key among it) reaches it on no
// command line; the command runs under its guard.
func TestCommandEnvNotOnCommandLine(t *testing.T) {
	const secret = "s3cr3t-lock-value-31337"
	r, out := newRunner(time.Minute)
	argv := []string{"sh", "-c", `echo "ppid=$PPID v=$GUARD_TEST_SECRET"; exec sleep 300`}
	p, err := r.Start(argv, testEnv("GUARD_TEST_SECRET="+secret))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Terminate(0)
		done(t, p.Done(), "the command")
	}()
	want := fmt.Sprintf("ppid=%d v=%s", p.Pid(), secret)
	if l := out.next(t); l != want {
		t.Fatalf("command printed %q, want %q", l, want)
	}
	if got := cmdlinesWith(t, secret); len(got) != 0 {
		t.Fatalf("the environment is on a command line: %q", got)
	}
}

// A command that cannot start is reported as such by its guard, at Start:
// restart.ErrNotStarted names the command and why, not exit 127, and no
// attempt is logged as started.
func TestCommandThatCannotStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-restart")
	r, _ := newRunner(time.Minute)
	p, err := r.Start([]string{missing, "now"}, testEnv())
	if !errors.Is(err, restart.ErrNotStarted) || p != nil {
		t.Fatalf("Start = %v, %v; want ErrNotStarted", p, err)
	}
	want := "restart command could not start: " + missing + " now: fork/exec " + missing + ": no such file or directory"
	if err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

// A failed command's error, which becomes the hold's reason, names the
// command as the operator gave it, not the guard running it.
func TestCommandErrorNamesTheCommand(t *testing.T) {
	r, _ := newRunner(time.Minute)
	argv := []string{"sh", "-c", "exit 3"}
	p, err := r.Start(argv, testEnv())
	if err != nil {
		t.Fatal(err)
	}
	err = p.Wait()
	if err == nil || err.Error() != "sh -c 'exit 3' exited with status 3" {
		t.Fatalf("error %v, want the command and its status", err)
	}
}
