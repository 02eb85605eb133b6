package groupguard

import (
	"bufio"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/runner"
)

// wrap's guard command line parses back into what was asked for, with the
// descriptors where runner puts the files.
func TestWrapParses(t *testing.T) {
	lock, status := os.NewFile(100, "lock"), os.NewFile(101, "status")
	spec := wrap(runner.Spec{Argv: []string{"sh", "-c", "x"}, CombinedOutput: true},
		Options{Grace: 3 * time.Second, Lock: lock}, status)
	if spec.Argv[1] != Arg || spec.Name != "sh -c x" || spec.ParentDeathSignal != DeathSignal || !spec.ShareOutputReaders {
		t.Fatalf("spec %+v", spec)
	}
	if !slices.Equal(spec.ExtraFiles, []*os.File{lock, status}) {
		t.Fatalf("extra files %v", spec.ExtraFiles)
	}
	o, err := parse(spec.Argv[2:])
	if err != nil {
		t.Fatal(err)
	}
	// runner passes the output reader after the extra files: fd 3+2.
	if o.grace != 3*time.Second || o.lockFD != 3 || o.statusFD != 4 || !slices.Equal(o.drainFDs, []int{5}) ||
		o.parent != os.Getpid() || !slices.Equal(o.argv, []string{"sh", "-c", "x"}) {
		t.Fatalf("parsed %+v", o)
	}
	if _, err := parse([]string{"-bogus", "1", "--", "x"}); err == nil {
		t.Fatal("unknown option accepted")
	}
}

// Two runs of one command for one resource take one lock; another
// resource's run of the same command line does not wait for it.
func TestLockKeyedByResourceAndCommand(t *testing.T) {
	r := Runner{LockDir: t.TempDir()}
	spec := func(res string) runner.Spec {
		return runner.Spec{Name: "systemctl reload x", Env: []string{"CONFD_RESOURCE=" + res}}
	}
	held, err := r.lock(t.Context(), spec("/a/conf.d/x.toml"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	other, err := r.lock(t.Context(), spec("/b/conf.d/x.toml"))
	if err != nil {
		t.Fatalf("another resource waited: %v", err)
	}
	other.Close()
	waited := false
	r.Waiting = func(string) { waited = true }
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.lock(ctx, spec("/a/conf.d/x.toml")); err == nil || !waited {
		t.Fatalf("the same resource's run did not wait: %v (waiting reported: %v)", err, waited)
	}
}

// The status pipe's first line says the command started (or why not); the
// report after it says how it ended.
func TestReadStatus(t *testing.T) {
	for in, want := range map[string]bool{
		StartedLine + "exit 3\n":      true,
		StartedLine + "signal 9\n":    true,
		StartedLine:                   false,
		"notrun exec: no such file\n": true,
		"exit 0\n":                    true,
		"":                            false,
		StartedLine + "exi":           false,
	} {
		if got := reported(in); got != want {
			t.Errorf("%q: %v, want %v", in, got, want)
		}
	}
}

// A guard whose command could not start ends at once; on a loaded machine
// it has ended, and OnExit has read its report, before the owner asks for
// the first line. First must still say "notrun", or the owner takes a
// command that never ran for a started one.
func TestWatchFirstAfterOnExit(t *testing.T) {
	for _, report := range []string{"notrun fork/exec /x: no such file or directory\n", StartedLine + "exit 3\n"} {
		w := &Watch{r: bufio.NewReader(strings.NewReader(report)), grace: time.Millisecond}
		w.OnExit(0) // reported: no group is killed
		want, _, found := strings.Cut(report, "\n")
		if found {
			want += "\n"
		}
		if got := w.First(); got != want {
			t.Errorf("report %q: First after OnExit = %q, want %q", report, got, want)
		}
		if got := w.Reported; got != reported(report) {
			t.Errorf("report %q: Reported %v", report, got)
		}
	}
}
