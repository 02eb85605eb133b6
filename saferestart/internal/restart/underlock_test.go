package restart

import (
	"context"
	"testing"
	"time"
)

// UnderLock runs with the lock held and the hold checked; a code other
// than OK releases the lock and ends the run: no command, no hold.
func TestUnderLock(t *testing.T) {
	for _, code := range []Code{OK, LockTimeout} {
		f := &fixture{sess: newSession(), gate: &fakeGate{wait: ready}, holds: &fakeHolds{}, force: make(chan struct{})}
		f.runner = &fakeRunner{onStart: ok}
		f.locker = &fakeLocker{sess: f.sess}
		var order []string
		cfg := Config{Argv: []string{"restart"}, Attempts: 1, LockTimeout: time.Minute, Host: "m1", LockName: "lock",
			BeforeQueue: func(context.Context) Code { order = append(order, "before"); return OK },
			UnderLock: func(context.Context) Code {
				order = append(order, "under")
				if f.locker.opened != 1 || f.holds.gets != 2 {
					t.Errorf("UnderLock ran with %d sessions opened and %d hold reads, want 1 and 2", f.locker.opened, f.holds.gets)
				}
				return code
			}}
		got := New(cfg, f.locker, f.runner, f.gate, f.holds).Run(context.Background(), f.force)
		if got != code {
			t.Errorf("UnderLock %d: run exited %d", code, got)
		}
		wantStarts := 0
		if code == OK {
			wantStarts = 1
		}
		if len(f.runner.procs) != wantStarts || !f.sess.released || len(f.holds.adds) != 0 || len(order) != 2 {
			t.Errorf("UnderLock %d: %d starts (want %d), released %v, %d holds, order %v", code, len(f.runner.procs), wantStarts, f.sess.released, len(f.holds.adds), order)
		}
	}
}
