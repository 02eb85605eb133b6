// Package sasigner is the command line of kube-apiserver-sa-signer,
// kube-apiserver's external
// service-account token signer (--service-account-signing-endpoint): it
// signs with this master's key and serves every key the masters publish in
// etcd as verification keys, so key changes need no apiserver restart.
// See docs/signer.md.
package sasigner

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/keysync/confd/internal/cli"
)

// Main runs the command with os.Args and returns its exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return run(ctx, os.Args[1:], os.LookupEnv, hup, os.Stdout, os.Stderr)
}

// run is main without the process: ctx ends at SIGTERM or SIGINT; hup
// delivers SIGHUP (re-read the signing key).
func run(ctx context.Context, args []string, env func(string) (string, bool), hup <-chan os.Signal, stdout, stderr io.Writer) int {
	p := &cli.Program{Name: progName, Stdout: stdout, Stderr: stderr, LookupEnv: env, DefaultConfig: defaultConfig}
	o := &options{gid: -1}
	cmd := newCommand(p, o, func(o *options) int {
		log, err := o.Logger(stderr, os.Getenv)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", progName, err)
			return cli.ExitUsage
		}
		if err := serve(ctx, o, log, hup); err != nil {
			log.WithError(err).Error("stopped")
			return cli.ExitError
		}
		return cli.ExitOK
	})
	cmd.SetContext(ctx)
	return p.Execute(cmd, args)
}
