package saferestart

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/fqdn"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cmdEnv is what every command runs with: its output, its logger, this
// host's names, its etcd connection settings.
type cmdEnv struct {
	etcd *cli.Etcd
	// force closes on the second SIGTERM/SIGINT: stop the command now.
	force  <-chan struct{}
	stdout io.Writer
	stderr io.Writer
	log    *logrus.Logger
	// host names this host in holds and lock entries: --host, else the
	// kernel's host name.
	host string
	// hostFlag is --host, when the command has it.
	hostFlag string
	// fqdn is `hostname -f`, once asked (trustHost).
	fqdn string
	// dial connects to etcd (etcd.Client; tests count the connections).
	dial func(context.Context) (*clientv3.Client, error)
}

// run is main without the process: ctx ending means the first SIGTERM,
// SIGINT, SIGHUP or SIGQUIT; force closing means a second one.
func run(ctx context.Context, force <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, force, args, stdout, stderr, nil)
}

// runWith is run with dial, when not nil, instead of the etcd flags'
// client.
func runWith(ctx context.Context, force <-chan struct{}, args []string, stdout, stderr io.Writer, dial func(*cli.Etcd, context.Context) (*clientv3.Client, error)) int {
	p := &cli.Program{Name: progName, Stdout: stdout, Stderr: stderr, LookupEnv: os.LookupEnv, DefaultConfig: defaultConfig}
	s := &shared{}
	root := newRoot(p, s, func(_ string, o options) int {
		log, err := s.Logger(stderr, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", progName, err)
			return exitUsage
		}
		e := newCmdEnv(s, o, stdout, stderr, log)
		e.force = force
		if dial != nil {
			e.dial = func(ctx context.Context) (*clientv3.Client, error) { return dial(&s.Etcd, ctx) }
		}
		return o.run(ctx, e)
	})
	root.SetContext(ctx)
	args, err := cli.Dispatch(root, args, cmdRestart)
	if err != nil {
		return p.Fail(err)
	}
	return p.Execute(root, args)
}

// newCmdEnv is the environment command o runs in.
func newCmdEnv(s *shared, o options, stdout, stderr io.Writer, log *logrus.Logger) *cmdEnv {
	e := &cmdEnv{etcd: &s.Etcd, stdout: stdout, stderr: stderr, log: log, dial: s.Etcd.Client}
	// Holds and lock entries name the host as --host does, so that a hold
	// reads like the trust records and the published keys of that host.
	if h, ok := o.(interface{ hostFlag() string }); ok {
		e.hostFlag = h.hostFlag()
	}
	e.host = e.hostFlag
	if e.host == "" {
		e.host = hostname()
	}
	return e
}

func (e *cmdEnv) withClient(ctx context.Context, f func(context.Context, *clientv3.Client) int) int {
	cli, err := e.dial(ctx)
	if err != nil {
		e.log.WithError(e.etcdErr(err)).Error(etcdConnectFailed)
		return exitError
	}
	defer cli.Close()
	return f(ctx, cli)
}

// opCtx is the context of one etcd request: --command-timeout, not cut
// short by a signal (cleanup after a signal must still reach etcd).
func (e *cmdEnv) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.etcd.CommandTimeout)
}

// etcdConnectFailed is the message of a failed connection to etcd.
const etcdConnectFailed = cli.ConnectFailed

// etcdErr names the endpoints in an etcd error and where they came from.
func (e *cmdEnv) etcdErr(err error) error { return e.etcd.Err(err) }

// trustHost is --host, or this host's FQDN, asked once per run.
func (e *cmdEnv) trustHost(ctx context.Context) string {
	if e.hostFlag != "" {
		return e.hostFlag
	}
	if e.fqdn == "" {
		e.fqdn = fqdn.Lookup(ctx, e.log, hostname())
	}
	return e.fqdn
}
