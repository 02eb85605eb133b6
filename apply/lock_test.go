package apply

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/resource"
)

// A destination whose lock another holder has: a pass waits
// -dest-lock-timeout and fails naming the holder's PID, writing nothing; a
// -noop pass takes no lock; stale-stage cleanup leaves that destination's
// stage files alone. Once free, a pass runs and releases it.
func TestDestLockOneWriterPerDestination(t *testing.T) {
	f := newFixture(t, "")
	held, err := tryLock(f.lockPath())
	if err != nil || held == nil {
		t.Fatalf("tryLock = %v, %v", held, err)
	}
	f.s.DestLockTimeout = 30 * time.Millisecond
	r := f.load()
	_, err = r.Process(context.Background(), f.store)
	var le *LockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() || !strings.Contains(err.Error(), fmt.Sprintf("PID %d", os.Getpid())) || !strings.Contains(err.Error(), "-dest-lock-timeout") {
		t.Fatalf("pass under another's lock: %v; want a LockedError naming PID %d", err, os.Getpid())
	}
	if _, err := os.Stat(f.dest); !os.IsNotExist(err) {
		t.Errorf("dest written under another's lock: %v", err)
	}

	stage := filepath.Join(filepath.Dir(f.dest), ".app.conf.0123456789ab")
	if err := os.WriteFile(stage, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if removed, errs := RemoveStaleStageFiles([]*resource.Resource{r.Resource}, f.s.LockDir); len(removed) != 0 || len(errs) != 0 {
		t.Errorf("cleanup under another's lock removed %v (%v)", removed, errs)
	}

	f.s.Noop = true
	if res, err := r.Process(context.Background(), f.store); err != nil || !res.Changed {
		t.Errorf("-noop pass under another's lock: %+v, %v", res, err)
	}
	f.s.Noop = false

	held.Close()
	if removed, _ := RemoveStaleStageFiles([]*resource.Resource{r.Resource}, f.s.LockDir); len(removed) != 1 {
		t.Errorf("cleanup of a free destination removed %v, want the stage file", removed)
	}
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if l, err := tryLock(f.lockPath()); l == nil || err != nil {
		t.Errorf("the lock is still held after the pass: %v", err)
	} else {
		l.Close()
	}
}

// A pass waiting for a destination's lock gives up when confd stops (the
// first SIGTERM closes Settings.Stop), however long -dest-lock-timeout is.
func TestDestLockWaitEndsWhenConfdStops(t *testing.T) {
	f := newFixture(t, "")
	held, err := tryLock(f.lockPath())
	if err != nil || held == nil {
		t.Fatalf("tryLock = %v, %v", held, err)
	}
	defer held.Close()
	stop := make(chan struct{})
	f.s.Stop, f.s.DestLockTimeout = stop, time.Hour
	r := f.load()
	done := make(chan error)
	go func() {
		_, err := r.Process(context.Background(), f.store)
		done <- err
	}()
	close(stop)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "confd is stopping") {
		t.Errorf("pass waiting for the lock after stop: %v", err)
	}
}

// BenchmarkLockUnlock is a free destination lock's cost, which every pass
// that writes pays (removing the file on release made it ~1 ms on ext4).
func BenchmarkLockUnlock(b *testing.B) {
	dest := filepath.Join(b.TempDir(), "d")
	lockDir := filepath.Join(b.TempDir(), "locks")
	for i := 0; i < b.N; i++ {
		l, err := lockDest(context.Background(), lockDir, dest, time.Second, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		l.Close()
	}
}

// lockPath is the fixture's destination's lock.
func (f *fixture) lockPath() string {
	f.t.Helper()
	p, err := lockPath(f.s.LockDir, f.dest)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// A pass leaves nothing beside its destination (issue 33: a directory that
// Puppet purges stays as confd 0.16 left it): the lock is in the lock
// directory, made 0700, one file named after the destination.
func TestDestLockNothingBesideTheDestination(t *testing.T) {
	f := newFixture(t, "")
	if _, err := f.load().Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if names := dirNames(t, filepath.Dir(f.dest)); len(names) != 1 || names[0] != "app.conf" {
		t.Errorf("beside the destination after a pass: %v, want only app.conf", names)
	}
	if names := dirNames(t, f.s.LockDir); len(names) != 1 || !strings.HasSuffix(names[0], "-app.conf.lock") {
		t.Errorf("lock directory holds %v, want one <hash>-app.conf.lock", names)
	}
	if fi, err := os.Stat(f.s.LockDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("lock directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
}

// Two confds that name one destination differently (another confdir, a
// symlinked directory, a relative path) share its lock; two destinations
// with one base name do not.
func TestDestLockKeyedByTheDestinationsPath(t *testing.T) {
	locks := filepath.Join(t.TempDir(), "locks")
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, filepath.Join(real, "a.conf"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := lockPath(locks, filepath.Join(real, "a.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dest := range []string{filepath.Join(link, "a.conf"), rel, real + "//./a.conf"} {
		if got, err := lockPath(locks, dest); got != want || err != nil {
			t.Errorf("lockPath(%s) = %s, %v; want %s", dest, got, err, want)
		}
	}
	if other, _ := lockPath(locks, filepath.Join(t.TempDir(), "a.conf")); other == want {
		t.Errorf("two destinations share the lock %s", want)
	}
}

// A lock directory that cannot be used fails the pass, naming the
// directory and -lock-dir, and writes nothing: confd never falls back to
// an unlocked pass or to a lock beside the destination.
func TestDestLockUnusableLockDirFailsThePass(t *testing.T) {
	for name, prepare := range map[string]func(dir string) error{
		"a symlink": func(dir string) error { return os.Symlink(t.TempDir(), dir) },
		"writable by others": func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		},
		"a file": func(dir string) error { return os.WriteFile(dir, nil, 0o600) },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, "")
			f.s.LockDir = filepath.Join(t.TempDir(), "locks")
			if err := prepare(f.s.LockDir); err != nil {
				t.Fatal(err)
			}
			_, err := f.load().Process(context.Background(), f.store)
			if err == nil || !strings.Contains(err.Error(), f.s.LockDir) || !strings.Contains(err.Error(), "-lock-dir") {
				t.Fatalf("pass with lock directory %s: %v; want an error naming it and -lock-dir", name, err)
			}
			if names := dirNames(t, filepath.Dir(f.dest)); len(names) != 0 {
				t.Errorf("written without the lock: %v", names)
			}
		})
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
