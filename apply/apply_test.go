package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/template"
)

// faultWriter is the real writer with faults injected at chosen steps.
type faultWriter struct {
	FileWriter
	afterRename error // Replace renames, then fails as a directory fsync would
	markErr     error
}

func (w faultWriter) Replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int) error {
	if w.afterRename == nil {
		return w.FileWriter.Replace(stage, dest, content, mode, uid, gid)
	}
	if err := os.Rename(stage, dest); err != nil {
		return err
	}
	return &atomicfile.NotDurableError{Err: w.afterRename}
}

func (w faultWriter) MarkOwed(dest string, contents ...template.Text) error {
	if w.markErr != nil {
		return w.markErr
	}
	return w.FileWriter.MarkOwed(dest, contents...)
}

// A failed directory fsync after a successful rename: the reload is owed,
// the error says it is retried on the next run, and the next run (a fresh
// load, as the next -onetime) runs it exactly once.
func TestReloadOwedAfterFsyncFailureRunsOnNextRun(t *testing.T) {
	f := newFixture(t, "")
	f.s.Writer = faultWriter{afterRename: fmt.Errorf("fsync directory %s: %w", filepath.Dir(f.dest), syscall.EIO)}
	r := f.load()
	r.ReloadCmd = "echo reload >> " + f.marks
	first, err := r.Process(context.Background(), f.store)
	if err == nil || !strings.Contains(err.Error(), "reload_cmd is owed and will be retried on the next run") || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("first run error = %v", err)
	}
	if first.Replaced.IsZero() {
		t.Error("the file was replaced (not durably), but Result.Replaced is zero")
	}
	if got, _ := os.ReadFile(f.dest); string(got) != "name=one\n" {
		t.Fatalf("dest = %q", got)
	}
	f.s.Writer = nil
	next := f.load()
	next.ReloadCmd = "echo reload >> " + f.marks
	res, err := next.Process(context.Background(), f.store)
	if err != nil || res.Changed || !res.Reloaded {
		t.Fatalf("next run = %+v, %v", res, err)
	}
	if res, err := f.load().Process(context.Background(), f.store); err != nil || res.Reloaded {
		t.Fatalf("third run = %+v, %v", res, err)
	}
	if f.marksRead() != "reload\n" {
		t.Errorf("reloads = %q, want exactly one", f.marksRead())
	}
	if _, err := os.Stat(owedPath(f.dest)); !os.IsNotExist(err) {
		t.Errorf("owed record left after the reload succeeded: %v", err)
	}
}

// If the owed reload cannot be recorded, the live file is not replaced.
func TestUnrecordableReloadLeavesLiveFile(t *testing.T) {
	f := newFixture(t, "")
	if err := os.WriteFile(f.dest, []byte("live\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	f.s.Writer = faultWriter{markErr: fmt.Errorf("record owed reload: %w", syscall.ENOSPC)}
	r := f.load()
	r.ReloadCmd = "echo reload >> " + f.marks
	_, err := r.Process(context.Background(), f.store)
	if err == nil || !strings.Contains(err.Error(), f.dest+" left unchanged") {
		t.Fatalf("error = %v", err)
	}
	if got, _ := os.ReadFile(f.dest); string(got) != "live\n" || f.marksRead() != "" || len(f.stageFiles()) != 0 {
		t.Errorf("dest %q, marks %q, stage files %v", got, f.marksRead(), f.stageFiles())
	}
}

// A record whose content never went live (crash between record and rename)
// owes nothing once the live file is in sync.
func TestStaleOwedRecordIsDropped(t *testing.T) {
	f := newFixture(t, "")
	if err := os.WriteFile(f.dest, []byte("name=one\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := (FileWriter{}).MarkOwed(f.dest, template.TextOf([]byte("name=never-installed\n"))); err != nil {
		t.Fatal(err)
	}
	r := f.load()
	r.ReloadCmd = "echo reload >> " + f.marks
	if res, err := r.Process(context.Background(), f.store); err != nil || res.Reloaded {
		t.Fatalf("pass = %+v, %v", res, err)
	}
	if _, err := os.Stat(owedPath(f.dest)); !os.IsNotExist(err) || f.marksRead() != "" {
		t.Errorf("stale record kept (%v) or reload ran (%q)", err, f.marksRead())
	}
}

// An owed reload is carried over an update that fails to go live, and one
// reload covers both when the update succeeds.
func TestOwedReloadSurvivesFailedUpdate(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	r.ReloadCmd = "exit 1"
	if _, err := r.Process(context.Background(), f.store); err == nil {
		t.Fatal("reload failure not reported")
	}
	f.store.kvs["/app/name"] = "two"
	r.CheckCmd = "exit 1"
	if _, err := r.Process(context.Background(), f.store); err == nil {
		t.Fatal("check failure not reported")
	}
	r.CheckCmd, r.ReloadCmd = "", "echo reload >> "+f.marks
	f.store.kvs["/app/name"] = "one"
	if res, err := r.Process(context.Background(), f.store); err != nil || !res.Reloaded || res.Changed {
		t.Fatalf("retry = %+v, %v", res, err)
	}
	f.store.kvs["/app/name"] = "three"
	r.ReloadCmd = "exit 1"
	if _, err := r.Process(context.Background(), f.store); err == nil {
		t.Fatal("reload failure not reported")
	}
	// -sync-only writes "four" without reloading, but keeps the debt.
	f.s.SyncOnly = true
	f.store.kvs["/app/name"] = "four"
	if res, err := r.Process(context.Background(), f.store); err != nil || res.Reloaded || !res.Changed {
		t.Fatalf("sync-only = %+v, %v", res, err)
	}
	f.s.SyncOnly = false
	r.ReloadCmd = "echo reload >> " + f.marks
	if res, err := r.Process(context.Background(), f.store); err != nil || !res.Reloaded {
		t.Fatalf("after sync-only = %+v, %v", res, err)
	}
	if f.marksRead() != "reload\nreload\n" {
		t.Errorf("reloads = %q", f.marksRead())
	}
}

func TestNoopReportsOwedReloadWithoutRunningIt(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	r.ReloadCmd = "exit 1"
	_, _ = r.Process(context.Background(), f.store)
	hook := test.NewLocal(f.s.Log.(*logrus.Logger))
	f.s.Noop = true
	r.ReloadCmd = "echo reload >> " + f.marks
	if res, err := r.Process(context.Background(), f.store); err != nil || res.Reloaded {
		t.Fatalf("noop = %+v, %v", res, err)
	}
	if f.marksRead() != "" || !logged(hook, logrus.WarnLevel, "owed since an earlier update, will not be run") {
		t.Errorf("noop ran the reload (%q) or did not say it is owed", f.marksRead())
	}
	f.s.Noop = false
	if res, err := r.Process(context.Background(), f.store); err != nil || !res.Reloaded {
		t.Fatalf("after noop = %+v, %v", res, err)
	}
}

// A reload_cmd that starts a daemon holding its stdout succeeded: no
// error, no retry, promptly.
func TestReloadBackgroundingChildIsSuccess(t *testing.T) {
	f := newFixture(t, "")
	pidFile := filepath.Join(t.TempDir(), "pid")
	r := f.load()
	r.ReloadCmd = "sleep 300 & echo $! > " + pidFile + "; echo reload >> " + f.marks
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	res, err := r.Process(context.Background(), f.store)
	if err != nil || !res.Reloaded {
		t.Fatalf("pass = %+v, %v", res, err)
	}
	if res, err := r.Process(context.Background(), f.store); err != nil || res.Reloaded {
		t.Fatalf("second pass retried: %+v, %v", res, err)
	}
	if f.marksRead() != "reload\n" {
		t.Errorf("reloads = %q", f.marksRead())
	}
}

// Output goes to the log one record per line as it arrives, quoted only
// when not printable: reload at info, check at debug; the tail of long
// output is in the error.
func TestCommandOutputLoggedPerLineAndTailKept(t *testing.T) {
	f := newFixture(t, "")
	hook := test.NewLocal(f.s.Log.(*logrus.Logger))
	r := f.load()
	r.CheckCmd = `printf 'c1\nc2\n'`
	r.ReloadCmd = `printf 'first\nsecond \033[31mred\n'`
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, " output: ") {
			got = append(got, e.Level.String()+" "+e.Message)
		}
	}
	want := []string{`debug check_cmd output: c1`, `debug check_cmd output: c2`,
		`info reload_cmd output: first`, `info reload_cmd output: "second \x1b[31mred"`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("log records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	f.store.kvs["/app/name"] = "two"
	r.CheckCmd = "seq 1 20000; echo 'the real error' >&2; exit 1"
	hook.Reset()
	_, err := r.Process(context.Background(), f.store)
	if err == nil || !strings.HasSuffix(err.Error(), "19998 | 19999 | 20000 | the real error") {
		t.Fatalf("error = %.300v", err)
	}
	// The log holds the first lines as they came, then the last ones.
	var recs []string
	for _, e := range hook.AllEntries() {
		if strings.HasPrefix(e.Message, "check_cmd") {
			recs = append(recs, e.Message)
		}
	}
	if len(recs) != maxLoggedLines+1+20 || recs[0] != `check_cmd output: 1` || recs[maxLoggedLines-1] != `check_cmd output: 1000` ||
		recs[maxLoggedLines] != "check_cmd: 18981 more output lines not logged; the last 20 follow" || recs[len(recs)-1] != `check_cmd output: the real error` {
		t.Errorf("%d records: first %q, after the cut %q, last %q", len(recs), recs[0], recs[min(maxLoggedLines, len(recs)-1)], recs[len(recs)-1])
	}
}

// At its timeout a command gets SIGTERM and the grace to act on it.
func TestCommandTimeoutTermsFirst(t *testing.T) {
	f := newFixture(t, "")
	f.s.CommandGrace = time.Minute
	term := filepath.Join(t.TempDir(), "term")
	r := f.load()
	r.ReloadTimeout = time.Second // ample time for the shell to set its trap
	r.ReloadCmd = "trap 'sleep 0.3; echo clean > " + term + "; exit 3' TERM; while :; do sleep 1; done"
	_, err := r.Process(context.Background(), f.store)
	var ce *CommandError
	if !errors.As(err, &ce) || !ce.Result.TimedOut || ce.Result.Killed || ce.Result.ExitCode != 3 {
		t.Fatalf("error = %v", err)
	}
	if b, _ := os.ReadFile(term); string(b) != "clean\n" {
		t.Errorf("the TERM handler did not complete: %q", b)
	}
}

// A stopping confd (cancelled context) gives a running reload SIGTERM and
// its grace, and the reload stays owed.
func TestStopDuringReloadTermsAndKeepsItOwed(t *testing.T) {
	f := newFixture(t, "")
	f.s.CommandGrace = time.Minute
	dir := t.TempDir()
	started, term := filepath.Join(dir, "started"), filepath.Join(dir, "term")
	if err := syscall.Mkfifo(started, 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.load()
	r.ReloadCmd = "trap 'sleep 0.3; echo clean > " + term + "; exit 1' TERM; echo go > " + started + "; while :; do sleep 1; done"
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = os.ReadFile(started) // returns once the reload is running
		cancel()
	}()
	_, err := r.Process(ctx, f.store)
	var ce *CommandError
	if !errors.As(err, &ce) || !ce.Result.Terminated || ce.Result.Killed || !strings.Contains(err.Error(), "retried on the next run") {
		t.Fatalf("error = %v", err)
	}
	if b, _ := os.ReadFile(term); string(b) != "clean\n" {
		t.Errorf("the TERM handler did not complete: %q", b)
	}
	next := f.load()
	next.ReloadCmd = "echo reload >> " + f.marks
	if res, err := next.Process(context.Background(), f.store); err != nil || !res.Reloaded || f.marksRead() != "reload\n" {
		t.Fatalf("next run = %+v, %v, reloads %q", res, err, f.marksRead())
	}
}

// A refused stage file that is kept never becomes readable by others and
// is one file per resource however often the check fails.
func TestKeptStageFileIsPrivateAndSingle(t *testing.T) {
	f := newFixture(t, "")
	f.s.KeepStageFile = true
	r := f.load()
	r.Mode = 0 // a new file: 0644 by default
	r.CheckCmd = "exit 1"
	for i := 0; i < 3; i++ {
		f.store.kvs["/app/name"] = fmt.Sprint("v", i)
		if _, err := r.Process(context.Background(), f.store); err == nil {
			t.Fatal("check passed")
		}
	}
	kept := f.stageFiles()
	if len(kept) != 1 {
		t.Fatalf("kept stage files %v, want one", kept)
	}
	fi, err := os.Stat(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("kept stage file mode %#o, want 0640", fi.Mode().Perm())
	}
	if b, _ := os.ReadFile(kept[0]); string(b) != "name=v2\n" {
		t.Errorf("kept stage file holds %q, want the last refused content", b)
	}
	r.CheckCmd = ""
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if left := f.stageFiles(); len(left) != 0 {
		t.Errorf("refused file kept after a later update went live: %v", left)
	}
}

func logged(h *test.Hook, level logrus.Level, substr string) bool {
	for _, e := range h.AllEntries() {
		if e.Level == level && strings.Contains(e.Message, substr) {
			return true
		}
	}
	return false
}

// A reload that finishes its work in the grace after confd's SIGTERM and
// exits 0 is done: it is not run a second time.
func TestStopDuringReloadThatCompletesIsNotRepeated(t *testing.T) {
	f := newFixture(t, "")
	f.s.CommandGrace = time.Minute
	started := filepath.Join(t.TempDir(), "started")
	if err := syscall.Mkfifo(started, 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.load()
	r.ReloadCmd = "trap 'echo reload >> " + f.marks + "; exit 0' TERM; echo go > " + started + "; while :; do sleep 1; done"
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = os.ReadFile(started)
		cancel()
	}()
	if res, err := r.Process(ctx, f.store); err != nil || !res.Reloaded {
		t.Fatalf("stopped pass = %+v, %v", res, err)
	}
	next := f.load()
	next.ReloadCmd = "echo again >> " + f.marks
	if res, err := next.Process(context.Background(), f.store); err != nil || res.Reloaded || f.marksRead() != "reload\n" {
		t.Fatalf("next run = %+v, %v, reloads %q", res, err, f.marksRead())
	}
}

// The daemon's first SIGTERM (Settings.Stop) lets a running check_cmd
// finish but starts no reload_cmd after it: the file goes live, its reload
// stays owed and runs on the next run.
func TestStopStartsNoReloadAfterCheck(t *testing.T) {
	f := newFixture(t, "")
	stop := make(chan struct{})
	f.s.Stop = stop
	dir := t.TempDir()
	started, release := filepath.Join(dir, "started"), filepath.Join(dir, "release")
	for _, p := range []string{started, release} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := f.load()
	r.CheckCmd = "echo go > " + started + "; cat " + release + " >/dev/null"
	r.ReloadCmd = "echo reload >> " + f.marks
	go func() {
		_, _ = os.ReadFile(started) // the check is running
		close(stop)
		_ = os.WriteFile(release, []byte("x"), 0o600)
	}()
	_, err := r.Process(context.Background(), f.store)
	if err == nil || !strings.Contains(err.Error(), "confd is stopping: its reload_cmd was not started") || f.marksRead() != "" {
		t.Fatalf("error = %v, reloads %q", err, f.marksRead())
	}
	f.s.Stop = nil
	next := f.load()
	next.ReloadCmd = "echo reload >> " + f.marks
	if res, err := next.Process(context.Background(), f.store); err != nil || !res.Reloaded || f.marksRead() != "reload\n" {
		t.Fatalf("next run = %+v, %v, reloads %q", res, err, f.marksRead())
	}
	// Once stopping, not even a check starts.
	f.s.Stop = stop
	f.store.kvs["/app/name"] = "other"
	again := f.load()
	again.CheckCmd = "echo check >> " + f.marks
	if _, err := again.Process(context.Background(), f.store); err == nil || !strings.Contains(err.Error(), "check_cmd was not started") || f.marksRead() != "reload\n" {
		t.Fatalf("check after stop: %v, marks %q", err, f.marksRead())
	}
}
