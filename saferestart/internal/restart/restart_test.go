package restart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
)

// fakeSession is a lock session whose loss the test triggers.
type fakeSession struct {
	lease     int64
	mu        sync.Mutex
	lockErr   func(ctx context.Context) error
	done      chan struct{}
	lostOnce  sync.Once
	released  bool
	abandoned bool
}

func newSession() *fakeSession { return &fakeSession{done: make(chan struct{})} }

func (s *fakeSession) lose() { s.lostOnce.Do(func() { close(s.done) }) }
func (s *fakeSession) Lock(ctx context.Context) error {
	if s.lockErr != nil {
		return s.lockErr(ctx)
	}
	return nil
}
func (s *fakeSession) Release(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.released = true
	return nil
}
func (s *fakeSession) Abandon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned = true
}
func (s *fakeSession) Done() <-chan struct{} { return s.done }
func (s *fakeSession) Lost() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}
func (s *fakeSession) Key() string             { return "lock/1" }
func (s *fakeSession) Env() []string           { return []string{"ETCD_LOCK_KEY=lock/1"} }
func (s *fakeSession) Margin() time.Duration   { return 500 * time.Millisecond }
func (s *fakeSession) Lease() clientv3.LeaseID { return clientv3.LeaseID(s.lease) }

type fakeLocker struct {
	sess   *fakeSession
	opened int
}

func (l *fakeLocker) Open(context.Context) (Session, error) { l.opened++; return l.sess, nil }
func (l *fakeLocker) Holder(context.Context) string         { return "someone" }

// fakeProc ends when the test says (finish) or when terminated.
type fakeProc struct {
	done       chan struct{}
	once       sync.Once
	err        error
	terminated time.Duration // grace of the Terminate call, 0 if none
}

func (p *fakeProc) Pid() int              { return 42 }
func (p *fakeProc) Done() <-chan struct{} { return p.done }
func (p *fakeProc) finish(err error)      { p.once.Do(func() { p.err = err; close(p.done) }) }
func (p *fakeProc) Terminate(grace time.Duration) {
	p.terminated = grace
	p.finish(errors.New("terminated"))
}
func (p *fakeProc) Wait() error { <-p.done; return p.err }

type fakeRunner struct {
	procs []*fakeProc
	// onStart plays the command's run n (1-based): it must finish p, or
	// arrange for something to terminate it.
	onStart func(n int, p *fakeProc)
	env     []string
	// startErr, when set, is Start's error on run n (nil: it starts).
	startErr func(n int) error
	// before, when set, runs as Start is called (what must be true before
	// any command starts).
	before func()
}

func (r *fakeRunner) Start(argv, env []string) (Process, error) {
	if r.before != nil {
		r.before()
	}
	if r.startErr != nil {
		if err := r.startErr(len(r.procs) + 1); err != nil {
			return nil, err
		}
	}
	p := &fakeProc{done: make(chan struct{})}
	r.procs = append(r.procs, p)
	r.env = env
	go r.onStart(len(r.procs), p)
	return p, nil
}

type fakeGate struct {
	probeErr error
	wait     func(ctx context.Context, n int) error
	waits    int
}

func (g *fakeGate) Enabled() bool                  { return true }
func (g *fakeGate) Probe(context.Context) error    { return g.probeErr }
func (g *fakeGate) Wait(ctx context.Context) error { g.waits++; return g.wait(ctx, g.waits) }

type fakeHolds struct {
	mu      sync.Mutex
	current *hold.Record
	// before and after the lock: what Get returns on its n-th call
	getSeq   []*hold.Record
	gets     int
	failAdds int // Add fails this many times first (etcd away)
	adds     []hold.Record
	// intent is this host's restart intent, nil once cleared.
	intent  *hold.Intent
	intents int // SetIntent calls
}

func (h *fakeHolds) SetIntent(_ context.Context, in hold.Intent) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.intents++
	h.intent = &in
	return nil
}
func (h *fakeHolds) ClearIntent(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.intent = nil
	return nil
}

func (h *fakeHolds) Key() string { return "lock-hold" }
func (h *fakeHolds) Get(context.Context) (*hold.Record, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gets++
	if h.gets <= len(h.getSeq) {
		return h.getSeq[h.gets-1], nil
	}
	return h.current, nil
}
func (h *fakeHolds) Add(_ context.Context, r hold.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failAdds > 0 {
		h.failAdds--
		return errors.New("etcd unreachable")
	}
	h.adds = append(h.adds, r)
	return nil
}

// fixture is one run's fakes plus the test's handles on signals.
type fixture struct {
	sess       *fakeSession
	locker     *fakeLocker
	runner     *fakeRunner
	gate       *fakeGate
	holds      *fakeHolds
	signal     context.CancelFunc
	force      chan struct{}
	forceOnce  sync.Once
	preflight  func(n int) error
	preflights int
	// retryDelay replaces the 1ms between attempts: an hour makes sure a
	// loss or signal raised as the command ends is seen before a retry.
	retryDelay time.Duration
}

func (f *fixture) forceNow() { f.forceOnce.Do(func() { close(f.force) }) }

func ok(n int, p *fakeProc)            { p.finish(nil) }
func ready(context.Context, int) error { return nil }

func TestRun(t *testing.T) {
	notReady := &GateError{Err: errors.New("kube-apiserver not ready within 1s")}
	type want struct {
		code       Code
		starts     int
		hold       string // substring of the hold reason; "" means no hold
		released   bool
		abandoned  bool
		terminated time.Duration // grace given to the last command, 0: not terminated
		noLock     bool          // no session was opened
	}
	cases := []struct {
		name  string
		setup func(f *fixture)
		want  want
	}{
		{"ready at once", nil, want{code: OK, starts: 1, released: true}},
		{"preflight fails before queueing", func(f *fixture) {
			f.preflight = func(n int) error { return errors.New("sa.pub: line 1: BOM") }
		}, want{code: Preflight, noLock: true}},
		{"gate credentials refused before the restart", func(f *fixture) {
			f.gate.probeErr = errors.New("x509: certificate signed by unknown authority")
		}, want{code: Preflight, noLock: true}},
		{"hold before queueing", func(f *fixture) {
			f.holds.getSeq = []*hold.Record{{Host: "m2", Reason: "maintenance"}}
		}, want{code: Held, noLock: true}},
		{"hold written while waiting", func(f *fixture) {
			f.holds.getSeq = []*hold.Record{nil, {Host: "m2", Reason: "maintenance"}}
		}, want{code: Held, released: true}},
		{"lock timeout", func(f *fixture) {
			f.sess.lockErr = func(ctx context.Context) error { return context.DeadlineExceeded }
		}, want{code: LockTimeout, released: true}},
		{"lock lost while waiting", func(f *fixture) {
			f.sess.lockErr = func(ctx context.Context) error { return fmt.Errorf("waiting: %w", lock.ErrLeaseLost) }
		}, want{code: LeaseLost, abandoned: true}},
		{"signal while waiting", func(f *fixture) {
			f.sess.lockErr = func(ctx context.Context) error { f.signal(); <-ctx.Done(); return ctx.Err() }
		}, want{code: Interrupted, released: true}},
		{"lock lost during the command: terminated within half the margin, hold written", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { f.sess.lose() }
		}, want{code: LeaseLost, starts: 1, hold: "lock lost while the restart command ran", abandoned: true, terminated: 250 * time.Millisecond}},
		{"lock lost during the gate: hold written", func(f *fixture) {
			f.gate.wait = func(ctx context.Context, n int) error { f.sess.lose(); <-ctx.Done(); return ctx.Err() }
		}, want{code: LeaseLost, starts: 1, hold: "lock lost while waiting for the apiserver", abandoned: true}},
		{"lock lost between attempts: hold written", func(f *fixture) {
			f.retryDelay = time.Hour
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(errors.New("exit 1")); f.sess.lose() }
		}, want{code: LeaseLost, starts: 1, hold: "exit 1", abandoned: true}},
		{"lock lost during the gate while etcd is away: hold retried", func(f *fixture) {
			f.holds.failAdds = 1
			f.gate.wait = func(ctx context.Context, n int) error { f.sess.lose(); <-ctx.Done(); return ctx.Err() }
		}, want{code: LeaseLost, starts: 1, hold: "lock lost", abandoned: true}},
		{"signal during the command: it finishes, no gate, hold", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { f.signal(); time.AfterFunc(10*time.Millisecond, func() { p.finish(nil) }) }
			f.gate.wait = func(context.Context, int) error { panic("gate after a signal") }
		}, want{code: Interrupted, starts: 1, hold: "interrupted by a signal", released: true}},
		{"second signal during the command: terminated now", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { f.signal(); f.forceNow() }
		}, want{code: Interrupted, starts: 1, hold: "second signal", released: true, terminated: 5 * time.Second}},
		{"signal during the gate: hold", func(f *fixture) {
			f.gate.wait = func(ctx context.Context, n int) error { f.signal(); <-ctx.Done(); return ctx.Err() }
		}, want{code: Interrupted, starts: 1, hold: "interrupted by a signal while waiting", released: true}},
		{"signal between attempts: hold", func(f *fixture) {
			f.retryDelay = time.Hour
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(errors.New("exit 1")); f.signal() }
		}, want{code: Interrupted, starts: 1, hold: "interrupted", released: true}},
		{"guard died, group confirmed gone: hold, no retry, lock released", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(fmt.Errorf("%w (killed by signal)", ErrGuardDied)) }
		}, want{code: Failed, starts: 1, hold: "group guard died", released: true}},
		{"guard died, group not confirmed gone: hold, lock kept until the lease runs out", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) {
				p.finish(fmt.Errorf("%w: %w (killed by signal)", ErrGroupAlive, ErrGuardDied))
			}
		}, want{code: Failed, starts: 1, hold: "could not be confirmed gone", abandoned: true}},
		{"command fails every attempt", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(errors.New("exit 1")) }
		}, want{code: Failed, starts: 2, hold: "exit 1", released: true}},
		{"command fails once, then works", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) {
				if n == 1 {
					p.finish(errors.New("exit 1"))
				} else {
					p.finish(nil)
				}
			}
		}, want{code: OK, starts: 2, released: true}},
		{"not ready twice", func(f *fixture) {
			f.gate.wait = func(context.Context, int) error { return notReady }
		}, want{code: Unhealthy, starts: 2, hold: "not ready", released: true}},
		{"not ready, then ready", func(f *fixture) {
			f.gate.wait = func(_ context.Context, n int) error {
				if n == 1 {
					return notReady
				}
				return nil
			}
		}, want{code: OK, starts: 2, released: true}},
		{"gate refused after the restart: not retried", func(f *fixture) {
			f.gate.wait = func(context.Context, int) error { return &GateError{Err: errors.New("401"), Final: true} }
		}, want{code: Unhealthy, starts: 1, hold: "401", released: true}},
		{"preflight fails once the lock is held: nothing ran, no hold", func(f *fixture) {
			f.preflight = func(n int) error {
				if n == 2 {
					return errors.New("changed while queued")
				}
				return nil
			}
		}, want{code: Preflight, released: true}},
		{"command cannot start: not retried, nothing ran, no hold", func(f *fixture) {
			f.runner.startErr = func(int) error {
				return fmt.Errorf("%w: systemctl: exec: no such file or directory", ErrNotStarted)
			}
		}, want{code: Preflight, released: true}},
		{"command cannot start on the second attempt: the first ran, hold", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(errors.New("exit 1")) }
			f.runner.startErr = func(n int) error {
				if n == 2 {
					return fmt.Errorf("%w: script removed", ErrNotStarted)
				}
				return nil
			}
		}, want{code: Preflight, starts: 1, hold: "could not start", released: true}},
		{"command reported as not started once it ended: not retried, no hold", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) {
				p.finish(fmt.Errorf("%w: systemctl: no such file or directory", ErrNotStarted))
			}
		}, want{code: Preflight, starts: 1, released: true}},
		{"preflight fails before the second attempt: hold", func(f *fixture) {
			f.runner.onStart = func(n int, p *fakeProc) { p.finish(errors.New("exit 1")) }
			f.preflight = func(n int) error {
				if n == 3 {
					return errors.New("changed between attempts")
				}
				return nil
			}
		}, want{code: Preflight, starts: 1, hold: "preflight failed before attempt 2", released: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f := &fixture{sess: newSession(), gate: &fakeGate{wait: ready}, holds: &fakeHolds{},
				runner: &fakeRunner{onStart: ok}, signal: cancel, force: make(chan struct{})}
			f.locker = &fakeLocker{sess: f.sess}
			if tc.setup != nil {
				tc.setup(f)
			}
			// Every command starts with this host's intent recorded.
			var noIntent []string
			f.runner.before = func() {
				f.holds.mu.Lock()
				defer f.holds.mu.Unlock()
				if f.holds.intent == nil || f.holds.intent.Host != "m1" || f.holds.intent.What != "restart" {
					noIntent = append(noIntent, fmt.Sprintf("command started with intent %+v", f.holds.intent))
				}
			}
			if f.retryDelay == 0 {
				f.retryDelay = time.Millisecond
			}
			cfg := Config{Argv: []string{"restart"}, Attempts: 2, RetryDelay: f.retryDelay, LockTimeout: time.Minute,
				Host: "m1", PID: 7, LockName: "lock",
				Preflight: func(context.Context) error {
					f.preflights++
					if f.preflight != nil {
						return f.preflight(f.preflights)
					}
					return nil
				}}
			done := make(chan Code, 1)
			go func() { done <- New(cfg, f.locker, f.runner, f.gate, f.holds).Run(ctx, f.force) }()
			var code Code
			select {
			case code = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Run did not return")
			}
			w := tc.want
			if code != w.code {
				t.Errorf("code %d, want %d", code, w.code)
			}
			if len(f.runner.procs) != w.starts {
				t.Errorf("%d command starts, want %d", len(f.runner.procs), w.starts)
			}
			if (f.locker.opened == 0) != w.noLock {
				t.Errorf("lock opened %d times, want none: %v", f.locker.opened, w.noLock)
			}
			if f.sess.released != w.released || f.sess.abandoned != w.abandoned {
				t.Errorf("released %v abandoned %v, want %v %v", f.sess.released, f.sess.abandoned, w.released, w.abandoned)
			}
			switch {
			case w.hold == "" && len(f.holds.adds) > 0:
				t.Errorf("hold written: %+v", f.holds.adds)
			case w.hold != "" && (len(f.holds.adds) != 1 || !strings.Contains(f.holds.adds[0].Reason, w.hold)):
				t.Errorf("holds %+v, want one with %q", f.holds.adds, w.hold)
			}
			if w.hold != "" && len(f.holds.adds) == 1 && (f.holds.adds[0].Host != "m1" || f.holds.adds[0].ExitCode != int(w.code)) {
				t.Errorf("hold record %+v", f.holds.adds[0])
			}
			if n := len(f.runner.procs); n > 0 && f.runner.procs[n-1].terminated != w.terminated {
				t.Errorf("command terminated with grace %s, want %s", f.runner.procs[n-1].terminated, w.terminated)
			}
			if n := len(f.runner.procs); n > 0 && !strings.Contains(strings.Join(f.runner.env, " "), "ETCD_LOCK_KEY=lock/1") {
				t.Errorf("command env lacks the lock key: %q", f.runner.env)
			}
			for _, e := range noIntent {
				t.Error(e)
			}
			// Every run here sees its end (ready, a hold written, or
			// nothing ran): none leaves its intent behind.
			if f.holds.intent != nil {
				t.Errorf("intent left behind: %+v", f.holds.intent)
			}
			if f.holds.intents == 0 && f.locker.opened > 0 && w.starts > 0 {
				t.Error("a command ran with no intent written")
			}
		})
	}
}

// A hold that cannot be written is retried while etcd is away, and a second
// signal gives up on it rather than hang.
func TestHoldWriteForcedGivesUp(t *testing.T) {
	f := &fakeHolds{failAdds: 1 << 30}
	force := make(chan struct{})
	r := New(Config{Host: "m1"}, nil, nil, nil, f)
	done := make(chan struct{})
	go func() {
		r.writeHold(context.Background(), force, result{code: LeaseLost, failure: "x"}, r.cfg.Log)
		close(done)
	}()
	close(force)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writeHold ignored the second signal")
	}
	if len(f.adds) != 0 {
		t.Fatal("hold written")
	}
}

// endedRunner hands out a command that has already ended.
type endedRunner struct{ p *fakeProc }

func (r endedRunner) Start(argv, env []string) (Process, error) { return r.p, nil }

// When the command has ended and the lock is lost (or a second signal
// arrives) before the attempt looks, select may pick either: the command's
// end must win, so an ended command is never terminated nor logged as
// terminated. Select picks at random, so a run of 200 misses this with
// probability 2^-200.
func TestEndedCommandNotTerminated(t *testing.T) {
	for i := 0; i < 200; i++ {
		p := &fakeProc{done: make(chan struct{})}
		p.finish(errors.New("exit 1"))
		sess := newSession()
		sess.lose()
		force := make(chan struct{})
		close(force)
		r := New(Config{Argv: []string{"restart"}, Host: "m1"}, nil, endedRunner{p}, nil, &fakeHolds{})
		out := r.attempt(context.Background(), force, sess, r.cfg.Log)
		if p.terminated != 0 {
			t.Fatalf("run %d: an ended command was terminated with grace %s", i, p.terminated)
		}
		if out.code != LeaseLost || !strings.Contains(out.failure, "exit 1") {
			t.Fatalf("run %d: %+v, want the lock loss with the command's failure", i, out)
		}
	}
}

// holderLocker answers Holder with the lock's holder, as the etcd locker
// words it.
type holderLocker struct {
	fakeLocker
	holder string
}

func (l *holderLocker) Holder(context.Context) string { return l.holder }

// A wait for the lock longer than HolderNoteAfter logs who holds it, with
// what the Locker says about its lease; a wait that ends first, or a
// holder that is this session, logs nothing.
func TestWaitNamesHolder(t *testing.T) {
	const held = "lock/0 (lease 0, 42s left, created at revision 2): host m2 pid 9; its lease expires in 42s; if host m2 is gone, the lock frees itself then; `kube-apiserver-safe-restart status` shows the queue"
	for _, tc := range []struct {
		name   string
		wait   time.Duration
		holder string
		want   bool
	}{
		{"long wait", 300 * time.Millisecond, held, true},
		{"short wait", 0, held, false},
		{"holder is this session", 300 * time.Millisecond, "lock/1 (lease 1, ...)", false},
		{"holder unknown", 300 * time.Millisecond, HolderUnknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := newSession()
			sess.lockErr = func(ctx context.Context) error {
				select {
				case <-time.After(tc.wait):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			var out bytes.Buffer
			log := logrus.New()
			log.SetOutput(&out)
			cfg := Config{Argv: []string{"restart"}, LockTimeout: time.Minute, Host: "m1", LockName: "lock",
				Log: log, HolderNoteAfter: 100 * time.Millisecond}
			l := &holderLocker{fakeLocker: fakeLocker{sess: sess}, holder: tc.holder}
			code := New(cfg, l, &fakeRunner{onStart: ok}, &fakeGate{wait: ready}, &fakeHolds{}).Run(context.Background(), make(chan struct{}))
			if code != OK {
				t.Fatalf("code %d:\n%s", code, out.String())
			}
			if got := strings.Contains(out.String(), "still waiting for the lock: held by "+tc.holder); got != tc.want {
				t.Errorf("holder logged %v, want %v:\n%s", got, tc.want, out.String())
			}
		})
	}
}
