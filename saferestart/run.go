package saferestart

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// runWith is main without the process: ctx ending means the first SIGTERM,
// SIGINT, SIGHUP or SIGQUIT; force closing means a second one. dial, when
// not nil, replaces the etcd flags' client (tests).
func runWith(ctx context.Context, force <-chan struct{}, args []string, stdout, stderr io.Writer, dial func(*cli.Etcd, context.Context) (*clientv3.Client, error)) int {
	p := &cli.Program{Name: cmdkit.ProgName, Stdout: stdout, Stderr: stderr, LookupEnv: os.LookupEnv, DefaultConfig: defaultConfig}
	s := &cmdkit.Shared{}
	root := newRoot(p, s, func(name string, o options) int {
		log, err := s.Logger(stderr, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", cmdkit.ProgName, err)
			return cmdkit.ExitUsage
		}
		e := newEnv(s, o, stdout, stderr, log)
		e.Force = force
		if dial != nil {
			e.Dial = func(ctx context.Context) (*clientv3.Client, error) { return dial(&s.Etcd, ctx) }
		}
		code := o.Run(ctx, e)
		writeTextfile(name, o, code, log)
		return code
	})
	root.SetContext(ctx)
	args, err := cli.Dispatch(root, args, cmdRestart)
	if err != nil {
		return p.Fail(err)
	}
	return p.Execute(root, args)
}

// newEnv is the environment command o runs in, with its --host if it has
// one.
func newEnv(s *cmdkit.Shared, o options, stdout, stderr io.Writer, log *logrus.Logger) *cmdkit.Env {
	host := ""
	if h, ok := o.(interface{ HostFlag() string }); ok {
		host = h.HostFlag()
	}
	return cmdkit.NewEnv(s, host, stdout, stderr, log)
}
