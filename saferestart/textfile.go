package saferestart

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/saferestart/internal/textfile"
)

func metricsTextfileFlag(o *options, fs *pflag.FlagSet) {
	fs.StringVar(&o.metricsTextfile, "metrics-textfile", "", "restart, rotate-key: at exit, write when the command ended and its exit code (kube_apiserver_safe_restart_last_run_timestamp_seconds{command}, ..._last_run_exit_code{command}) to this node_exporter textfile (a .prom file in its --collector.textfile.directory), atomically, keeping the other command's lines; not with --dry-run")
}

// writeTextfile records the run's end in --metrics-textfile. A failure is
// logged and changes no exit code: the restart's outcome stands.
func (a *app) writeTextfile(code int) {
	o := a.o
	if o.metricsTextfile == "" || o.dryRun || (o.sub != cmdRestart && o.sub != cmdRotateKey) {
		return
	}
	if err := textfile.Write(o.metricsTextfile, o.sub, code, time.Now()); err != nil {
		a.log.WithError(err).Warn("cannot record this run for node_exporter")
	}
}
