package saferestart

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
	"github.com/keysync/confd/saferestart/internal/textfile"
)

// writeTextfile records how restart or rotate-key ended in
// --metrics-textfile. A failure is logged and changes no exit code: the
// restart's outcome stands.
func writeTextfile(name string, o options, code int, log logrus.FieldLogger) {
	var r *cmdkit.Restarting
	switch c := o.(type) {
	case *restartcmd.Command:
		r = &c.Restarting
	case *keycmd.RotateKey:
		r = &c.Restarting
	}
	if r == nil || r.MetricsTextfile == "" || r.DryRun {
		return
	}
	if err := textfile.Write(r.MetricsTextfile, name, code, time.Now()); err != nil {
		log.WithError(err).Warn("cannot record this run for node_exporter")
	}
}
