package saferestart

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/keysync/confd/internal/logfmt"
	"github.com/keysync/confd/internal/version"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
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
	// Holds and lock entries name the host as --host does, so that a hold
	// reads like the trust records and the published keys of that host.
	host := o.trustHostName
	if host == "" {
		host = hostname()
	}
	a := &app{o: o, force: force, stdout: stdout, stderr: stderr, log: log, host: host}
	switch o.sub {
	case cmdVersion:
		fmt.Fprintf(stdout, "%s %s\n", progName, version.Version)
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
		return a.withClient(ctx, a.waitTrusted)
	case cmdRotateKey:
		return a.withClient(ctx, a.rotateKey)
	case cmdRetireKeys:
		return a.withClient(ctx, a.retireKeys)
	case cmdPublishKey:
		return a.withClient(ctx, a.publishKey)
	case cmdConfig:
		return a.showConfig(stdout, fs)
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
	if logfmt.UnderConfd(os.Getenv) {
		// Run as confd's check_cmd or reload_cmd: confd logs each of our
		// lines under its own prefix (time, host, confd[pid]), so ours
		// carry neither time nor host, in confd's format.
		child, err := logfmt.NewChild(w, level, format)
		if err != nil {
			return nil, err
		}
		return child, nil
	}
	log.SetFormatter(logfmt.Redacting(log.Formatter))
	return log, nil
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

// etcdClient connects with the builder confd uses, so that a failure says
// why (refused, unknown authority, bad credentials) within --dial-timeout.
func (a *app) etcdClient(ctx context.Context) (*clientv3.Client, error) {
	o := a.o
	return etcdclient.New(ctx, etcdclient.Config{
		Nodes: o.endpoints, ClientCAKeys: o.cacert, ClientCert: o.cert, ClientKey: o.key,
		Username: o.user, Password: o.password, DialTimeout: o.dialTimeout, RequestTimeout: o.commandTimeout,
	})
}

// opCtx is the context of one etcd request: --command-timeout, not cut
// short by a signal (cleanup after a signal must still reach etcd).
func (a *app) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), a.o.commandTimeout)
}

// etcdConnectFailed is the message of a failed connection to etcd.
const etcdConnectFailed = "cannot connect to etcd: check --endpoints (or ETCDCTL_ENDPOINTS) or endpoints in the configuration file, the TLS and auth settings, and that etcd runs there"

// etcdErr names the endpoints in an etcd error and where they came from
// (--endpoints, ETCDCTL_ENDPOINTS or the default), so that "context
// deadline exceeded" says where it could not get to and which setting to
// fix. The client's own "etcd ENDPOINTS: " prefix is not repeated, nor,
// with one endpoint, the endpoint before each cause.
func (a *app) etcdErr(err error) error {
	if err == nil {
		return nil
	}
	eps := a.o.endpoints
	msg := err.Error()
	// The client names endpoints given without a scheme with the one it
	// dialled.
	for _, scheme := range []string{"https://", "http://", ""} {
		named := make([]string, len(eps))
		for i, ep := range eps {
			named[i] = ep
			if !strings.Contains(ep, "://") {
				named[i] = scheme + ep
			}
		}
		msg = strings.TrimPrefix(msg, "etcd "+strings.Join(named, ", ")+": ")
		// (Not a bare host:port: "dial tcp HOST:PORT: ..." keeps it.)
		if len(eps) == 1 && strings.Contains(named[0], "://") {
			msg = strings.ReplaceAll(msg, named[0]+": ", "")
		}
	}
	from := a.o.endpointsFrom
	if from == "" {
		from = endpointsDefault
	}
	return &etcdError{msg: fmt.Sprintf("etcd %s (%s): %s", strings.Join(eps, ","), from, msg), err: err}
}

// etcdError is an etcd error reworded by etcdErr; errors.Is still sees
// the cause.
type etcdError struct {
	msg string
	err error
}

func (e *etcdError) Error() string { return e.msg }
func (e *etcdError) Unwrap() error { return e.err }
