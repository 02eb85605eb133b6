package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/safe-restart/internal/health"
	"github.com/keysync/confd/safe-restart/internal/preflight"
	"github.com/keysync/confd/safe-restart/internal/trust"
)

// The controller-manager's restart command in systemd mode.
var controllerManagerCommand = []string{"systemctl", "restart", "kube-controller-manager.service"}

// validateControllerManagerFlags checks the controller-manager's flags.
func validateControllerManagerFlags(o *options) []error {
	switch o.cmRestartMode {
	case modeSystemd, modeStaticPod:
		return nil
	}
	return []error{usagef("--controller-manager-restart-mode %q: want %s or %s", o.cmRestartMode, modeSystemd, modeStaticPod)}
}

// restartControllerManager runs after rotate-key restarted the apiserver
// with the next key, before the rotation is recorded done: when
// kube-controller-manager signs with the same key (its flags name a
// --service-account-private-key-file holding it, whatever the path), it is
// restarted so that it signs new legacy token Secrets with the new key too,
// and its /healthz must answer. A command after -- never covers it.
func (a *app) restartControllerManager(ctx context.Context, log logrus.FieldLogger) error {
	o := a.o
	if len(o.cmFlagsFiles) == 0 {
		return nil
	}
	log = log.WithField("controller_manager", true)
	keyFile, err := preflight.ControllerManagerKeyFile(o.cmFlagsFiles)
	if err != nil {
		return &codeError{code: exitPreflight, what: fmt.Sprintf("--controller-manager-flags-file: %v", err)}
	}
	if keyFile == "" {
		log.Warn("--controller-manager-flags-file names no --service-account-private-key-file: kube-controller-manager not restarted")
		return nil
	}
	cm, err := trust.FileKeyIDs(keyFile)
	if err != nil {
		return &codeError{code: exitPreflight, what: fmt.Sprintf("kube-controller-manager's --service-account-private-key-file: %v", err)}
	}
	rotated, err := trust.FileKeyIDs(o.signingKey)
	if err != nil {
		return &codeError{code: exitPreflight, what: fmt.Sprintf("--signing-key: %v", err)}
	}
	if len(cm) != 1 || len(rotated) != 1 || !slices.Equal(cm, rotated) {
		log.Warnf("kube-controller-manager's key %s (%v) is not the rotated key %v: not restarted; it keeps signing legacy tokens with its own", keyFile, cm, rotated)
		return nil
	}
	argv := controllerManagerCommand
	timeout := o.restartTimeout
	if o.cmRestartMode == modeStaticPod {
		argv = staticPodCommand(o.criEndpoint, "kube-controller-manager", o.staticPodStopTimeout)
		timeout = max(timeout, staticPodRestartTimeout(o.staticPodStopTimeout))
	}
	log.WithField("command", runner.Quote(argv)).Infof("kube-controller-manager signs with the rotated key (%s): restarting it", keyFile)
	res := runner.Run(ctx, runner.Spec{Argv: argv, Env: runner.WithoutVars(os.Environ(), secretEnv...), Timeout: timeout,
		Grace: killGrace, Stdout: a.stderr, Stderr: a.stderr, ParentDeathSignal: syscall.SIGKILL})
	if res.Err != nil {
		return &codeError{code: exitRestart, what: fmt.Sprintf("kube-controller-manager restart: %v", res.Err)}
	}
	cfg := health.Config{URL: o.cmHealthURL, CACert: o.cmHealthCACert, SkipVerify: o.cmHealthCACert == "",
		Settle: o.healthSettle, Timeout: o.healthTimeout, Interval: o.healthInterval}
	if cfg.URL == "" {
		log.Warn("--controller-manager-health-url is empty: not waiting for kube-controller-manager")
		return nil
	}
	if cfg.SkipVerify {
		log.Warnf("--controller-manager-health-cacert not given: %s's certificate (self-signed by default) is not verified", cfg.URL)
	}
	if err := health.Wait(ctx, cfg, log); err != nil {
		return &codeError{code: exitHealth, what: fmt.Sprintf("kube-controller-manager not healthy after its restart: %v", err)}
	}
	log.Info("kube-controller-manager restarted and healthy")
	return nil
}
