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
// (Wrap re-executes the running binary).
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
	status, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer status.Close()
	w := NewWatch(status, 10*time.Second)
	lines := make(chan string, 1000)
	spec := Wrap(runner.Spec{
		Argv:      []string{"sh", "-c", `while :; do echo x; sleep 0.01; done`},
		Grace:     10 * time.Second,
		PipeDrain: 2 * time.Second,
		OnLine: func(_ runner.Stream, l string) {
			select {
			case lines <- l:
			default:
			}
		},
	}, Options{Status: statusW, Grace: 10 * time.Second})
	spec.OnExit = w.OnExit
	p, err := runner.Start(t.Context(), spec)
	_ = statusW.Close()
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
		if w.Status.Reported || w.GroupAlive || res.PipeHeld {
			t.Fatalf("status %+v, group alive %v, pipe held %v: want no report, the group gone before the drain", w.Status, w.GroupAlive, res.PipeHeld)
		}
	case <-time.After(time.Minute):
		t.Fatal("Wait has not returned a minute after the guard died: its command's group was left running")
	}
	if err := syscall.Kill(-p.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("group %d: %v, want ESRCH", p.Pid(), err)
	}
}
