// Package cmdkit is what the subcommands of kube-apiserver-safe-restart
// share: the environment a command runs in (output, logger, etcd, this
// host's names), the flag groups and their checks, the one function
// registering a command's flags, the exit codes, and the key-record
// helpers several commands use.
package cmdkit

import (
	"cmp"
	"context"
	"io"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/fqdn"
)

// Env is what every command runs with: its output, its logger, this
// host's names, its etcd connection settings.
type Env struct {
	Etcd *cli.Etcd
	// Force closes on the second SIGTERM/SIGINT: stop the command now.
	Force  <-chan struct{}
	Stdout io.Writer
	Stderr io.Writer
	Log    *logrus.Logger
	// Host names this host in holds and lock entries: --host, else the
	// kernel's host name.
	Host string
	// HostFlag is --host, when the command has it.
	HostFlag string
	// fqdn is `hostname -f`, once asked (TrustHost).
	fqdn string
	// Dial connects to etcd (Etcd.Client; tests count the connections).
	Dial func(context.Context) (*clientv3.Client, error)
}

// NewEnv is the environment of a command whose --host is hostFlag ("" when
// it has none).
func NewEnv(s *Shared, hostFlag string, stdout, stderr io.Writer, log *logrus.Logger) *Env {
	// Holds and lock entries name the host as --host does, so that a hold
	// reads like the trust records and the published keys of that host.
	return &Env{Etcd: &s.Etcd, Stdout: stdout, Stderr: stderr, Log: log, Dial: s.Etcd.Client, HostFlag: hostFlag, Host: cmp.Or(hostFlag, Hostname())}
}

func (e *Env) WithClient(ctx context.Context, f func(context.Context, *clientv3.Client) int) int {
	c, err := e.Dial(ctx)
	if err != nil {
		e.Log.WithError(e.Etcd.Err(err)).Error(cli.ConnectFailed)
		return ExitError
	}
	defer c.Close()
	return f(ctx, c)
}

// OpCtx is the context of one etcd request: --command-timeout, not cut
// short by a signal (cleanup after a signal must still reach etcd).
func (e *Env) OpCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.Etcd.CommandTimeout)
}

// TrustHost is --host, or this host's FQDN, asked once per run.
func (e *Env) TrustHost(ctx context.Context) string {
	if e.HostFlag != "" {
		return e.HostFlag
	}
	if e.fqdn == "" {
		e.fqdn = fqdn.Lookup(ctx, e.Log, Hostname())
	}
	return e.fqdn
}
