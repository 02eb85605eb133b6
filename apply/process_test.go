package apply

import (
	"bytes"
	"context"
	"errors"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/keysync/confd/resource"
	"github.com/keysync/confd/template"
)

// fakeStore serves a fixed snapshot; unit tests need no etcd.
type fakeStore struct {
	kvs map[string]string
	rev int64
}

func (f *fakeStore) GetValues(_ context.Context, keys []string) (map[string]string, int64, error) {
	out := map[string]string{}
	for k, v := range f.kvs {
		for _, want := range keys {
			if k == want || strings.HasPrefix(k, strings.TrimSuffix(want, "/")+"/") {
				out[k] = v
			}
		}
	}
	return out, f.rev, nil
}

type fixture struct {
	t     testing.TB
	dir   string
	dest  string
	marks string // every command run appends a line here
	s     *Settings
	store *fakeStore
}

func newFixture(t testing.TB, extra string) *fixture {
	t.Helper()
	f := &fixture{t: t, store: &fakeStore{kvs: map[string]string{"/app/name": "one"}, rev: 5}}
	out := t.TempDir()
	f.dest = filepath.Join(out, "app.conf")
	f.marks = filepath.Join(out, "marks")
	toml := "[template]\nsrc = \"app.tmpl\"\ndest = \"" + f.dest + "\"\nkeys = [\"/name\"]\nprefix = \"/app\"\nmode = \"0640\"\n" + extra
	f.dir = confDir(t, map[string]string{"app.toml": toml}, map[string]string{"app.tmpl": "name={{getv \"/name\"}}\n"})
	f.s, _ = testSettings(f.dir)
	return f
}

func (f *fixture) load() *File {
	f.t.Helper()
	r, err := resource.Load(filepath.Join(f.dir, "conf.d", "app.toml"), &f.s.Settings)
	if err != nil {
		f.t.Fatal(err)
	}
	return &File{Resource: r, s: f.s}
}

// confDir lays out confdir/conf.d and confdir/templates with the given files.
func confDir(t testing.TB, resources, templates map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for sub, files := range map[string]map[string]string{"conf.d": resources, "templates": templates} {
		for name, body := range files {
			p := filepath.Join(dir, sub, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

func testSettings(dir string) (*Settings, *test.Hook) {
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.DebugLevel)
	// The locks in the test's own directory, not the host's /run/confd.
	return &Settings{Settings: resource.Settings{ConfDir: dir, Log: l}, Renderer: &template.Renderer{}, LockDir: filepath.Join(dir, "locks")}, hook
}

func (f *fixture) marksRead() string {
	b, _ := os.ReadFile(f.marks)
	return string(b)
}

// stageFiles are the dot files beside dest.
func (f *fixture) stageFiles() []string {
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(f.dest), ".app.conf.*"))
	return m
}

func TestProcessWritesWithModeAndSkipsWhenInSync(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	r.CheckCmd = "echo check >> " + f.marks
	r.ReloadCmd = "echo reload >> " + f.marks
	res, err := r.Process(context.Background(), f.store)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Changed || !res.Reloaded || res.Revision != 5 {
		t.Errorf("result = %+v", res)
	}
	got, _ := os.ReadFile(f.dest)
	if string(got) != "name=one\n" {
		t.Errorf("dest = %q", got)
	}
	fi, _ := os.Stat(f.dest)
	if fi.Mode().Perm() != 0o640 {
		t.Errorf("mode = %#o", fi.Mode().Perm())
	}
	if f.marksRead() != "check\nreload\n" {
		t.Errorf("commands = %q", f.marksRead())
	}
	ino := fi.Sys().(*syscall.Stat_t).Ino

	// Same snapshot again: no write, no command.
	res, err = r.Process(context.Background(), f.store)
	if err != nil || res.Changed || res.Reloaded {
		t.Fatalf("second pass = %+v, %v", res, err)
	}
	fi, _ = os.Stat(f.dest)
	if fi.Sys().(*syscall.Stat_t).Ino != ino {
		t.Error("dest was replaced although nothing changed")
	}
	if f.marksRead() != "check\nreload\n" {
		t.Errorf("commands ran again: %q", f.marksRead())
	}

	// A mode change alone is a change.
	if err := os.Chmod(f.dest, 0o600); err != nil {
		t.Fatal(err)
	}
	if res, err = r.Process(context.Background(), f.store); err != nil || !res.Changed {
		t.Fatalf("mode drift pass = %+v, %v", res, err)
	}
	if fi, _ = os.Stat(f.dest); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode after repair = %#o", fi.Mode().Perm())
	}
	if len(f.stageFiles()) != 0 {
		t.Errorf("stage files left: %v", f.stageFiles())
	}
}

func TestCheckSeesStageFileWithFinalModeAndContent(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	// The check records the stage file's mode and content as it sees them.
	r.CheckCmd = "stat -c %a {{.src}} >> " + f.marks + " && cat {{.src}} >> " + f.marks + " && echo {{.dest}} >> " + f.marks
	old := syscall.Umask(0o077) // a strict umask must not change the final mode
	defer syscall.Umask(old)
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	want := "640\nname=one\n" + f.dest + "\n"
	if f.marksRead() != want {
		t.Errorf("check saw %q, want %q", f.marksRead(), want)
	}
}

func TestFailedCheckLeavesLiveFileAndNoStage(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run("keep="+strconv.FormatBool(keep), func(t *testing.T) {
			f := newFixture(t, "")
			f.s.KeepStageFile = keep
			if err := os.WriteFile(f.dest, []byte("live\n"), 0o640); err != nil {
				t.Fatal(err)
			}
			r := f.load()
			r.CheckCmd = "echo bad bundle >&2; exit 3"
			r.ReloadCmd = "echo reload >> " + f.marks
			_, err := r.Process(context.Background(), f.store)
			var ce *CommandError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "bad bundle") || !strings.Contains(err.Error(), "app.toml") {
				t.Fatalf("error = %v", err)
			}
			if got, _ := os.ReadFile(f.dest); string(got) != "live\n" {
				t.Errorf("live file changed to %q", got)
			}
			if f.marksRead() != "" {
				t.Errorf("reload ran after failed check: %q", f.marksRead())
			}
			if n := len(f.stageFiles()); (n == 1) != keep || n > 1 {
				t.Errorf("stage files = %v, keep-stage-file %v", f.stageFiles(), keep)
			}
		})
	}
}

func TestFailedRenderWritesNothing(t *testing.T) {
	f := newFixture(t, "")
	f.store.kvs = map[string]string{}
	r := f.load()
	_, err := r.Process(context.Background(), f.store)
	if err == nil || !strings.Contains(err.Error(), "app.tmpl:1") || !strings.Contains(err.Error(), "/name") {
		t.Fatalf("error = %v, want template name, line and key", err)
	}
	if _, err := os.Stat(f.dest); !os.IsNotExist(err) {
		t.Errorf("dest exists after failed render: %v", err)
	}
	if len(f.stageFiles()) != 0 {
		t.Errorf("stage files left: %v", f.stageFiles())
	}
}

func TestFailedReloadIsRetriedOnNextPass(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	flag := filepath.Join(t.TempDir(), "reload-ok")
	r.ReloadCmd = "test -e " + flag + " && echo reload >> " + f.marks
	if _, err := r.Process(context.Background(), f.store); err == nil || !strings.Contains(err.Error(), "retried on the next run") {
		t.Fatalf("first pass error = %v", err)
	}
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := r.Process(context.Background(), f.store)
	if err != nil || res.Changed || !res.Reloaded {
		t.Fatalf("retry pass = %+v, %v", res, err)
	}
	if res, _ = r.Process(context.Background(), f.store); res.Reloaded {
		t.Error("reload ran a third time")
	}
	if f.marksRead() != "reload\n" {
		t.Errorf("reloads = %q", f.marksRead())
	}
}

func TestOwedReloadSurvivesReRead(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	r.ReloadCmd = "exit 1"
	if _, err := r.Process(context.Background(), f.store); err == nil {
		t.Fatal("reload_cmd failure not reported")
	}
	fresh := f.load() // conf.d re-read before the next pass, or the next -onetime run
	fresh.ReloadCmd = "echo reload >> " + f.marks
	if res, err := fresh.Process(context.Background(), f.store); err != nil || !res.Reloaded {
		t.Fatalf("re-read resource did not retry the owed reload: %+v, %v", res, err)
	}
}

func TestNoopAndSyncOnly(t *testing.T) {
	f := newFixture(t, "")
	if err := os.WriteFile(f.dest, []byte("name=zero\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var diff bytes.Buffer
	f.s.Noop, f.s.DiffOut, f.s.NoopShowSecrets = true, &diff, true
	r := f.load()
	r.CheckCmd, r.ReloadCmd = "echo check >> "+f.marks, "echo reload >> "+f.marks
	res, err := r.Process(context.Background(), f.store)
	if err != nil || !res.Changed {
		t.Fatalf("noop = %+v, %v", res, err)
	}
	if got, _ := os.ReadFile(f.dest); string(got) != "name=zero\n" || f.marksRead() != "" || len(f.stageFiles()) != 0 {
		t.Errorf("noop wrote or ran something: dest %q, marks %q, stage %v", got, f.marksRead(), f.stageFiles())
	}
	for _, want := range []string{"-name=zero", "+name=one", "mode 0644 -> 0640", "--- " + f.dest} {
		if !strings.Contains(diff.String(), want) {
			t.Errorf("diff lacks %q:\n%s", want, diff.String())
		}
	}

	f.s.Noop, f.s.SyncOnly = false, true
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(f.dest); string(got) != "name=one\n" || f.marksRead() != "" {
		t.Errorf("sync-only: dest %q, marks %q", got, f.marksRead())
	}
}

func TestCommandTimeoutKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	f := newFixture(t, "")
	f.s.CommandGrace = 100 * time.Millisecond
	r := f.load()
	err := r.runCommand(context.Background(), "check_cmd", "exec env --ignore-signal=TERM sh -c 'sleep 60 & echo $! > "+pidFile+"; wait'", 300*time.Millisecond, nil, t.Logf, f.s.Logger())
	var ce *CommandError
	if !errors.As(err, &ce) || !ce.Result.TimedOut || !ce.Result.Killed || !strings.Contains(err.Error(), "did not finish within 300ms") {
		t.Fatalf("error = %v", err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	// The grandchild (sleep 60, no longer our child) must die of the group
	// kill. SIGKILL is delivered asynchronously, so await its exit through a
	// pidfd, which becomes readable when the process exits.
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return // already gone
	}
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10_000); err != nil || n != 1 {
		t.Errorf("grandchild %d still alive 10 s after the timeout killed its group (poll %d, %v)", pid, n, err)
	}
}

func TestReplaceAcrossDevicesWritesInPlace(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "confd-test")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	defer os.RemoveAll(shm)
	dest := filepath.Join(t.TempDir(), "dest")
	if err := os.WriteFile(dest, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stage := filepath.Join(shm, "stage")
	if err := os.WriteFile(stage, []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(stage, dest); !errors.Is(err, syscall.EXDEV) {
		t.Skipf("rename across /dev/shm and temp dir did not give EXDEV: %v", err)
	}
	s, _ := testSettings(t.TempDir())
	if err := (FileWriter{Log: s.Logger()}).Replace(stage, dest, template.TextOf([]byte("new\n")), 0o644, os.Geteuid(), os.Getegid()); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(dest)
	fi, _ := os.Stat(dest)
	if string(got) != "new\n" || fi.Mode().Perm() != 0o644 {
		t.Errorf("dest = %q mode %#o", got, fi.Mode().Perm())
	}
	// The old content was kept while the write ran, and is gone now.
	for _, p := range []string{previousPath(dest), owedPath(dest)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after a complete in-place write: %v", p, err)
		}
	}
}

func TestModesAppliedExactly(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, mode := range []string{"0600", "0644", "0755", "4755", "2750", "1777"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, "")
			toml := filepath.Join(f.dir, "conf.d", "app.toml")
			b, _ := os.ReadFile(toml)
			if err := os.WriteFile(toml, bytes.Replace(b, []byte(`mode = "0640"`), []byte(`mode = "`+mode+`"`), 1), 0o644); err != nil {
				t.Fatal(err)
			}
			r := f.load()
			if _, err := r.Process(context.Background(), f.store); err != nil {
				t.Fatal(err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(f.dest, &st); err != nil {
				t.Fatal(err)
			}
			want, _ := strconv.ParseUint(mode, 8, 32)
			if got := st.Mode & 0o7777; uint64(got) != want {
				t.Errorf("mode %#o, want %#o", got, want)
			}
			// And the file is then in sync: no rewrite for a special bit.
			if res, err := r.Process(context.Background(), f.store); err != nil || res.Changed {
				t.Errorf("second pass = %+v, %v", res, err)
			}
		})
	}
}

func TestCommandOutputNeverCarriesPrivateKeys(t *testing.T) {
	f := newFixture(t, "")
	f.store.kvs["/app/name"] = "\n-----BEGIN RSA PRIVATE KEY-----\nU0VDUkVUS0VZQllURVM=\n-----END RSA PRIVATE KEY-----"
	r := f.load()
	r.CheckCmd = "cat {{.src}}; exit 1" // a careless check that echoes what it checks
	_, err := r.Process(context.Background(), f.store)
	if err == nil {
		t.Fatal("check passed")
	}
	if strings.Contains(err.Error(), "U0VDUkVUS0VZQllURVM=") || !strings.Contains(err.Error(), "redacted") {
		t.Fatalf("error carries key material or no redaction marker: %v", err)
	}
}

// A destination that is a symlink is replaced by the file, as confd 0.16's
// rename does; what it pointed to is left alone.
func TestReplaceSymlinkDestReplacesTheLink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("target\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "dest")
	if err := os.Symlink(target, dest); err != nil {
		t.Fatal(err)
	}
	s, _ := testSettings(t.TempDir())
	content := template.TextOf([]byte("new\n"))
	stage, err := FileWriter{}.Stage(dest, content, 0o644, os.Geteuid(), os.Getegid())
	if err != nil {
		t.Fatal(err)
	}
	if err := (FileWriter{Log: s.Logger()}).Replace(stage, dest, content, 0o644, os.Geteuid(), os.Getegid()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dest); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("dest after replace: %v, %v; want a regular file", fi, err)
	}
	if got, _ := os.ReadFile(dest); string(got) != "new\n" {
		t.Errorf("dest = %q", got)
	}
	if got, _ := os.ReadFile(target); string(got) != "target\n" {
		t.Errorf("the symlink's target was changed: %q", got)
	}
}

// Result.Replaced says when the destination came to hold the new content,
// and only then: not for a file in sync, nor for one its check refused.
func TestResultSaysWhenTheFileWasReplaced(t *testing.T) {
	f := newFixture(t, "")
	r := f.load()
	ctx := context.Background()
	before := time.Now()
	res, err := r.Process(ctx, f.store)
	after := time.Now()
	if err != nil || !res.Changed {
		t.Fatalf("first pass = %+v, %v", res, err)
	}
	if res.Replaced.Before(before) || res.Replaced.After(after) {
		t.Errorf("Replaced = %v, not within the pass (%v to %v)", res.Replaced, before, after)
	}
	if res, err := r.Process(ctx, f.store); err != nil || !res.Replaced.IsZero() {
		t.Errorf("pass in sync = %+v, %v; want no Replaced", res, err)
	}
	r.CheckCmd = "false"
	f.store.kvs["/app/name"] = "refused"
	if res, err := r.Process(ctx, f.store); err == nil || !res.Replaced.IsZero() {
		t.Errorf("pass refused by its check = %+v, %v; want an error and no Replaced", res, err)
	}
}
