package saferestart

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/version"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// app is one invocation.
type app struct {
	o *options
	// force closes on the second SIGTERM/SIGINT: stop the command now.
	force  <-chan struct{}
	stdout io.Writer
	stderr io.Writer
	log    *logrus.Logger
	host   string
	// fqdn is `hostname -f`, once asked (trustHost).
	fqdn string
}

// run is main without the process: ctx ending means the first SIGTERM,
// SIGINT, SIGHUP or SIGQUIT; force closing means a second one.
func run(ctx context.Context, force <-chan struct{}, args []string, stdout, stderr io.Writer) int {
	p := &cli.Program{Name: progName, Stdout: stdout, Stderr: stderr, LookupEnv: os.LookupEnv, DefaultConfig: defaultConfig}
	o := &options{}
	root := newRoot(p, o, func(o *options) int {
		log, err := o.Logger(stderr, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", progName, err)
			return exitUsage
		}
		// Holds and lock entries name the host as --host does, so that a
		// hold reads like the trust records and the published keys of
		// that host.
		host := o.trustHostName
		if host == "" {
			host = hostname()
		}
		a := &app{o: o, force: force, stdout: stdout, stderr: stderr, log: log, host: host}
		code := a.run(ctx)
		a.writeTextfile(code)
		return code
	})
	root.SetContext(ctx)
	args, err := cli.Dispatch(root, args, cmdRestart)
	if err != nil {
		return p.Fail(err)
	}
	return p.Execute(root, args)
}

func (a *app) run(ctx context.Context) int {
	switch a.o.sub {
	case cmdVersion:
		fmt.Fprint(a.stdout, version.Text(progName))
		return exitOK
	case cmdCheck:
		return a.check(ctx)
	case cmdStatus:
		return a.withClient(ctx, a.status)
	case cmdHold:
		return a.withClient(ctx, a.setHold)
	case cmdUnhold:
		return a.withClient(ctx, a.unhold)
	case cmdTrust:
		return a.withClient(ctx, a.showTrust)
	case cmdWaitTrusted:
		return a.waitTrusted(ctx)
	case cmdRotateKey:
		return a.withClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
			return (&keyRotation{a: a, cli: cli}).rotateKey(ctx, cli)
		})
	case cmdRetireKeys:
		return a.withClient(ctx, func(ctx context.Context, cli *clientv3.Client) int {
			return (&keyRotation{a: a, cli: cli}).retireKeys(ctx, cli)
		})
	case cmdPublishKey:
		if a.o.watch {
			return a.withClient(ctx, (&publisher{a: a}).publishWatch)
		}
		return a.withClient(ctx, (&publisher{a: a}).publishKey)
	case cmdForgetHost:
		return a.withClient(ctx, a.forgetHost)
	case cmdConfig:
		return a.showConfig(a.stdout, a.o.flags)
	default:
		return (&restarter{a: a}).restart(ctx)
	}
}

func (a *app) withClient(ctx context.Context, f func(context.Context, *clientv3.Client) int) int {
	cli, err := a.etcdClient(ctx)
	if err != nil {
		a.log.WithError(a.etcdErr(err)).Error(etcdConnectFailed)
		return exitError
	}
	defer cli.Close()
	return f(ctx, cli)
}

func (a *app) etcdClient(ctx context.Context) (*clientv3.Client, error) { return a.o.Client(ctx) }

// opCtx is the context of one etcd request: --command-timeout, not cut
// short by a signal (cleanup after a signal must still reach etcd).
func (a *app) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), a.o.CommandTimeout)
}

// etcdConnectFailed is the message of a failed connection to etcd.
const etcdConnectFailed = cli.ConnectFailed

// etcdErr names the endpoints in an etcd error and where they came from.
func (a *app) etcdErr(err error) error { return a.o.Etcd.Err(err) }
