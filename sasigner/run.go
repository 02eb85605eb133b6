package sasigner

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/keysync/confd/internal/cli"
)

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
