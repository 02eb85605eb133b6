// Command confd renders configuration files from etcd v3 (or the
// environment, or YAML files) through templates, as kelseyhightower/confd
// 0.16 did, and replaces a live file only after its check passed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/authoring"
	"github.com/keysync/confd/backends/connect"
	"github.com/keysync/confd/daemon"
	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/groupguard"
	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/internal/sdnotify"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/metrics"
	"github.com/keysync/confd/resource"
	"github.com/keysync/confd/template"
)

// gcPercent is the garbage collector's target (GOGC) unless the environment
// sets one. Go's default, 100, lets the heap grow to twice what is live:
// a render of 100k keys then peaked at 51 MB; at 50 it peaks at 46 MB for
// the same time (median of 9 runs, 0.30 s either way), and confd's data is
// mostly strings the collector need not scan.
const gcPercent = 50

func main() {
	if len(os.Args) > 1 && os.Args[1] == groupguard.Arg {
		// This process is a command's group guard (see settings).
		os.Exit(groupguard.Main("confd", os.Args[2:]))
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	os.Exit(run(sigs, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2 // bad flags or configuration, or nothing to process
)

// run is main without the process: it returns the exit code. The first
// SIGTERM/SIGINT on sigs stops new passes and commands from starting; a
// second ends running commands at once. SIGHUP re-reads the configuration.
func run(sigs <-chan os.Signal, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c, log, code := configure(args, stdout, stderr, getenv)
	if log == nil {
		return code
	}
	stopCtx, stop := context.WithCancel(context.Background())
	defer stop()
	loader := &resourceLoader{log: log, args: args, stdout: stdout, stderr: stderr, getenv: getenv, cfg: c, stop: stopCtx.Done()}
	// One bound on commands across groups for the process's life: a
	// SIGHUP's new resources share it with the old ones still running.
	limits := daemon.NewLimits(c.MaxCommands, stopCtx.Done(), log)
	// check_cmd and reload_cmd do not outlive confd: a guard gives their
	// group SIGTERM, then SIGKILL after -command-grace, when confd dies;
	// and the next confd's run of the same command waits for the old one
	// to be gone.
	loader.runner = limits.Runner(groupguard.Runner{LockDir: commandLockDir(getenv), Waiting: func(cmd string) {
		log.Warnf("%s: waiting for an earlier run of this command to end (left by a confd that died; it gets SIGTERM, then SIGKILL after -command-grace)", cmd)
	}}.Run)
	if c.SecretKeyring != "" {
		kr, err := template.ReadKeyring(c.SecretKeyring)
		if err != nil {
			log.Error(err.Error())
			return exitUsage
		}
		loader.keyring = kr
	}
	switch {
	case c.CheckConfig:
		return authoring.Check(stopCtx, authoring.CheckOptions{
			Config: authoring.ConfigFile{
				Path: c.ConfigFile, Required: c.ConfigFile != defaultConfigFile, Set: checkFileKey,
			},
			Settings: *loader.settings(c), Resources: c.Resources, Out: stdout,
			Validate: func() error { return validate(c) },
		})
	case c.Validate:
		return authoring.Validate(stopCtx, authoring.ValidateOptions{
			MockData: c.MockData, Settings: *loader.settings(c), Resources: c.Resources,
			Noop: c.Noop, Out: stdout, Log: log,
		})
	}
	log.Infof("Starting confd %s", version.Version)
	cmdCtx, kill := context.WithCancel(context.Background())
	defer kill()
	hup := make(chan struct{}, 1)
	go func() {
		stopping := false
		for s := range sigs {
			switch {
			case s == syscall.SIGHUP:
				select {
				case hup <- struct{}{}:
				default:
				}
			case !stopping:
				stopping = true
				log.Info(stoppingMessage(c, s))
				stop()
			case c.OneTime:
				log.Warnf("%v again: the running command already got SIGTERM; it gets SIGKILL when -command-grace (%s) ends", s, c.CommandGrace)
			default:
				log.Warnf("%v again: ending running commands now", s)
				kill()
			}
		}
	}()

	procs, loadErrs := loader.load(loader.settings(c))
	if len(procs) == 0 && (!c.OneTime || loadErrs == 0) {
		// -onetime too (confd 0.16 exited 0): a run that did nothing
		// because it found nothing is a configuration error, not success.
		// (A -onetime whose resources all failed to load exits 1 below.)
		log.Error(nothingToProcess(filepath.Join(c.ConfDir, "conf.d"), loadErrs))
		return exitUsage
	}
	if !c.KeepStageFile && !c.Noop {
		// What a killed confd left beside each destination.
		removed, errs := apply.RemoveStaleStageFiles(loader.current, c.LockDir)
		for _, f := range removed {
			log.Infof("%s: removed stale stage file %s left by an earlier confd", f.Resource.File, f.Path)
		}
		for _, err := range errs {
			log.Warn(err.Error())
		}
	}

	dialCtx, cancel := context.WithTimeout(stopCtx, c.Store.DialTimeout+time.Second)
	store, err := connect.New(dialCtx, c.Store)
	cancel()
	if err != nil {
		log.Error(startError(c.Store.Backend, err))
		return exitFail
	}
	defer store.Close()

	if c.OneTime {
		// The first signal cancels stopCtx: no further resource starts, and
		// a running command gets SIGTERM and -command-grace; a reload that
		// does not finish stays owed for the next run.
		if err := daemon.Once(stopCtx, procs, store, log); err != nil || loadErrs > 0 {
			return exitFail
		}
		return exitOK
	}

	var observer daemon.Observer = daemon.NopObserver{}
	if c.MetricsAddr != "" {
		names := make([]string, len(procs))
		for i, p := range procs {
			names[i] = p.Name()
		}
		m := metrics.New(names...)
		srv, err := m.Serve(c.MetricsAddr, log)
		if err != nil {
			log.Errorf("-metrics-addr %s: %v", c.MetricsAddr, err)
			return exitUsage
		}
		defer srv.Close()
		log.Infof("Serving /metrics, /healthz and /readyz on %s", srv.Addr())
		observer = m
	}
	if n := sdnotify.New(getenv, log); n != nil {
		defer n.Stopping()
		go n.Watchdog(stopCtx)
		observer = sdObserver{Observer: observer, n: n}
	}
	first := true
	o := daemon.Options{
		Load: func(full bool) daemon.Plan {
			if first {
				first = false
				return daemon.Plan{Procs: procs, Wait: c.Wait, Resync: c.Resync}
			}
			return loader.reload(full)
		},
		Store:    store,
		Interval: time.Duration(c.Interval) * time.Second,
		Log:      log,
		Observer: observer,
		Commands: cmdCtx,
		Limits:   limits,
	}
	if c.Watch {
		ws, ok := store.(daemon.WatchStore)
		if !ok {
			log.Errorf("-watch: backend %s cannot be watched", c.Store.Backend)
			return exitUsage
		}
		o.Watch = ws
	}
	d := daemon.New(o)
	go func() {
		for range hup {
			d.Reload()
		}
	}()
	if err := d.Run(stopCtx); err != nil {
		log.Error(err.Error())
		if errors.Is(err, daemon.ErrNothingToProcess) {
			return exitUsage
		}
		return exitFail
	}
	log.Info("confd stopped")
	return exitOK
}

// stoppingMessage is what the first SIGTERM/SIGINT does, as it does it.
func stoppingMessage(c *Config, s os.Signal) string {
	if c.OneTime {
		// -onetime ends a running command at once: see daemon.Once below.
		return fmt.Sprintf("%v: stopping: no further resource starts; a running check_cmd or reload_cmd gets SIGTERM now and SIGKILL after -command-grace (%s); a reload that does not finish is owed to the next run", s, c.CommandGrace)
	}
	return fmt.Sprintf("%v: stopping; no new pass or command starts, a running command may finish (send %v again to end it now)", s, s)
}

// startError is the message for a backend that could not be reached at
// start, when confd exits.
func startError(backend string, err error) string {
	if expired, ok := errors.AsType[*etcdclient.ExpiredError](err); ok {
		// Not "read again on the next connection": there is none, confd
		// stops here.
		return fmt.Sprintf("backend %s: cannot start: client certificate %s expired at %s, and etcd refuses it. Renew the certificate (and its key) on disk, then start confd again; a running confd picks up a renewed certificate by itself",
			backend, expired.File, expired.NotAfter.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("backend %s: %v", backend, err)
}

// nothingToProcess says why no resource loaded from dir, and what to do.
func nothingToProcess(dir string, loadErrs int) string {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return fmt.Sprintf("nothing to process: %s does not exist; create it and put template resources (*.toml) in it, or point -confdir (confd.toml: confdir) at the directory that holds conf.d/", dir)
	}
	if loadErrs > 0 {
		return fmt.Sprintf("nothing to process: every template resource in %s failed to load (errors above); fix them and run confd again", dir)
	}
	return fmt.Sprintf("nothing to process: %s holds no template resource (*.toml); add one, or point -confdir (confd.toml: confdir) at the directory that holds yours", dir)
}

// configure builds the Config from flags, environment and confd.toml. A nil
// logger means: exit now with the returned code.
func configure(args []string, stdout, stderr io.Writer, getenv func(string) string) (*Config, *logrus.Logger, int) {
	c := &Config{}
	// pflag prints nothing itself: errors go to stderr below, --help's
	// usage to stdout (it is the output asked for; confd 0.16 wrote it to
	// stderr).
	fset := newFlagSet(c, io.Discard)
	if err := parseFlags(fset, args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fset.SetOutput(stdout)
			fset.Usage()
			return nil, nil, 0
		}
		fmt.Fprintf(stderr, "confd: %v\n", err)
		return nil, nil, 2
	}
	if fset.NArg() > 0 {
		fmt.Fprintf(stderr, "confd: unexpected argument %q (confd takes flags only)\n", fset.Arg(0))
		return nil, nil, 2
	}
	if c.PrintVersion {
		// The first line as it always was (scripts read it), then the
		// commit and its date.
		fmt.Fprintf(stdout, "confd %s (compatible with confd 0.16)\n%s", version.Version, version.Details())
		return nil, nil, 0
	}
	// A first logger for config-file warnings; the configured one replaces it.
	log, err := logfmt.New(stderr, c.LogLevel, c.LogFormat, false)
	if err != nil {
		log, _ = logfmt.New(stderr, "", "", false)
	}
	if c.CheckConfig {
		// -check-config reports confd.toml's problems itself, every one
		// with its line, rather than stopping at the first here.
		log.SetOutput(io.Discard)
	}
	if err := applyFileAndEnv(fset, c, getenv, log); err != nil && !c.CheckConfig {
		// One log line per problem (every unknown key is reported), each
		// with its own level and time, as grep and journalctl expect.
		var joined interface{ Unwrap() []error }
		if errors.As(err, &joined) {
			for _, e := range joined.Unwrap() {
				log.Error(e.Error())
			}
		} else {
			log.Error(err.Error())
		}
		return nil, nil, 2
	}
	if log, err = logfmt.New(stderr, c.LogLevel, c.LogFormat, false); err != nil {
		fmt.Fprintf(stderr, "confd: %v\n", err)
		return nil, nil, 2
	}
	err = authoringFlags(c)
	if err == nil && !c.CheckConfig && !c.Validate {
		// -check-config and -validate contact no store, so the store
		// settings cannot stop them; -check-config reports validate's
		// verdict as a problem.
		err = validate(c)
	}
	if err != nil {
		log.Error(err.Error())
		return nil, nil, 2
	}
	return c, log, 0
}

// resourceLoader reads conf.d (and, on SIGHUP, confd.toml). A reload still
// owed is recorded on disk beside its destination, so a re-read resource
// picks it up by itself.
type resourceLoader struct {
	log            logrus.FieldLogger
	args           []string
	stdout, stderr io.Writer
	getenv         func(string) string
	cfg            *Config
	keyring        *template.Keyring // -secret-keyring, read once at start
	renderer       template.Renderer // keeps parses across passes and SIGHUPs
	stop           <-chan struct{}   // closed by the first SIGTERM/SIGINT
	runner         apply.Runner      // bounds commands (-max-commands); nil: the plain runner
	current        []*resource.Resource
}

func (l *resourceLoader) settings(c *Config) *apply.Settings {
	return &apply.Settings{
		Settings: resource.Settings{ConfDir: c.ConfDir, Prefix: c.Prefix, CheckTimeout: c.CheckCmdTimeout,
			ReloadTimeout: c.ReloadCmdTimeout, Log: l.log},
		Noop: c.Noop, SyncOnly: c.SyncOnly, KeepStageFile: c.KeepStageFile, DiffOut: l.stdout,
		CommandGrace: c.CommandGrace, CommandEnv: runner.WithoutVars(os.Environ(), commandSecretEnv...), DestLockTimeout: c.DestLockTimeout,
		LockDir:         c.LockDir,
		NoopShowSecrets: c.NoopShowSecrets, Keyring: l.keyring, Stop: l.stop,
		Renderer: &l.renderer, Runner: l.runner,
	}
}

// commandLockDir is where the commands' locks are: systemd's
// RuntimeDirectory when the unit has one, else a directory of this user's
// in the temporary directory.
func commandLockDir(getenv func(string) string) string {
	if d := getenv("RUNTIME_DIRECTORY"); d != "" {
		return filepath.Join(strings.Split(d, ":")[0], "commands")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("confd-%d-commands", os.Geteuid()))
}

// reload re-reads conf.d and, when full (SIGHUP), confd.toml first. A
// confd.toml that no longer parses keeps the running configuration.
func (l *resourceLoader) reload(full bool) daemon.Plan {
	if full {
		c, log, _ := configure(l.args, io.Discard, l.stderr, l.getenv)
		if log == nil {
			// Nothing is re-read, conf.d neither: a half-applied reload
			// would mix two configurations.
			l.log.Errorf("SIGHUP: %s is unusable (error above): nothing was re-read; confd goes on with the configuration and resources it had. Fix the file, check it with `confd -check-config`, and send SIGHUP again", l.cfg.ConfigFile)
			return daemon.Plan{Keep: true}
		}
		if fmt.Sprint(c.Store) != fmt.Sprint(l.cfg.Store) {
			l.log.Warn("SIGHUP: backend settings changed; restart confd to apply them")
		}
		if c.MaxCommands != l.cfg.MaxCommands {
			l.log.Warnf("SIGHUP: -max-commands changed to %d; restart confd to apply it (still %d)", c.MaxCommands, l.cfg.MaxCommands)
		}
		l.cfg.ConfDir, l.cfg.Prefix, l.cfg.Wait, l.cfg.Resync = c.ConfDir, c.Prefix, c.Wait, c.Resync
		l.cfg.CheckCmdTimeout, l.cfg.ReloadCmdTimeout, l.cfg.CommandGrace = c.CheckCmdTimeout, c.ReloadCmdTimeout, c.CommandGrace
		l.cfg.DestLockTimeout, l.cfg.LockDir = c.DestLockTimeout, c.LockDir
	}
	procs, _ := l.load(l.settings(l.cfg))
	return daemon.Plan{Procs: procs, Wait: l.cfg.Wait, Resync: l.cfg.Resync}
}

// load returns the resources that loaded and logs, and counts, those that did not.
func (l *resourceLoader) load(s *apply.Settings) ([]daemon.Processor, int) {
	fs, errs := apply.LoadNamed(s, l.cfg.Resources)
	for _, err := range errs {
		l.log.Error(err.Error())
	}
	ps := make([]daemon.Processor, len(fs))
	l.current = make([]*resource.Resource, len(fs))
	for i, f := range fs {
		ps[i], l.current[i] = f, f.Resource
	}
	return ps, len(errs)
}

// sdObserver tells systemd about readiness, after the observer it wraps
// (the metrics, or none); the rest of daemon.Observer is nothing systemd
// needs to hear.
type sdObserver struct {
	daemon.Observer
	n *sdnotify.Notifier
}

func (o sdObserver) Ready(ready bool) {
	o.Observer.Ready(ready)
	o.n.Ready(ready)
}
