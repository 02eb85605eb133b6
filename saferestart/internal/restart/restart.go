// Package restart is kube-apiserver-safe-restart's state machine:
// preflight → gate probe → hold check → lock → hold check → (preflight →
// command → health gate) × attempts → release, with lease loss, signals
// and failures handled at every step. It works through small interfaces
// (Locker/Session, Runner/Process, Gate, Holds) so that every combination
// is a unit test with fakes; package main only wires the real ones.
package restart

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
)

// Code is the process exit status; each outcome has its own.
type Code int

// Exit codes, documented in --help and README.md.
const (
	OK          Code = 0 // restarted and ready
	Error       Code = 1 // internal or etcd error
	Usage       Code = 2 // bad flags or arguments
	Preflight   Code = 3 // preflight (or the gate's credentials) failed; nothing restarted
	Held        Code = 4 // a hold is active
	LockTimeout Code = 5 // lock not acquired within the lock timeout
	Failed      Code = 6 // restart command failed or timed out
	Unhealthy   Code = 7 // health gate failed
	LeaseLost   Code = 8 // session lease (or the lock key) lost
	Interrupted Code = 9 // signal
)

// Session is one participant in the lock (lock.Session).
type Session interface {
	// Lock waits for the lock; an error wrapping lock.ErrLeaseLost means the
	// lease was lost while waiting.
	Lock(ctx context.Context) error
	Release(ctx context.Context) error
	// Abandon lets go without touching etcd: for a lock that may be someone
	// else's now.
	Abandon()
	// Done closes when the lock must be taken as lost.
	Done() <-chan struct{}
	Lost() bool
	Key() string
	Env() []string
	// Margin is how long before the lease can expire on the server Done
	// closes: the time the command has to be stopped in.
	Margin() time.Duration
	// Lease is the session's lease, recorded in the intent: the intent is
	// live as long as the lease is.
	Lease() clientv3.LeaseID
}

// ErrGuardDied is what Process.Wait wraps when the command's group guard
// died on its own (SIGKILL, say) while the command ran: the group was
// killed, but what the command did is unknown. Not retried; a hold is
// written.
var ErrGuardDied = errors.New("the restart command's group guard died while the command ran; its process group was killed")

// ErrGroupAlive is what Process.Wait wraps when the command's process
// group could not be confirmed gone: the lock is kept (not released, not
// revoked) until its lease runs out, so that no other host restarts beside
// a command that may still run.
var ErrGroupAlive = errors.New("the restart command's process group could not be confirmed gone")

// ErrNotStarted is what a Runner's Start, or a Process's Wait (a guard
// that reports it only once it ended), wraps when the command could not
// be started at all (not found, not executable): nothing ran, so the
// apiserver is as it was, and trying again cannot help.
var ErrNotStarted = errors.New("restart command could not start")

// Locker opens sessions and describes the current holder.
type Locker interface {
	Open(ctx context.Context) (Session, error)
	// Holder describes the holder on one line, starting with its lock
	// key and a space; HolderUnknown when it cannot be read.
	Holder(ctx context.Context) string
}

// HolderUnknown is Holder's answer when the holder cannot be read.
const HolderUnknown = "(unknown)"

// Process is a started command.
type Process interface {
	Pid() int
	Done() <-chan struct{}
	// Terminate sends SIGTERM to the command's process group, SIGKILL
	// after grace; it does not wait.
	Terminate(grace time.Duration)
	// Wait returns nil when the command exited 0, else why not.
	Wait() error
}

// Runner starts the restart command. The command must die with this
// process (parent-death signal) and get env on top of nothing else.
type Runner interface {
	Start(argv, env []string) (Process, error)
}

// Gate is the health gate.
type Gate interface {
	// Probe tries the gate's TLS settings and credentials on the running
	// apiserver; an error means the gate can never pass (and is reported
	// before anything is restarted). A down apiserver is not an error.
	Probe(ctx context.Context) error
	// Wait blocks until the apiserver is ready. A GateError says whether
	// another restart could help.
	Wait(ctx context.Context) error
	// Enabled is false when there is no gate.
	Enabled() bool
}

// GateError is a failed Wait; Final errors (credentials, JWKS) are not
// retried.
type GateError struct {
	Err   error
	Final bool
}

func (e *GateError) Error() string { return e.Err.Error() }
func (e *GateError) Unwrap() error { return e.Err }

// Holds reads and writes the hold record. Add never overwrites one.
type Holds interface {
	// Get returns what stops the line: the hold, or another host's
	// orphaned restart intent taken as one (hold.Store).
	Get(ctx context.Context) (*hold.Record, error)
	Add(ctx context.Context, r hold.Record) error
	Key() string
	// SetIntent records, with no lease, that this host's restart is about
	// to run: if this process dies before it sees the end, the record
	// outlives its lock lease and holds the other hosts.
	SetIntent(ctx context.Context, in hold.Intent) error
	// ClearIntent removes this host's intent: the restart's end was seen
	// (ready, or its failure is a hold now), or nothing ran.
	ClearIntent(ctx context.Context) error
}

// Config is what one run does.
type Config struct {
	Argv        []string
	Env         []string
	Attempts    int
	RetryDelay  time.Duration
	LockTimeout time.Duration
	// OpTimeout bounds one etcd request.
	OpTimeout  time.Duration
	IgnoreHold bool
	Host       string
	PID        int
	LockName   string
	// Preflight checks the files the new apiserver will read; nil: none.
	Preflight func(ctx context.Context) error
	// BeforeQueue, when set, runs after the hold check and before queueing
	// for the lock; a code other than OK ends the run with it. (The trust
	// gate: a new signing key waits here, holding no lock.)
	BeforeQueue func(ctx context.Context) Code
	// UnderLock, when set, runs once the lock is held and the hold checked;
	// a code other than OK releases the lock and ends the run with it,
	// nothing run and no hold written. (The fleet check, not waiting.)
	UnderLock func(ctx context.Context) Code
	// Locked, when set, runs once the lock is held, before the first
	// attempt; the function it returns, if any, runs after an attempt
	// succeeded, the lock still held. lockKey is the lock's key in etcd.
	// (The trust record: what the apiserver is about to load, written once
	// it is ready, on condition that the lock key still exists.)
	Locked func(ctx context.Context, lockKey string) func(ctx context.Context)
	Log    logrus.FieldLogger
	// HolderNoteAfter is how long the lock is waited for before the log
	// names who holds it (0: DefaultHolderNoteAfter): "waiting for the
	// lock" alone left the operator of a host that waits on a dead one
	// to find out who, and for how long, by hand.
	HolderNoteAfter time.Duration
}

// DefaultHolderNoteAfter lets an uncontended lock be taken without a
// look at the queue; a wait longer than this is another host restarting.
const DefaultHolderNoteAfter = 5 * time.Second

// noteHolder logs, once the lock has been waited for HolderNoteAfter,
// who holds it (with its lease's time left and what to do, as the Locker
// words it). It runs within the lock wait (ctx), so the worst case is
// unchanged; the channel closes when it is done.
func (r *Restarter) noteHolder(ctx context.Context, ownKey string, log logrus.FieldLogger) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		select { // a timer no longer referenced is collected (Go 1.23)
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.HolderNoteAfter):
		}
		h := r.locker.Holder(ctx)
		// Not when the wait ended meanwhile (the holder read may be us).
		if ctx.Err() != nil || h == "" || h == HolderUnknown || strings.HasPrefix(h, ownKey+" ") {
			return
		}
		log.WithField("holder", h).Infof("still waiting for the lock: held by %s", h)
	}()
	return done
}

// HoldRetry is how long a hold write is retried while etcd is unreachable:
// other hosts must be stopped.
const HoldRetry = 30 * time.Second

// KillGrace is how long a timed-out (or force-stopped: second signal)
// command's process group has between SIGTERM and SIGKILL.
const KillGrace = 5 * time.Second

// PreflightTimeout bounds one preflight run.
const PreflightTimeout = 30 * time.Second

// Restarter runs the state machine.
type Restarter struct {
	cfg    Config
	locker Locker
	runner Runner
	gate   Gate
	holds  Holds
}

// New returns a Restarter with cfg's zero values defaulted.
func New(cfg Config, l Locker, r Runner, g Gate, h Holds) *Restarter {
	cfg.Attempts = max(cfg.Attempts, 1)
	cfg.OpTimeout = cmp.Or(cfg.OpTimeout, 5*time.Second)
	cfg.HolderNoteAfter = cmp.Or(cfg.HolderNoteAfter, DefaultHolderNoteAfter)
	if cfg.Log == nil {
		l := logrus.New()
		l.SetLevel(logrus.PanicLevel)
		cfg.Log = l
	}
	return &Restarter{cfg: cfg, locker: l, runner: r, gate: g, holds: h}
}

// result is how an attempt (or the run under the lock) ended.
type result struct {
	code Code
	// failure, when set, is why: it becomes the hold's reason.
	failure   string
	retryable bool
	// ran is set once the command was started: from then on the
	// apiserver's state is unknown until the gate passes.
	ran bool
	// groupAlive: the command may still run; keep the lock until the
	// lease runs out.
	groupAlive bool
}

// Run restarts once. ctx ending is the first signal (stop as soon as it
// is safe); force closing is the second (stop now).
func (r *Restarter) Run(ctx context.Context, force <-chan struct{}) Code {
	log := r.cfg.Log
	if code := r.preflight(ctx, "before queueing"); code != OK {
		return code
	}
	if r.gate != nil && r.gate.Enabled() {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
		err := r.gate.Probe(pctx)
		cancel()
		if err != nil {
			log.WithError(err).Error("health gate: the running apiserver refuses the gate's TLS settings or credentials; the gate could never pass: not restarting")
			return Preflight
		}
	}
	code := r.checkHold(ctx, "before queueing")
	if code == OK && r.cfg.BeforeQueue != nil {
		code = r.cfg.BeforeQueue(ctx)
	}
	if code != OK {
		return code
	}
	sess, err := r.locker.Open(ctx)
	if err != nil {
		if ctx.Err() != nil {
			log.WithError(err).Warn("interrupted before queueing for the lock")
			return Interrupted
		}
		log.WithError(err).Error("cannot open an etcd session")
		return Error
	}
	log = log.WithField("key", sess.Key())
	log.WithField("timeout", r.cfg.LockTimeout).Info("waiting for the lock")
	lctx, cancel := context.WithTimeout(ctx, r.cfg.LockTimeout)
	noted := r.noteHolder(lctx, sess.Key(), log)
	err = sess.Lock(lctx)
	cancel()
	<-noted
	switch {
	case err == nil && ctx.Err() != nil:
		log.Warn("interrupted just as the lock was acquired: releasing it, nothing was run")
		code = Interrupted
	case err == nil:
		log.Info("lock acquired")
		code = r.checkHold(ctx, "after acquiring the lock")
	case errors.Is(err, lock.ErrLeaseLost):
		log.WithError(err).Error("LOCK LOST while waiting for it: giving up, touching nothing")
		sess.Abandon()
		return LeaseLost
	case ctx.Err() != nil:
		log.Warn("interrupted while waiting for the lock: leaving the queue")
		code = Interrupted
	case errors.Is(err, context.DeadlineExceeded):
		holder := r.locker.Holder(context.WithoutCancel(ctx))
		log.WithField("holder", holder).Errorf("lock not acquired within the lock timeout %s; held by %s", r.cfg.LockTimeout, holder)
		code = LockTimeout
	default:
		log.WithError(err).Error("cannot acquire the lock")
		code = Error
	}
	if code == OK && r.cfg.UnderLock != nil {
		code = r.cfg.UnderLock(ctx)
	}
	if code != OK {
		r.release(ctx, sess, log)
		return code
	}
	var succeeded func(context.Context)
	if r.cfg.Locked != nil {
		succeeded = r.cfg.Locked(ctx, sess.Key())
	}
	// This host's restart recorded as under way, before the command starts
	// (see hold.Intent).
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OpTimeout)
	err = r.holds.SetIntent(ictx, hold.Intent{Host: r.cfg.Host, PID: r.cfg.PID, Lease: int64(sess.Lease()), LockKey: sess.Key(),
		Started: time.Now(), What: runner.Quote(r.cfg.Argv)})
	cancel()
	if err != nil {
		// Without the intent, this helper's death mid-restart would free
		// the lock with no hold: run nothing.
		log.WithError(err).Error("cannot record the restart intent: releasing the lock, nothing was run")
		r.release(ctx, sess, log)
		return Error
	}
	out := r.attempts(ctx, force, sess, log)
	switch {
	case out.code == OK:
		if succeeded != nil {
			succeeded(ctx)
		}
		// Cleared while the lease still lives, so that no other host ever
		// sees it orphaned.
		r.clearIntent(ctx, log)
		if err := sess.Release(context.WithoutCancel(ctx)); err != nil {
			log.WithError(err).Warn("restart done, but releasing the lock failed (the lease expires within its TTL)")
		} else {
			log.Info("restart done and ready; lock released")
		}
	case out.code == LeaseLost:
		// The lock may be someone else's now: touch nothing of it. But if
		// the command ran, this apiserver's state is unknown, and the next
		// host must not restart its own: stop the line.
		sess.Abandon()
		if !out.ran || r.writeHold(ctx, force, out, log) {
			r.clearIntent(ctx, log)
		}
		log.Error("LOCK LOST: exiting without unlocking or revoking: the lock may belong to another host now")
	case out.ran:
		if r.writeHold(ctx, force, out, log) {
			r.clearIntent(ctx, log)
		}
		if out.groupAlive {
			sess.Abandon()
			log.Error("the restart command may still run: keeping the lock (not released, not revoked) until its lease runs out, so that no other host restarts beside it")
		} else {
			r.release(ctx, sess, log)
		}
	default:
		r.clearIntent(ctx, log)
		r.release(ctx, sess, log)
	}
	return out.code
}

// clearIntent removes this host's intent once the restart's end is known
// and recorded: ready, a hold written, or nothing ran. A failed restart
// whose hold could not be written keeps it: once its lease is gone it is
// the hold the others see.
func (r *Restarter) clearIntent(ctx context.Context, log logrus.FieldLogger) {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OpTimeout)
	defer cancel()
	if err := r.holds.ClearIntent(ictx); err != nil {
		log.WithError(err).Error("cannot remove this host's restart intent: once its lock lease is gone, other hosts take it as a hold naming this host, until its next successful restart or `unhold`")
	}
}

func (r *Restarter) preflight(ctx context.Context, when string) Code {
	if r.cfg.Preflight == nil {
		return OK
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PreflightTimeout)
	defer cancel()
	if err := r.cfg.Preflight(pctx); err != nil {
		// Each problem errors.Join joined gets its own line.
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		}
		for _, e := range errs {
			r.cfg.Log.Errorf("preflight: %v", e)
		}
		r.cfg.Log.Errorf("preflight failed %s: not restarting", when)
		return Preflight
	}
	r.cfg.Log.Infof("preflight passed %s", when)
	return OK
}

// checkHold refuses (Held) while a hold is active, unless IgnoreHold.
func (r *Restarter) checkHold(ctx context.Context, when string) Code {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OpTimeout)
	defer cancel()
	rec, err := r.holds.Get(hctx)
	if err != nil {
		r.cfg.Log.WithError(err).Errorf("cannot read the hold %s", when)
		return Error
	}
	if rec == nil {
		return OK
	}
	if r.cfg.IgnoreHold {
		r.cfg.Log.WithField("hold_key", r.holds.Key()).Warnf("hold active, ignored (--ignore-hold): set by %s", rec)
		return OK
	}
	r.cfg.Log.WithField("hold_key", r.holds.Key()).Errorf("hold active (%s): set by %s; refusing to restart. Fix the cause, then run `unhold` (or pass --ignore-hold)", when, rec)
	return Held
}

// writeHold stops the line. It needs no lock, and keeps trying for at
// least HoldRetry while etcd is unreachable (unless forced): a hold that
// is not written lets the next host restart while this apiserver may be
// down.
func (r *Restarter) writeHold(ctx context.Context, force <-chan struct{}, out result, log logrus.FieldLogger) bool {
	reason := cmp.Or(out.failure, fmt.Sprintf("exit code %d", out.code))
	rec := hold.Record{Host: r.cfg.Host, PID: r.cfg.PID, Reason: reason, Time: time.Now(), Lock: r.cfg.LockName, ExitCode: int(out.code)}
	deadline := time.Now().Add(HoldRetry)
	for try := 1; ; try++ {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OpTimeout)
		err := r.holds.Add(hctx, rec)
		cancel()
		if err == nil {
			if try > 1 {
				log.Warnf("hold written after %d tries: etcd is reachable again", try)
			}
			log.WithField("hold_key", r.holds.Key()).Errorf("hold written: every host refuses to restart until `unhold`: %s", reason)
			return true
		}
		if try == 1 {
			log.WithError(err).Errorf("cannot write the hold; retrying for %s", HoldRetry)
		}
		if time.Now().After(deadline) {
			log.WithError(err).Errorf("the hold could NOT be written within %s: other hosts are stopped only by this host's restart intent, once its lock lease is gone; reason was: %s", HoldRetry, reason)
			return false
		}
		select {
		case <-force:
			log.WithError(err).Errorf("forced exit: the hold was NOT written: other hosts are stopped only by this host's restart intent, once its lock lease is gone; reason was: %s", reason)
			return false
		case <-time.After(min(time.Second, time.Until(deadline))):
		}
	}
}

func (r *Restarter) release(ctx context.Context, sess Session, log logrus.FieldLogger) {
	if err := sess.Release(context.WithoutCancel(ctx)); err != nil {
		log.WithError(err).Warn("release lock")
	}
}

// attempts runs preflight, the command and the gate up to Attempts times.
func (r *Restarter) attempts(ctx context.Context, force <-chan struct{}, sess Session, log logrus.FieldLogger) result {
	var out result
	ran := false
	for i := 1; i <= r.cfg.Attempts; i++ {
		alog := log.WithField("attempt", i)
		if code := r.preflight(ctx, fmt.Sprintf("before attempt %d", i)); code != OK {
			return result{code: Preflight, ran: ran, failure: joinReason(fmt.Sprintf("preflight failed before attempt %d", i), out.failure)}
		}
		out = r.attempt(ctx, force, sess, alog)
		ran = ran || out.ran
		out.ran = ran
		if out.code == OK || !out.retryable || i == r.cfg.Attempts {
			return out
		}
		alog.Warnf("attempt failed (%s); retrying in %s", out.failure, r.cfg.RetryDelay)
		select {
		case <-time.After(r.cfg.RetryDelay):
		case <-sess.Done():
			log.Error("LOCK LOST between attempts")
			return result{code: LeaseLost, ran: true, failure: joinReason("lock lost between restart attempts", out.failure)}
		case <-ctx.Done():
			return result{code: Interrupted, ran: true, failure: joinReason("interrupted between restart attempts", out.failure)}
		}
	}
	return out
}

// ended reports whether the command has already ended.
func ended(p Process) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}

// attempt runs the command, then the gate.
//
// Fencing: the session declares the lock lost a safety margin before etcd
// can expire the lease. If that happens while the command runs, its
// process group is terminated within half that margin, so that it has
// ended before another host can take the lock. A first signal lets the
// command finish (the lock is still ours; killing systemctl would not stop
// the restart anyway), skips the gate and stops the line; a second one
// terminates the command at once.
func (r *Restarter) attempt(ctx context.Context, force <-chan struct{}, sess Session, log logrus.FieldLogger) result {
	env := append(append([]string(nil), r.cfg.Env...), sess.Env()...)
	p, err := r.runner.Start(r.cfg.Argv, env)
	if errors.Is(err, ErrNotStarted) {
		log.WithError(err).Error("the restart command could not start: nothing was restarted by this attempt; not retrying. Fix the command (its path, PATH, permissions)")
		return result{code: Preflight, failure: err.Error()}
	}
	if err != nil {
		log.WithError(err).Error("restart command did not start")
		return result{code: Failed, failure: err.Error()}
	}
	log = log.WithField("pid", p.Pid())
	log.WithField("command", runner.Quote(r.cfg.Argv)).Info("restart command started")
	lost, signalled, forced := false, false, false
	lostC, sigC, forceC := sess.Done(), ctx.Done(), force
	for running := true; running; {
		select {
		case <-p.Done():
			running = false
		case <-lostC:
			lostC = nil
			if ended(p) {
				// Both were ready and select chose the loss: the command
				// had already ended, so there is nothing to terminate; the
				// check after the loop records the loss.
				running = false
				continue
			}
			lost = true
			log.Errorf("LOCK LOST while the restart command runs: terminating its process group before another host can take the lock")
			p.Terminate(sess.Margin() / 2)
		case <-sigC:
			sigC = nil
			signalled = true
			log.Warn("interrupted while the restart command runs: letting it finish, skipping the health gate, then stopping the line (signal again to stop it now)")
		case <-forceC:
			forceC = nil
			if ended(p) {
				running = false
				continue
			}
			forced = true
			log.Warn("second signal: terminating the restart command now")
			p.Terminate(KillGrace)
		}
	}
	cmdErr := p.Wait()
	notStarted := errors.Is(cmdErr, ErrNotStarted)
	var failure string
	if cmdErr == nil {
		log.Info("restart command succeeded")
	} else if failure = cmdErr.Error(); !notStarted {
		log.Error(failure)
	}
	if !lost && sess.Lost() {
		lost = true
		log.Error("LOCK LOST while the restart command ran")
	}
	switch {
	case lost && notStarted:
		return result{code: LeaseLost, failure: joinReason("lock lost", failure)}
	case lost:
		return result{code: LeaseLost, ran: true, failure: joinReason("lock lost while the restart command ran; the apiserver's state is unknown", failure)}
	case notStarted:
		log.WithError(cmdErr).Error("the restart command could not start: nothing was restarted by this attempt; not retrying. Fix the command (its path, PATH, permissions)")
		return result{code: Preflight, failure: failure}
	case forced:
		return result{code: Interrupted, ran: true, failure: joinReason("restart command stopped by a second signal", failure)}
	case signalled || ctx.Err() != nil:
		return result{code: Interrupted, ran: true, failure: joinReason("interrupted by a signal before the apiserver was confirmed ready", failure)}
	case errors.Is(cmdErr, ErrGuardDied) || errors.Is(cmdErr, ErrGroupAlive):
		return result{code: Failed, ran: true, failure: failure, groupAlive: errors.Is(cmdErr, ErrGroupAlive)}
	case cmdErr != nil:
		return result{code: Failed, ran: true, failure: failure, retryable: true}
	}
	return r.waitGate(ctx, sess, log)
}

// waitGate holds the lock until the apiserver is ready; it is cut short
// when the lock is lost or a signal arrives.
func (r *Restarter) waitGate(ctx context.Context, sess Session, log logrus.FieldLogger) result {
	if r.gate == nil || !r.gate.Enabled() {
		log.Info("health gate off")
		return result{code: OK, ran: true}
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-gctx.Done():
		}
	}()
	log.Info("holding the lock until the apiserver is ready")
	err := r.gate.Wait(gctx)
	var ge *GateError
	switch {
	case sess.Lost():
		log.Error("LOCK LOST while waiting for the apiserver to be ready")
		return result{code: LeaseLost, ran: true, failure: "lock lost while waiting for the apiserver to be ready; it may not be"}
	case ctx.Err() != nil:
		return result{code: Interrupted, ran: true, failure: "interrupted by a signal while waiting for the apiserver to be ready"}
	case err == nil:
		log.Info("apiserver ready")
		return result{code: OK, ran: true}
	case errors.As(err, &ge) && ge.Final:
		log.WithError(err).Error("health gate failed, not retried")
		return result{code: Unhealthy, ran: true, failure: "health gate: " + err.Error()}
	default:
		log.WithError(err).Error("health gate failed")
		return result{code: Unhealthy, ran: true, failure: "health gate: " + err.Error(), retryable: true}
	}
}

func joinReason(a, b string) string {
	if b == "" {
		return a
	}
	return a + "; " + b
}
