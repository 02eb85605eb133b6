package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/keysync/confd/internal/tlsconf"
)

// app is one invocation.
type app struct {
	o      *options
	stdout io.Writer
	stderr io.Writer
	log    *logrus.Logger
	host   string
}

// run is main without the process: ctx ending means SIGTERM/SIGINT.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, fs, err := parseArgs(args, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", progName, err, progName)
		return exitUsage
	}
	if o.help {
		writeHelp(stdout, fs)
		return exitOK
	}
	log, err := newLogger(stderr, o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", progName, err)
		return exitUsage
	}
	a := &app{o: o, stdout: stdout, stderr: stderr, log: log, host: hostname()}
	switch o.sub {
	case cmdVersion:
		fmt.Fprintf(stdout, "%s %s\n", progName, Version)
		return exitOK
	case cmdCheck:
		return a.check(ctx)
	case cmdStatus:
		return a.withClient(ctx, a.status)
	case cmdHold:
		return a.withClient(ctx, a.setHold)
	case cmdUnhold:
		return a.withClient(ctx, a.unhold)
	default:
		return a.restart(ctx)
	}
}

func newLogger(w io.Writer, level, format string) (*logrus.Logger, error) {
	log := logrus.New()
	log.Out = w
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: %v", level, err)
	}
	log.SetLevel(lvl)
	switch format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, DisableColors: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
	return log, nil
}

func (a *app) withClient(ctx context.Context, f func(context.Context, *clientv3.Client) int) int {
	cli, err := a.etcdClient()
	if err != nil {
		a.log.WithError(err).Error("etcd client")
		return exitError
	}
	defer cli.Close()
	return f(ctx, cli)
}

// etcdClient builds a client from the etcd flags. Dialing is lazy: errors
// show on the first request, which always carries a deadline.
func (a *app) etcdClient() (*clientv3.Client, error) {
	o := a.o
	cfg := clientv3.Config{
		Endpoints:   o.endpoints,
		DialTimeout: o.dialTimeout,
		Logger:      zap.NewNop(),
	}
	tlsNeeded := o.cacert != "" || o.cert != ""
	for _, e := range o.endpoints {
		tlsNeeded = tlsNeeded || strings.HasPrefix(e, "https://")
	}
	if tlsNeeded {
		if o.key != "" && o.cert == "" {
			return nil, fmt.Errorf("--key %s given without --cert", o.key)
		}
		tc, err := tlsconf.Client(o.cacert, o.cert, o.key)
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (--cacert, --cert, --key): %w", err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(o.endpoints, ","), err)
	}
	return cli, nil
}

// opCtx is the context of one etcd request: --command-timeout, not cut
// short by a signal (cleanup after a signal must still reach etcd).
func (a *app) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), a.o.commandTimeout)
}

// etcdErr names the endpoints in an etcd error, so that "context deadline
// exceeded" says where it could not get to.
func (a *app) etcdErr(err error) error {
	return fmt.Errorf("etcd %s: %w", strings.Join(a.o.endpoints, ","), err)
}
