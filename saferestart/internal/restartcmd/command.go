package restartcmd

import (
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
// nothing before it.
func RestartArgs(o *cmdkit.Restarting, cmd *cobra.Command, args []string, origin map[string]string) error {
	dash := cmd.ArgsLenAtDash()
	if len(args) > 0 && dash != 0 {
		return cli.Usagef("unexpected argument %q: put the restart command after --", args[0])
	}
	if err := applyRestartMode(o, origin); err != nil {
		return err
	}
	o.Argv = DefaultCommand
	if o.RestartMode == cmdkit.ModeStaticPod {
		o.Argv = staticPodCommand(o.CRIEndpoint, "kube-apiserver", o.StaticPodStopTimeout)
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
