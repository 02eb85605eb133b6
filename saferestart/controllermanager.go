package saferestart

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/preflight"
	"github.com/keysync/confd/internal/runner"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/health"
	"github.com/keysync/confd/saferestart/internal/legacytokens"
)

// The controller-manager's restart command in systemd mode.
var controllerManagerCommand = []string{"systemctl", "restart", "kube-controller-manager.service"}

// validateControllerManagerFlags checks the controller-manager's flags.
func (o *ControllerManager) Validate() []error {
	switch o.CMRestartMode {
	case ModeSystemd, ModeStaticPod:
		return nil
	}
	return []error{Usagef("--controller-manager-restart-mode %q: want %s or %s", o.CMRestartMode, ModeSystemd, ModeStaticPod)}
}

// restartControllerManager runs after rotate-key restarted the apiserver
// with the next key, before the rotation is recorded done: when
// kube-controller-manager signs with the same key (its flags name a
// --service-account-private-key-file holding it, whatever the path), it is
// restarted so that it signs new legacy token Secrets with the new key too,
// and its /healthz must answer. A command after -- never covers it.
func (k *keyRotation) restartControllerManager(ctx context.Context, log logrus.FieldLogger) error {
	a := k.Env
	o := k.o
	if len(o.CMFlagsFiles) == 0 {
		return nil
	}
	log = log.WithField("controller_manager", true)
	keyFile, cm, err := preflight.ControllerManagerKey(o.CMFlagsFiles)
	if err != nil {
		return &codeError{code: ExitPreflight, what: fmt.Sprintf("--controller-manager-flags-file: %v", err)}
	}
	if keyFile == "" {
		log.Warn("--controller-manager-flags-file names no --service-account-private-key-file: kube-controller-manager not restarted")
		return nil
	}
	rotated, err := trust.FileKeyIDs(o.SigningKey)
	if err != nil {
		return &codeError{code: ExitPreflight, what: fmt.Sprintf("--signing-key: %v", err)}
	}
	if len(rotated) != 1 || rotated[0] != cm {
		log.Warnf("kube-controller-manager's key %s (%s) is not the rotated key %v: not restarted; it keeps signing legacy tokens with its own", keyFile, cm, rotated)
		return nil
	}
	argv := controllerManagerCommand
	timeout := o.RestartTimeout
	if o.CMRestartMode == ModeStaticPod {
		argv = staticPodCommand(o.CRIEndpoint, "kube-controller-manager", o.StaticPodStopTimeout)
		timeout = max(timeout, staticPodRestartTimeout(o.StaticPodStopTimeout))
	}
	log.WithField("command", runner.Quote(argv)).Infof("kube-controller-manager signs with the rotated key (%s): restarting it", keyFile)
	res := runner.Run(ctx, runner.Spec{Argv: argv, Env: runner.WithoutVars(os.Environ(), SecretEnv...), Timeout: timeout,
		Grace: killGrace, Stdout: a.Stderr, Stderr: a.Stderr, ParentDeathSignal: syscall.SIGKILL})
	if res.Err != nil {
		return &codeError{code: ExitRestart, what: fmt.Sprintf("kube-controller-manager restart: %v", res.Err)}
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
		return &codeError{code: ExitHealth, what: fmt.Sprintf("kube-controller-manager not healthy after its restart: %v", err)}
	}
	log.Info("kube-controller-manager restarted and healthy")
	return nil
}

// legacyTokenGate runs before retire-keys retires kid: with --kubeconfig,
// it refuses (exit 3, naming namespace/name, never a token) while a legacy
// token Secret holds a token signed with that key, since every apiserver
// refuses such tokens once the key is gone. Re-creating the Secret (after
// kube-controller-manager signs with the new key) clears it.
func (r *retirer) legacyTokenGate(ctx context.Context, kid string, log logrus.FieldLogger) int {
	a := r.Env
	o := r.o
	if o.Kubeconfig == "" {
		return ExitOK
	}
	if o.IgnoreLegacyTokens {
		log.Warnf("--ignore-legacy-tokens: not looking for legacy token Secrets signed with %s; any left stop working once it is retired", kid)
		return ExitOK
	}
	l, err := legacytokens.New(o.Kubeconfig, a.Etcd.CommandTimeout)
	if err != nil {
		log.WithError(err).Error("retire-keys: legacy token check")
		return ExitPreflight
	}
	held, err := l.Holding(ctx, kid)
	if err != nil {
		log.WithError(err).Errorf("retire-keys: cannot list legacy token Secrets: not retiring %s (pass --ignore-legacy-tokens to retire without looking)", kid)
		return ExitError
	}
	if len(held) > 0 {
		log.Errorf("retire-keys refused: %d legacy token Secret(s) hold tokens signed with %s, which every apiserver would refuse once it is retired: %s. Re-create them once kube-controller-manager signs with the new key (or pass --ignore-legacy-tokens)",
			len(held), kid, strings.Join(held, ", "))
		return ExitPreflight
	}
	log.Infof("no legacy token Secret holds a token signed with %s", kid)
	return ExitOK
}

// retireGates run before retire-keys retires kid, a due superseded key of
// any host. A key any host's trust record says its apiserver signs with is
// kept, logged, exit 0: two hosts may share a key (kubeadm's upload-certs),
// and it is due only once no apiserver signs with it (a reimaged host not
// restarted yet, the shared key until the last master rotated). Today's
// refusals stay (exit 3, naming the hosts): while any host's record says
// its kube-controller-manager signs with kid (the legacy token Secrets it
// creates would be refused once the key is gone), and while a legacy token
// Secret holds a token signed with it. Records without the
// controller-manager's key (older helpers, hosts without
// --controller-manager-flags-file) block nothing. It reports whether kid
// may be retired now, and the exit code.
func (r *retirer) retireGates(ctx context.Context, kid string, recs map[string]trust.Record, log logrus.FieldLogger) (bool, int) {
	if hosts := trust.APIServersSigningWith(recs, kid); len(hosts) > 0 {
		log.Warnf("key %s is due, but the apiserver on %s signs with it (trust record): kept until no apiserver does",
			kid, strings.Join(hosts, ", "))
		return false, ExitOK
	}
	if hosts := trust.ControllerManagersSigningWith(recs, kid); len(hosts) > 0 {
		log.Errorf("retire-keys refused: kube-controller-manager on %s signs with %s (trust record), so the legacy token Secrets it creates would be refused once it is retired. Restart it with the new key (rotate-key --controller-manager-flags-file on that host) first",
			strings.Join(hosts, ", "), kid)
		return false, ExitPreflight
	}
	code := r.legacyTokenGate(ctx, kid, log)
	return code == ExitOK, code
}
