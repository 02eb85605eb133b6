package restartcmd

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// Command is the restart command's options: the restart flags and
// --output.
type Command struct {
	cmdkit.Restarting
	cmdkit.OutputFlag
}

// Args takes the command after --.
func (o *Command) Args(s *cmdkit.Shared, cmd *cobra.Command, args []string) error {
	return RestartArgs(&o.Restarting, cmd, args, s.Origin)
}

func (o *Command) Validate(s *cmdkit.Shared) []error {
	return append(o.Restarting.Validate(s), o.OutputFlag.Validate()...)
}

// RestartArgs: restart and rotate-key take their command after --, and
// nothing before it; without one, --restart-mode's. Static-pod mode gets
// its default --restart-timeout.
func RestartArgs(o *cmdkit.Restarting, cmd *cobra.Command, args []string, origin map[string]string) error {
	dash := cmd.ArgsLenAtDash()
	if len(args) > 0 && dash != 0 {
		return cli.Usagef("unexpected argument %q: put the restart command after --", args[0])
	}
	switch o.RestartMode {
	case cmdkit.ModeSystemd:
		o.Argv = DefaultCommand
	case cmdkit.ModeStaticPod:
		if o.StaticPodStopTimeout < time.Second {
			return cli.Usagef("--static-pod-stop-timeout %s: must be at least 1s (crictl stop takes whole seconds)", o.StaticPodStopTimeout)
		}
		// Unless given (by a flag or the file).
		if origin["restart-timeout"] == "default" {
			o.RestartTimeout = staticPodRestartTimeout(o.StaticPodStopTimeout)
		}
		o.Argv = staticPodCommand(o.CRIEndpoint, "kube-apiserver", o.StaticPodStopTimeout)
	default:
		return cli.Usagef("--restart-mode %q: want %s or %s", o.RestartMode, cmdkit.ModeSystemd, cmdkit.ModeStaticPod)
	}
	if dash >= 0 {
		if len(args) == dash {
			return cli.Usagef("no command after --")
		}
		o.Argv = args[dash:]
	}
	return nil
}

// DefaultCommand restarts kube-apiserver when no command follows -- (systemd
// mode).
var DefaultCommand = []string{"systemctl", "restart", "kube-apiserver.service"}
