// Package restartcmd restarts kube-apiserver through the lock on the etcd
// client it is given: the restart command, and rotate-key's install step
// (Step: the restart, or the signer's switch to the next key, then
// kube-controller-manager). See safe-restart.md.
package restartcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/fqdn"
	"github.com/keysync/confd/internal/groupguard"
	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/health"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/restart"
)

// SecretEnv are the variables that must not reach the restart command.
var SecretEnv = []string{"ETCDCTL_PASSWORD", "ETCDCTL_USER"}

// restarter restarts kube-apiserver through the lock on one etcd client:
// its own for the restart command, or the one rotate-key already holds
// (rotation.Rotator.Restart).
type restarter struct {
	*cmdkit.Env
	o      *cmdkit.Restarting
	output string           // --output of --dry-run: text or json
	cli    *clientv3.Client // nil: restart dials, after the checks that need no etcd
}

func (o *Command) Run(ctx context.Context, e *cmdkit.Env) int {
	return (&restarter{Env: e, o: &o.Restarting, output: o.Output}).restart(ctx)
}

func (r *restarter) restart(ctx context.Context) int {
	o := r.o
	log := r.Log.WithField("lock", o.LockName)
	if err := health.Validate(healthConfig(&o.RestartFlags)); err != nil {
		for _, e := range cmdkit.SplitErrors(err) {
			log.Errorf("preflight: health gate: %v", e)
		}
		log.Error("preflight failed: not taking the lock, not restarting")
		return cmdkit.ExitPreflight
	}
	// A command that cannot start is found before the lock wait; the guard
	// reports one that fails to start all the same (restart.ErrNotStarted).
	if _, err := exec.LookPath(o.Argv[0]); err != nil {
		log.WithError(err).Errorf("the restart command %s cannot start: nothing was restarted, no hold written; fix the command after -- (its path, PATH, permissions)", runner.Quote(o.Argv))
		return cmdkit.ExitPreflight
	}
	client := r.cli
	if client == nil {
		// The restart command dials only now: what needs no etcd is
		// checked first.
		c, err := r.Dial(ctx)
		if err != nil {
			log.WithError(r.Etcd.Err(err)).Error(cli.ConnectFailed)
			return cmdkit.ExitError
		}
		defer c.Close()
		client = c
	}
	// Restart intents name the host as its published key and trust
	// record do (--host, else hostname -f): the name `forget-host` takes,
	// and one that differs between hosts even where their kernel host
	// names do not.
	holds := &hold.Store{C: client, HoldKey: o.HoldKeyOrDefault(), Host: r.TrustHost(ctx)}
	if o.DryRun {
		return r.dryRun(ctx, client, holds)
	}
	cfg := restart.Config{
		Argv: o.Argv, Env: runner.WithoutVars(os.Environ(), SecretEnv...),
		Attempts: o.Attempts, RetryDelay: o.RetryDelay, LockTimeout: o.LockTimeout,
		OpTimeout: r.Etcd.CommandTimeout, IgnoreHold: o.IgnoreHold,
		Host: r.Host, PID: os.Getpid(), LockName: o.LockName, Log: log,
	}
	if len(o.PreflightFiles)+len(o.PreflightFlagsFiles) > 0 {
		cfg.Preflight = func(ctx context.Context) error {
			return preflight.Run(ctx, cmdkit.PreflightInput(o.Preflight, o.SigningKey, func(err error) { log.Warnf("preflight: %v", err) }))
		}
	}
	// A new signing key waits, without the lock, until the others trust it;
	// the trust record is read just before the command and written once the
	// apiserver is ready.
	fc, err := r.newFleetCheck(r.TrustHost(ctx), client, log)
	if err != nil {
		log.WithError(err).Error("preflight failed: not taking the lock, not restarting")
		return cmdkit.ExitPreflight
	}
	cfg.BeforeQueue = func(ctx context.Context) restart.Code {
		if code := restart.Code(r.trustGate(ctx, client, log, TrustSnapshot(ctx, r.Env, o.Preflight, o.CMFlagsFiles, log))); code != restart.OK {
			return code
		}
		return fc.run(ctx, true, "before queueing")
	}
	cfg.UnderLock = func(ctx context.Context) restart.Code { return fc.run(ctx, false, "under the lock") }
	cfg.Locked = func(ctx context.Context, lockKey string) func(context.Context) {
		snap := TrustSnapshot(ctx, r.Env, o.Preflight, o.CMFlagsFiles, log)
		return func(ctx context.Context) { r.writeTrust(ctx, client, log, lockKey, snap) }
	}
	locker := &etcdLocker{cli: client, cfg: lock.Config{
		Name: o.LockName, TTL: o.TTL, OpTimeout: r.Etcd.CommandTimeout,
		Info: lock.Info{Host: r.Host, PID: os.Getpid(), Started: time.Now().UTC(), Version: version.Version},
	}}
	run := &commandRunner{stdout: r.Stdout, stderr: r.Stderr, timeout: o.RestartTimeout}
	gate := &healthGate{cfg: healthConfig(&o.RestartFlags), backstop: r.Etcd.CommandTimeout, log: log}
	return int(restart.New(cfg, locker, run, gate, holds).Run(ctx, r.Force))
}

// etcdLocker opens lock sessions on etcd.
type etcdLocker struct {
	cli *clientv3.Client
	cfg lock.Config
}

func (l *etcdLocker) Open(ctx context.Context) (restart.Session, error) {
	s, err := lock.Open(ctx, l.cli, l.cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}

func (l *etcdLocker) Holder(ctx context.Context) string {
	qctx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	q, _, err := lock.Queue(qctx, l.cli, l.cfg.Name)
	if err != nil || len(q) == 0 {
		return restart.HolderUnknown
	}
	// The key and lease alone do not say what to do about a holder whose
	// host is gone: wait for its lease, which etcd says how long is left.
	_ = lock.FillTTL(qctx, l.cli, &q[0])
	// Who, when its lock frees itself if its host is gone, where to look.
	line := q[0].String()
	if a := q[0].Advice(); a != "" {
		line += "; " + a
	}
	return line + "; `kube-apiserver-safe-restart status` shows the queue"
}

// commandRunner runs the restart command with the shared runner: its own
// process group under a group guard (internal/groupguard; the binary is it, saferestart.Main) that the kernel signals when
// this process dies, and which then kills the whole group, so that a killed
// helper never leaves a restart running while the next host takes the
// lock; output passed through redacted. Each attempt starts its guard when
// the lock is held: starting it earlier saved milliseconds on a restart
// that takes tens of seconds, for a hand-over protocol of its own.
type commandRunner struct {
	stdout, stderr io.Writer
	timeout        time.Duration
}

func (r *commandRunner) Start(argv, env []string) (restart.Process, error) {
	// env is the guard's, which the command inherits: on no command line.
	p, w, err := groupguard.Start(context.Background(), runner.Spec{
		Argv: argv, Env: env, Stdout: r.stdout, Stderr: r.stderr,
		Timeout: r.timeout, Grace: restart.KillGrace,
	}, groupguard.Options{})
	if err != nil {
		return nil, err
	}
	// The guard's first word: the command runs, or could not start (not
	// found, not executable), which ran nothing and is not a failed
	// restart (that would be retried and stop the line with a hold).
	// Nothing (EOF) is a guard that died first: Wait tells.
	if why, ok := strings.CutPrefix(w.First(), "notrun "); ok {
		<-p.Done()
		return nil, fmt.Errorf("%w: %s: %s", restart.ErrNotStarted, runner.Quote(argv), strings.TrimSpace(why))
	}
	return runnerProcess{Process: p, watch: w}, nil
}

// runnerProcess is a guarded restart command as restart.Process.
type runnerProcess struct {
	*runner.Process
	watch *groupguard.Watch // the guard's report, read as soon as it exits
}

// Wait returns the command's error. A guard that ended without reporting
// how the command ended died on its own (killed by someone): the command's
// group may still run. It is killed and confirmed gone (restart.ErrGuardDied)
// before the helper may release the lock; if that cannot be confirmed
// within restart.KillGrace, the error also wraps restart.ErrGroupAlive, and the
// lock must be kept until its lease runs out.
func (p runnerProcess) Wait() error {
	res := p.Process.Wait()
	err := res.Err
	if p.watch.Reported {
		return err
	}
	if err == nil {
		err = errors.New("the command's group guard ended without reporting the command's end")
	}
	if !res.TimedOut && !res.Terminated {
		err = fmt.Errorf("%w (%w)", restart.ErrGuardDied, err)
	}
	if p.watch.GroupAlive {
		err = fmt.Errorf("%w: %w", restart.ErrGroupAlive, err)
	}
	return err
}

// healthGate is the health package as restart.Gate.
type healthGate struct {
	cfg      health.Config
	backstop time.Duration
	log      logrus.FieldLogger
}

func (g *healthGate) Enabled() bool { return g.cfg.URL != "" }

func (g *healthGate) Probe(ctx context.Context) error { return health.Probe(ctx, g.cfg) }

func (g *healthGate) Wait(ctx context.Context) error {
	// health.Wait enforces --health-timeout itself; this deadline is a backstop.
	gctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout+g.backstop)
	defer cancel()
	err := health.Wait(gctx, g.cfg, g.log)
	if err == nil {
		return nil
	}
	// Restarting again changes none of these.
	final := errors.Is(err, health.ErrUnauthorized) || errors.Is(err, health.ErrConfig) ||
		errors.Is(err, health.ErrJWKS) || errors.Is(err, health.ErrTLS)
	return &restart.GateError{Err: err, Final: final}
}

// wait is one bounded wait of a restart: each, times times.
type wait struct {
	name  string
	each  time.Duration
	times int
}

// waits lists every bounded wait of a restart with these flags, in the
// order the state machine (package restart) meets them; WorstCase is their
// sum. A wait that cannot happen with these flags is listed with its zero
// duration.
func waits(o *cmdkit.Restarting, e *cli.Etcd) []wait {
	n, op := max(o.Attempts, 1), e.CommandTimeout
	var trustRead, hostname, fleet, health time.Duration
	if o.TrustTimeout > 0 {
		trustRead = op
	}
	if o.HostName == "" {
		hostname = fqdn.Timeout
	}
	// The fleet check's wait before queueing (its last read included) and
	// its read under the lock; none without --kubeconfig.
	if o.Kubeconfig != "" {
		fleet = o.FleetTimeout + 2*op
	}
	if o.HealthURL != "" {
		health = o.HealthTimeout + op
	}
	// (The kubelet's back-off in static-pod mode is inside
	// --restart-timeout: the static-pod restart is the command.)
	return []wait{
		{"etcd connection (--dial-timeout)", e.DialTimeout, 1},
		{"preflight (before queueing, and before each attempt)", restart.PreflightTimeout, n + 1},
		{"hostname -f (no --host)", hostname, 1},
		{"health gate probe of the running apiserver", op, 1},
		{"hold check before queueing", op, 1},
		{"trust gate: read key trust", trustRead, 1},
		{"trust gate: wait for every host to trust the new signing key (--trust-timeout)", o.TrustTimeout, 1},
		{"fleet check: wait for the other apiservers (--fleet-timeout)", fleet, 1},
		{"etcd session and the hold check under the lock", op, 2},
		{"lock wait (--lock-timeout)", o.LockTimeout, 1},
		{"restart intent write and delete", op, 2},
		{"restart command (--restart-timeout) and its kill grace", o.RestartTimeout + restart.KillGrace, n},
		{"health gate (--health-timeout and its backstop)", health, n},
		{"pause between attempts (--retry-delay)", o.RetryDelay, n - 1},
		{"trust record write", op, 1},
		{"hold write, retried while etcd is away", restart.HoldRetry + op, 1},
		{"unlock and lease revoke", op, 2},
	}
}

// WorstCase is the longest a restart with these flags can take, so that a
// caller's timeout (confd's reload_cmd_timeout, a unit's TimeoutStartSec)
// can be set above it: the sum of its waits.
func WorstCase(o *cmdkit.Restarting, e *cli.Etcd) time.Duration {
	var sum time.Duration
	for _, w := range waits(o, e) {
		sum += w.each * time.Duration(w.times)
	}
	return sum
}

// dryRun runs preflight (there is no state machine to), then reports what
// a restart would do, and how long it could take at worst (for confd's
// reload_cmd_timeout). It takes no lock and runs nothing.
func (r *restarter) dryRun(ctx context.Context, cli *clientv3.Client, holds *hold.Store) int {
	o := r.o
	pctx, cancel := context.WithTimeout(ctx, restart.PreflightTimeout)
	defer cancel()
	if err := preflight.Run(pctx, cmdkit.PreflightInput(o.Preflight, o.SigningKey, func(err error) { r.Log.Warnf("preflight: %v", err) })); err != nil {
		for _, e := range cmdkit.SplitErrors(err) {
			r.Log.Errorf("preflight: %v", e)
		}
		return cmdkit.ExitPreflight
	}
	qctx, cancel := r.OpCtx(ctx)
	defer cancel()
	q, _, err := lock.Queue(qctx, cli, o.LockName)
	if err != nil {
		r.Log.WithError(r.Etcd.Err(err)).Error("dry run: read the lock")
		return cmdkit.ExitError
	}
	h, err := holds.Get(qctx)
	if err != nil {
		r.Log.WithError(r.Etcd.Err(err)).Error("dry run: read the hold")
		return cmdkit.ExitError
	}
	if h != nil && !o.IgnoreHold {
		r.Log.WithField("hold_key", o.HoldKeyOrDefault()).Errorf("hold active: set by %s; a restart would be refused", h)
		return cmdkit.ExitHold
	}
	worst := WorstCase(o, r.Etcd)
	type part struct {
		Name    string `json:"name"`
		Times   int    `json:"times"`
		Seconds int64  `json:"seconds"`
	}
	var parts []part
	for _, w := range waits(o, r.Etcd) {
		if total := w.each * time.Duration(w.times); total > 0 {
			parts = append(parts, part{w.name, w.times, int64(total.Round(time.Second) / time.Second)})
		}
	}
	if r.output == "json" {
		plan := map[string]any{
			"dry_run":            true,
			"preflight_files":    len(o.PreflightFiles) + len(o.PreflightFlagsFiles),
			"lock":               o.LockName,
			"ttl_seconds":        o.TTL,
			"lock_timeout":       o.LockTimeout.String(),
			"queue_length":       len(q),
			"command":            o.Argv,
			"restart_timeout":    o.RestartTimeout.String(),
			"attempts":           o.Attempts,
			"health_url":         o.HealthURL,
			"hold_key":           o.HoldKeyOrDefault(),
			"hold":               h,
			"worst_case":         worst.String(),
			"worst_case_seconds": int64(worst.Round(time.Second) / time.Second),
			"worst_case_parts":   parts,
		}
		enc := json.NewEncoder(r.Stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(plan); err != nil {
			return cmdkit.ExitError
		}
		return cmdkit.ExitOK
	}
	w := r.Stdout
	fmt.Fprintln(w, "dry run: no lock taken, nothing run")
	fmt.Fprintf(w, "preflight: passed (%d files)\n", len(o.PreflightFiles)+len(o.PreflightFlagsFiles))
	if h != nil {
		fmt.Fprintf(w, "hold: ACTIVE at %s, ignored (--ignore-hold): %s\n", o.HoldKeyOrDefault(), h)
	} else {
		fmt.Fprintf(w, "hold: none at %s\n", o.HoldKeyOrDefault())
	}
	if len(q) == 0 {
		fmt.Fprintf(w, "would take lock %s (free now; TTL %ds)\n", o.LockName, o.TTL)
	} else {
		fmt.Fprintf(w, "would queue for lock %s behind %d (holder %s), waiting up to %s\n", o.LockName, len(q), q[0], o.LockTimeout)
	}
	fmt.Fprintf(w, "would run: %s (timeout %s, up to %d attempts)\n", runner.Quote(o.Argv), o.RestartTimeout, o.Attempts)
	if o.HealthURL == "" {
		fmt.Fprintln(w, "health gate: off")
	} else {
		fmt.Fprintf(w, "would hold the lock until %s is ready (settle %s, timeout %s)\n", o.HealthURL, o.HealthSettle, o.HealthTimeout)
	}
	fmt.Fprintf(w, "on failure: would write a hold at %s\n", o.HoldKeyOrDefault())
	fmt.Fprintf(w, "worst case: %s (%.0f seconds); set confd's reload_cmd_timeout and the unit's TimeoutStartSec above it. It adds up:\n", worst, worst.Seconds())
	for _, p := range parts {
		fmt.Fprintf(w, "  %6ds  %s", p.Seconds, p.Name)
		if p.Times > 1 {
			fmt.Fprintf(w, " (%d times)", p.Times)
		}
		fmt.Fprintln(w)
	}
	return cmdkit.ExitOK
}

// healthConfig is the gate's configuration from the command line.
func healthConfig(o *cmdkit.RestartFlags) health.Config {
	return health.Config{
		URL: o.HealthURL, CACert: o.HealthCACert, Cert: o.HealthCert, Key: o.HealthKey, TokenFile: o.HealthToken,
		Settle: o.HealthSettle, Timeout: o.HealthTimeout, Interval: o.HealthInterval, JWKSKeyFiles: o.JWKSKeyFiles,
	}
}
