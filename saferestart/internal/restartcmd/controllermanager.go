package restartcmd

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/health"
	"github.com/keysync/confd/saferestart/internal/restart"
)

// The controller-manager's restart command in systemd mode.
var controllerManagerCommand = []string{"systemctl", "restart", "kube-controller-manager.service"}

// restartControllerManager runs after rotate-key restarted the apiserver
// with the next key, before the rotation is recorded done: when
// kube-controller-manager signs with the same key (its flags name a
// --service-account-private-key-file holding it, whatever the path), it is
// restarted so that it signs new legacy token Secrets with the new key too,
// and its /healthz must answer. A command after -- never covers it.
func (k *Step) restartControllerManager(ctx context.Context, log logrus.FieldLogger) error {
	o := k.Opts
	if len(o.CMFlagsFiles) == 0 {
		return nil
	}
	log = log.WithField("controller_manager", true)
	keyFile, cm, err := preflight.ControllerManagerKey(o.CMFlagsFiles)
	if err != nil {
		return &cmdkit.CodeError{Code: cmdkit.ExitPreflight, What: fmt.Sprintf("--controller-manager-flags-file: %v", err)}
	}
	if keyFile == "" {
		log.Warn("--controller-manager-flags-file names no --service-account-private-key-file: kube-controller-manager not restarted")
		return nil
	}
	rotated, err := trust.FileKeyIDs(o.SigningKey)
	if err != nil {
		return &cmdkit.CodeError{Code: cmdkit.ExitPreflight, What: fmt.Sprintf("--signing-key: %v", err)}
	}
	if len(rotated) != 1 || rotated[0] != cm {
		log.Warnf("kube-controller-manager's key %s (%s) is not the rotated key %v: not restarted; it keeps signing legacy tokens with its own", keyFile, cm, rotated)
		return nil
	}
	argv := controllerManagerCommand
	timeout := o.RestartTimeout
	if o.CMRestartMode == cmdkit.ModeStaticPod {
		argv = staticPodCommand(o.CRIEndpoint, "kube-controller-manager", o.StaticPodStopTimeout)
		timeout = max(timeout, staticPodRestartTimeout(o.StaticPodStopTimeout))
	}
	log.WithField("command", runner.Quote(argv)).Infof("kube-controller-manager signs with the rotated key (%s): restarting it", keyFile)
	res := runner.Run(ctx, runner.Spec{Argv: argv, Env: runner.WithoutVars(os.Environ(), SecretEnv...), Timeout: timeout,
		Grace: restart.KillGrace, Stdout: k.Stderr, Stderr: k.Stderr, ParentDeathSignal: syscall.SIGKILL})
	if res.Err != nil {
		return &cmdkit.CodeError{Code: cmdkit.ExitRestart, What: fmt.Sprintf("kube-controller-manager restart: %v", res.Err)}
	}
	cfg := health.Config{URL: o.CMHealthURL, CACert: o.CMHealthCACert, SkipVerify: o.CMHealthCACert == "",
		Settle: o.HealthSettle, Timeout: o.HealthTimeout, Interval: o.HealthInterval}
	if cfg.URL == "" {
		log.Warn("--controller-manager-health-url is empty: not waiting for kube-controller-manager")
		return nil
	}
	if cfg.SkipVerify {
		log.Warnf("--controller-manager-health-cacert not given: %s's certificate (self-signed by default) is not verified", cfg.URL)
	}
	if err := health.Wait(ctx, cfg, log); err != nil {
		return &cmdkit.CodeError{Code: cmdkit.ExitHealth, What: fmt.Sprintf("kube-controller-manager not healthy after its restart: %v", err)}
	}
	log.Info("kube-controller-manager restarted and healthy")
	return nil
}
