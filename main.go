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
	"syscall"
	"time"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/daemon"
	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/resource"
	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "0.1.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c, log, code := configure(args, stdout, stderr, getenv)
	if log == nil {
		return code
	}
	log.Infof("Starting confd %s", Version)

	settings := &resource.Settings{
		ConfDir: c.ConfDir, Prefix: c.Prefix, Noop: c.Noop, SyncOnly: c.SyncOnly,
		KeepStageFile: c.KeepStageFile, CheckTimeout: c.CheckCmdTimeout,
		ReloadTimeout: c.ReloadCmdTimeout, Log: log, DiffOut: stdout,
		CommandGrace: c.CommandGrace, CommandEnv: commandEnv(os.Environ()),
	}
	loader := &resourceLoader{settings: settings, log: log}
	procs, loadErrs := loader.load()

	dialCtx, cancel := context.WithTimeout(ctx, c.Store.DialTimeout+time.Second)
	store, err := backends.New(dialCtx, c.Store)
	cancel()
	if err != nil {
		log.Errorf("backend %s: %v", c.Store.Backend, err)
		return 1
	}
	defer store.Close()

	switch {
	case c.OneTime:
		if err := daemon.Once(ctx, procs, store, log); err != nil || loadErrs > 0 {
			return 1
		}
		return 0
	case c.Watch:
		daemon.Watch(ctx, procs, store, log)
	default:
		// confd 0.16 re-read conf.d before every interval pass.
		first := true
		next := func() []daemon.Processor {
			if first {
				first = false
				return procs
			}
			ps, _ := loader.load()
			return ps
		}
		daemon.Interval(ctx, next, store, time.Duration(c.Interval)*time.Second, log)
	}
	log.Info("confd stopped")
	return 0
}

// configure builds the Config from flags, environment and confd.toml. A nil
// logger means: exit now with the returned code.
func configure(args []string, stdout, stderr io.Writer, getenv func(string) string) (*Config, *logrus.Logger, int) {
	c := &Config{}
	fset := newFlagSet(c, stderr)
	if err := fset.Parse(normalizeArgs(fset, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
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
		fmt.Fprintf(stdout, "confd %s (compatible with confd 0.16)\n", Version)
		return nil, nil, 0
	}
	// A first logger for config-file warnings; the configured one replaces it.
	log, err := logfmt.New(stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		log, _ = logfmt.New(stderr, "", "")
	}
	if err := applyFileAndEnv(fset, c, getenv, log); err != nil {
		log.Error(err.Error())
		return nil, nil, 2
	}
	if log, err = logfmt.New(stderr, c.LogLevel, c.LogFormat); err != nil {
		fmt.Fprintf(stderr, "confd: %v\n", err)
		return nil, nil, 2
	}
	if err := validate(c); err != nil {
		log.Error(err.Error())
		return nil, nil, 2
	}
	return c, log, 0
}

// resourceLoader reads conf.d. A reload still owed is recorded on disk
// beside its destination, so a re-read resource picks it up by itself.
type resourceLoader struct {
	settings *resource.Settings
	log      logrus.FieldLogger
}

// load returns the resources that loaded and logs, and counts, those that did not.
func (l *resourceLoader) load() ([]daemon.Processor, int) {
	rs, errs := resource.LoadAll(l.settings)
	for _, err := range errs {
		l.log.Error(err.Error())
	}
	ps := make([]daemon.Processor, len(rs))
	for i, r := range rs {
		ps[i] = r
	}
	return ps, len(errs)
}
