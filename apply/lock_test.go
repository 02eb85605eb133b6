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
	held, err := tryLock(lockPath(f.dest))
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
	if removed, errs := RemoveStaleStageFiles([]*resource.Resource{r.Resource}); len(removed) != 0 || len(errs) != 0 {
		t.Errorf("cleanup under another's lock removed %v (%v)", removed, errs)
	}

	f.s.Noop = true
	if res, err := r.Process(context.Background(), f.store); err != nil || !res.Changed {
		t.Errorf("-noop pass under another's lock: %+v, %v", res, err)
	}
	f.s.Noop = false

	held.unlock()
	if removed, _ := RemoveStaleStageFiles([]*resource.Resource{r.Resource}); len(removed) != 1 {
		t.Errorf("cleanup of a free destination removed %v, want the stage file", removed)
	}
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if l, err := tryLock(lockPath(f.dest)); l == nil || err != nil {
		t.Errorf("the lock is still held after the pass: %v", err)
	} else {
		l.unlock()
	}
}

// A pass waiting for a destination's lock gives up when confd stops (the
// first SIGTERM closes Settings.Stop), however long -dest-lock-timeout is.
func TestDestLockWaitEndsWhenConfdStops(t *testing.T) {
	f := newFixture(t, "")
	held, err := tryLock(lockPath(f.dest))
	if err != nil || held == nil {
		t.Fatalf("tryLock = %v, %v", held, err)
	}
	defer held.unlock()
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
	for i := 0; i < b.N; i++ {
		l, err := lockDest(context.Background(), dest, time.Second, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		l.unlock()
	}
}
