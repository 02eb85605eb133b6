package restart

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The trust gate (BeforeQueue) runs before any lock is opened and its code
// ends the run; the trust record (Locked's function) is taken under the lock
// before the command and written only after a successful attempt.
func TestTrustHooks(t *testing.T) {
	run := func(t *testing.T, before Code, gateErr error) (code Code, f *fixture, order []string) {
		t.Helper()
		f = &fixture{sess: newSession(), gate: &fakeGate{wait: func(context.Context, int) error { return gateErr }}, holds: &fakeHolds{},
			force: make(chan struct{})}
		f.runner = &fakeRunner{onStart: func(n int, p *fakeProc) { p.finish(nil) }}
		f.locker = &fakeLocker{sess: f.sess}
		cfg := Config{Argv: []string{"restart"}, Attempts: 1, LockTimeout: time.Minute, Host: "m1", LockName: "lock",
			BeforeQueue: func(context.Context) Code { order = append(order, "gate"); return before },
			Locked: func(_ context.Context, key string) func(context.Context) {
				order = append(order, "snapshot:"+key)
				return func(context.Context) { order = append(order, "record") }
			}}
		code = New(cfg, f.locker, f.runner, f.gate, f.holds).Run(context.Background(), f.force)
		return code, f, order
	}
	t.Run("gate refuses", func(t *testing.T) {
		code, f, order := run(t, LockTimeout, nil)
		if code != LockTimeout || f.locker.opened != 0 || len(f.runner.procs) != 0 || len(order) != 1 {
			t.Fatalf("code %d, opened %d, starts %d, order %v", code, f.locker.opened, len(f.runner.procs), order)
		}
	})
	t.Run("success records", func(t *testing.T) {
		code, _, order := run(t, OK, nil)
		if code != OK || len(order) != 3 || order[1] != "snapshot:lock/1" || order[2] != "record" {
			t.Fatalf("code %d, order %v, want gate, snapshot, record", code, order)
		}
	})
	t.Run("failed gate records nothing", func(t *testing.T) {
		code, _, order := run(t, OK, &GateError{Err: errors.New("not ready")})
		if code != Unhealthy || len(order) != 2 {
			t.Fatalf("code %d, order %v, want no record", code, order)
		}
	})
}
