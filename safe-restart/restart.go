package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/safe-restart/internal/health"
	"github.com/keysync/confd/safe-restart/internal/hold"
	"github.com/keysync/confd/safe-restart/internal/lock"
	"github.com/keysync/confd/safe-restart/internal/preflight"
	"github.com/keysync/confd/safe-restart/internal/proc"
)

// killGrace is how long a timed-out command's process group has between
// SIGTERM and SIGKILL.
const killGrace = 5 * time.Second

// outcome is how one attempt (or the whole run under the lock) ended.
type outcome struct {
	code int
	// failure, when set, is why the restart failed: it becomes the hold reason.
	failure   string
	retryable bool
}

func (a *app) restart(ctx context.Context) int {
	o := a.o
	log := a.log.WithField("lock", o.lockName)

	if code := a.preflight(ctx, log); code != exitOK {
		return code
	}
	cli, err := a.etcdClient()
	if err != nil {
		log.WithError(err).Error("etcd client")
		return exitError
	}
	defer cli.Close()

	holdKey := o.holdKeyOrDefault()
	if code := a.checkHold(ctx, cli, log, "before queueing"); code != exitOK {
		return code
	}
	if o.dryRun {
		return a.dryRun(ctx, cli)
	}

	sess, err := lock.Open(ctx, cli, lock.Config{
		Name:      o.lockName,
		TTL:       o.ttl,
		OpTimeout: o.commandTimeout,
		Info:      lock.Info{Host: a.host, PID: os.Getpid(), Started: time.Now().UTC(), Version: Version},
	})
	if err != nil {
		if ctx.Err() != nil {
			log.WithError(err).Warn("interrupted before queueing for the lock")
			return exitInterrupted
		}
		log.WithError(a.etcdErr(err)).Error("cannot open an etcd session")
		return exitError
	}
	log = log.WithFields(logrus.Fields{"key": sess.Key(), "lease": sess.LeaseHex()})
	log.WithFields(logrus.Fields{"ttl": o.ttl, "timeout": o.lockTimeout}).Info("waiting for the lock")

	lctx, cancel := context.WithTimeout(ctx, o.lockTimeout)
	err = sess.Lock(lctx)
	cancel()
	switch {
	case err == nil && ctx.Err() != nil:
		log.Warn("interrupted just as the lock was acquired: releasing it, nothing was run")
		a.release(ctx, sess, log)
		return exitInterrupted
	case err == nil:
	case errors.Is(err, lock.ErrLeaseLost):
		log.WithError(err).Error("LEASE LOST while waiting for the lock: giving up, touching nothing")
		sess.Abandon()
		return exitLeaseLost
	case ctx.Err() != nil:
		log.Warn("interrupted while waiting for the lock: leaving the queue")
		a.release(ctx, sess, log)
		return exitInterrupted
	case errors.Is(err, context.DeadlineExceeded):
		holder := a.describeHolder(ctx, cli)
		log.WithField("holder", holder).Errorf("lock not acquired within --lock-timeout %s; held by %s", o.lockTimeout, holder)
		a.release(ctx, sess, log)
		return exitLockTimeout
	default:
		log.WithError(a.etcdErr(err)).Error("cannot acquire the lock")
		a.release(ctx, sess, log)
		return exitError
	}
	log = log.WithField("rev", sess.Rev())
	log.Info("lock acquired")

	if code := a.checkHold(ctx, cli, log, "after acquiring the lock"); code != exitOK {
		a.release(ctx, sess, log)
		return code
	}

	out := a.attempts(ctx, sess, log)
	switch out.code {
	case exitOK:
		if err := sess.Release(context.WithoutCancel(ctx)); err != nil {
			log.WithError(err).Warn("restart done, but releasing the lock failed (the lease expires within the TTL)")
		} else {
			log.Info("restart done and ready; lock released")
		}
		return exitOK
	case exitLeaseLost:
		if out.failure != "" {
			a.writeHold(ctx, cli, log, holdKey, out)
		}
		log.Error("LEASE LOST: exiting without unlocking or revoking: the lock may belong to another host now")
		sess.Abandon()
		return exitLeaseLost
	default:
		a.writeHold(ctx, cli, log, holdKey, out)
		a.release(ctx, sess, log)
		return out.code
	}
}

func (a *app) preflight(ctx context.Context, log logrus.FieldLogger) int {
	o := a.o
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := preflight.Run(pctx, preflight.Input{Files: o.preflightFiles, FlagsFiles: o.preflightFlagsFiles, Now: time.Now()})
	if err != nil {
		for _, e := range splitErrors(err) {
			log.Errorf("preflight: %v", e)
		}
		log.Error("preflight failed: not taking the lock, not restarting")
		return exitPreflight
	}
	if err := checkGate(o); err != nil {
		for _, e := range splitErrors(err) {
			log.Errorf("preflight: health gate: %v", e)
		}
		log.Error("preflight failed: not taking the lock, not restarting")
		return exitPreflight
	}
	if n := len(o.preflightFiles) + len(o.preflightFlagsFiles); n > 0 {
		log.WithField("files", n).Info("preflight passed")
	}
	return exitOK
}

// checkHold refuses (exitHold) while a hold is active, unless --ignore-hold.
func (a *app) checkHold(ctx context.Context, cli *clientv3.Client, log logrus.FieldLogger, when string) int {
	hctx, cancel := a.opCtx(ctx)
	defer cancel()
	key := a.o.holdKeyOrDefault()
	rec, err := hold.Get(hctx, cli, key)
	if err != nil {
		log.WithError(a.etcdErr(err)).Errorf("cannot read the hold %s", when)
		return exitError
	}
	if rec == nil {
		return exitOK
	}
	if a.o.ignoreHold {
		log.WithField("hold_key", key).Warnf("hold active, ignored (--ignore-hold): set by %s", rec)
		return exitOK
	}
	log.WithField("hold_key", key).Errorf("hold active (%s): set by %s; refusing to restart. Fix the cause, then run `%s unhold` (or pass --ignore-hold)", when, rec, progName)
	return exitHold
}

func (a *app) writeHold(ctx context.Context, cli *clientv3.Client, log logrus.FieldLogger, key string, out outcome) {
	reason := out.failure
	if reason == "" {
		reason = fmt.Sprintf("exit code %d", out.code)
	}
	rec := hold.Record{Host: a.host, PID: os.Getpid(), Reason: reason, Time: time.Now(), Lock: a.o.lockName, ExitCode: out.code}
	hctx, cancel := a.opCtx(ctx)
	defer cancel()
	if _, err := hold.Add(hctx, cli, key, rec); err != nil {
		log.WithError(a.etcdErr(err)).Error("restart failed and the hold could NOT be written: other hosts are not stopped")
		return
	}
	log.WithField("hold_key", key).Errorf("restart failed: hold written, every host refuses to restart until `%s unhold`: %s", progName, reason)
}

func (a *app) release(ctx context.Context, sess *lock.Session, log logrus.FieldLogger) {
	if err := sess.Release(context.WithoutCancel(ctx)); err != nil {
		log.WithError(err).Warn("release lock")
	}
}

func (a *app) describeHolder(ctx context.Context, cli *clientv3.Client) string {
	qctx, cancel := a.opCtx(ctx)
	defer cancel()
	q, _, err := lock.Queue(qctx, cli, a.o.lockName)
	if err != nil || len(q) == 0 {
		return "(unknown)"
	}
	return q[0].String()
}

// attempts runs the command and the health gate up to --attempts times
// while the lock is held.
func (a *app) attempts(ctx context.Context, sess *lock.Session, log *logrus.Entry) outcome {
	var out outcome
	for i := 1; i <= a.o.attempts; i++ {
		out = a.attempt(ctx, sess, log.WithField("attempt", i))
		if out.code == exitOK || !out.retryable || i == a.o.attempts {
			return out
		}
		log.WithField("attempt", i).Warnf("attempt failed (%s); retrying in %s", out.failure, a.o.retryDelay)
		t := time.NewTimer(a.o.retryDelay)
		select {
		case <-t.C:
		case <-sess.Done():
			t.Stop()
			log.Errorf("LEASE LOST between attempts: lock %s (lease %s) may now be held by another host", sess.Key(), sess.LeaseHex())
			return outcome{code: exitLeaseLost, failure: out.failure}
		case <-ctx.Done():
			t.Stop()
			return outcome{code: exitInterrupted, failure: "interrupted between restart attempts after: " + out.failure}
		}
	}
	return out
}

// attempt runs the restart command, then the health gate.
//
// Fencing: the session declares its lease lost a safety margin before etcd
// can expire it (lock.SafetyMargin). If that happens while the command
// runs, the command's process group is terminated within half that margin,
// so that it has ended before another host can take the lock: the lock's
// promise is that no two commands overlap, and past the lease nothing backs
// it. (For `systemctl restart`, systemd carries an already queued job on;
// killing systemctl stops our waiting for it, not the restart.) The health
// gate is then skipped, and nothing in etcd is touched on the way out.
// A signal during the command is different: the lock is still ours, so the
// command is let finish, then the caller writes a hold (the apiserver's
// state is unknown) and releases the lock.
func (a *app) attempt(ctx context.Context, sess *lock.Session, log *logrus.Entry) outcome {
	o := a.o
	env := append(os.Environ(), sess.Env()...)
	p, err := proc.Start(proc.Spec{Argv: o.argv, Env: env, Stdout: a.stdout, Stderr: a.stderr, Timeout: o.restartTimeout, KillGrace: killGrace})
	if err != nil {
		log.WithError(err).Error("restart command did not start")
		return outcome{code: exitRestart, failure: err.Error()}
	}
	log = log.WithField("pid", p.Pid())
	log.WithField("command", proc.Quote(o.argv)).Info("restart command started")
	leaseLost, signalled, terminated := false, false, false
	leaseC, sigC := sess.Done(), ctx.Done()
	for running := true; running; {
		select {
		case <-p.Done():
			running = false
		case <-leaseC:
			leaseC = nil
			leaseLost, terminated = true, true
			log.Errorf("LEASE LOST while the restart command runs: lock %s (lease %s) is about to expire and go to another host; terminating the command's process group, then exiting without releasing anything", sess.Key(), sess.LeaseHex())
			p.Terminate(sess.Margin() / 2)
		case <-sigC:
			sigC = nil
			signalled = true
			log.Warnf("interrupted while the restart command runs: letting it finish (up to --restart-timeout %s), skipping the health gate, then stopping the line", o.restartTimeout)
		}
	}
	res := p.Wait()
	var failure string
	if res.Err != nil {
		failure = res.Err.Error()
		log.WithFields(logrus.Fields{"exit_code": res.ExitCode, "duration": res.Duration.Round(time.Millisecond)}).Error(failure)
	} else {
		log.WithField("duration", res.Duration.Round(time.Millisecond)).Info("restart command succeeded")
	}
	if !leaseLost && sess.Lost() {
		leaseLost = true
		log.Errorf("LEASE LOST while the restart command ran: lock %s (lease %s) may now be held by another host", sess.Key(), sess.LeaseHex())
	}
	switch {
	case leaseLost && terminated:
		// Our own kill is no verdict on the restart; and with the lease gone
		// nothing in etcd is ours to write.
		return outcome{code: exitLeaseLost}
	case leaseLost:
		return outcome{code: exitLeaseLost, failure: failure}
	case signalled || ctx.Err() != nil:
		return outcome{code: exitInterrupted, failure: joinReason("interrupted by a signal before the apiserver was confirmed ready", failure)}
	case res.Err != nil:
		return outcome{code: exitRestart, failure: failure, retryable: true}
	}
	return a.gate(ctx, sess, log)
}

// gate holds the lock until the apiserver is ready; it is cancelled when the
// lease is lost or a signal arrives.
func (a *app) gate(ctx context.Context, sess *lock.Session, log *logrus.Entry) outcome {
	o := a.o
	if o.healthURL == "" {
		log.Info("health gate off (--health-url empty)")
		return outcome{code: exitOK}
	}
	cfg := o.healthConfig()
	// health.Wait enforces --health-timeout itself; this deadline is a backstop.
	gctx, cancel := context.WithTimeout(ctx, o.healthSettle+o.healthTimeout+o.commandTimeout)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-gctx.Done():
		}
	}()
	log.WithFields(logrus.Fields{"url": o.healthURL, "timeout": o.healthTimeout}).Info("holding the lock until the apiserver is ready")
	err := health.Wait(gctx, cfg, log)
	switch {
	case sess.Lost():
		log.Errorf("LEASE LOST while waiting for the apiserver to be ready: lock %s (lease %s) may now be held by another host; health gate cancelled", sess.Key(), sess.LeaseHex())
		return outcome{code: exitLeaseLost}
	case ctx.Err() != nil:
		return outcome{code: exitInterrupted, failure: "interrupted by a signal while waiting for the apiserver to be ready"}
	case errors.Is(err, health.ErrUnauthorized):
		log.WithError(err).Error("health gate: the apiserver refused the probe (401/403): a configuration error, not retried")
		return outcome{code: exitHealth, failure: "health gate: " + err.Error()}
	case errors.Is(err, health.ErrConfig), errors.Is(err, health.ErrJWKS):
		// Restarting again would not change either.
		log.WithError(err).Error("health gate failed, not retried")
		return outcome{code: exitHealth, failure: "health gate: " + err.Error()}
	case err != nil:
		log.WithError(err).Error("health gate failed")
		return outcome{code: exitHealth, failure: "health gate: " + err.Error(), retryable: true}
	}
	log.Info("apiserver ready")
	return outcome{code: exitOK}
}

func joinReason(a, b string) string {
	if b == "" {
		return a
	}
	return a + "; " + b
}

// dryRun reports what a restart would do, after preflight and the hold
// check passed. It takes no lock and runs nothing.
func (a *app) dryRun(ctx context.Context, cli *clientv3.Client) int {
	o := a.o
	qctx, cancel := a.opCtx(ctx)
	defer cancel()
	q, _, err := lock.Queue(qctx, cli, o.lockName)
	if err != nil {
		a.log.WithError(a.etcdErr(err)).Error("dry run: read the lock")
		return exitError
	}
	h, err := hold.Get(qctx, cli, o.holdKeyOrDefault())
	if err != nil {
		a.log.WithError(a.etcdErr(err)).Error("dry run: read the hold")
		return exitError
	}
	plan := map[string]any{
		"dry_run":         true,
		"preflight_files": len(o.preflightFiles) + len(o.preflightFlagsFiles),
		"lock":            o.lockName,
		"ttl_seconds":     o.ttl,
		"lock_timeout":    o.lockTimeout.String(),
		"queue_length":    len(q),
		"command":         o.argv,
		"restart_timeout": o.restartTimeout.String(),
		"attempts":        o.attempts,
		"health_url":      o.healthURL,
		"hold_key":        o.holdKeyOrDefault(),
		"hold":            h,
	}
	if o.output == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(plan); err != nil {
			return exitError
		}
		return exitOK
	}
	var b strings.Builder
	b.WriteString("dry run: no lock taken, nothing run\n")
	fmt.Fprintf(&b, "preflight: passed (%d files)\n", plan["preflight_files"])
	if h != nil {
		fmt.Fprintf(&b, "hold: ACTIVE at %s, ignored (--ignore-hold): %s\n", o.holdKeyOrDefault(), h)
	} else {
		fmt.Fprintf(&b, "hold: none at %s\n", o.holdKeyOrDefault())
	}
	if len(q) == 0 {
		fmt.Fprintf(&b, "would take lock %s (free now; TTL %ds)\n", o.lockName, o.ttl)
	} else {
		fmt.Fprintf(&b, "would queue for lock %s behind %d (holder %s), waiting up to %s\n", o.lockName, len(q), q[0], o.lockTimeout)
	}
	fmt.Fprintf(&b, "would run: %s (timeout %s, up to %d attempts)\n", proc.Quote(o.argv), o.restartTimeout, o.attempts)
	if o.healthURL == "" {
		b.WriteString("health gate: off\n")
	} else {
		fmt.Fprintf(&b, "would hold the lock until %s is ready (settle %s, timeout %s)\n", o.healthURL, o.healthSettle, o.healthTimeout)
	}
	fmt.Fprintf(&b, "on failure: would write a hold at %s\n", o.holdKeyOrDefault())
	_, _ = a.stdout.Write([]byte(b.String()))
	return exitOK
}

// checkGate catches a health gate that cannot work (bad URL, missing CA,
// client certificate, token or JWKS key file) before the restart rather
// than after it. Contents are never logged.
func checkGate(o *options) error {
	return health.Validate(o.healthConfig())
}

// healthConfig is the gate's configuration from the command line.
func (o *options) healthConfig() health.Config {
	return health.Config{
		URL: o.healthURL, CACert: o.healthCACert, Cert: o.healthCert, Key: o.healthKey, TokenFile: o.healthToken,
		Settle: o.healthSettle, Timeout: o.healthTimeout, Interval: o.healthInterval, JWKSKeyFiles: o.jwksKeyFiles,
	}
}

// splitErrors undoes errors.Join, one level, so each problem gets its own line.
func splitErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
