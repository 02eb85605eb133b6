package groupguard

import (
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/runner"
)

// TestMain lets this test binary be the guard, as the real binaries are
// (Start re-executes the running binary).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		os.Exit(Main("groupguard.test", os.Args[2:]))
	}
	os.Exit(m.Run())
}

// A guard killed while its command runs leaves the command's group
// unwatched: Watch.OnExit kills the group as soon as the guard is seen
// dead, not once the command's output has been drained, which a command
// that keeps writing would put off for ever.
func TestWatchKillsGroupWhenGuardDies(t *testing.T) {
	lines := make(chan string, 1000)
	p, w, err := Start(t.Context(), runner.Spec{
		Argv:      []string{"sh", "-c", `while :; do echo x; sleep 0.01; done`},
		Grace:     10 * time.Second,
		PipeDrain: 2 * time.Second,
		OnLine: func(_ runner.Stream, l string) {
			select {
			case lines <- l:
			default:
			}
		},
	}, Options{Grace: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if first := w.First(); first != StartedLine {
		t.Fatalf("first status line %q", first)
	}
	<-lines // the command runs and writes
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan runner.Result, 1)
	go func() { done <- p.Wait() }()
	select {
	case res := <-done:
		if w.Reported || w.GroupAlive || res.PipeHeld {
			t.Fatalf("reported %v, group alive %v, pipe held %v: want no report, the group gone before the drain", w.Reported, w.GroupAlive, res.PipeHeld)
		}
	case <-time.After(time.Minute):
		t.Fatal("Wait has not returned a minute after the guard died: its command's group was left running")
	}
	if err := syscall.Kill(-p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("group %d: %v, want ESRCH", p.Pid(), err)
	}
}
