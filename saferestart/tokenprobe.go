package saferestart

import (
	"context"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/saferestart/internal/keywatch"
	"github.com/keysync/confd/saferestart/internal/tokenprobe"
)

// tokenProbeOptions: publish-key --watch's cross-acceptance probe.
type tokenProbeOptions struct {
	kubeconfig     string
	serviceAccount string
	interval       time.Duration
	apiservers     []string
}

// tokenProbeFlags: the probe's flags (publish-key and config).
func tokenProbeFlags(o *options, fs *pflag.FlagSet) {
	p := &o.tokenProbe
	fs.StringVar(&p.kubeconfig, "token-probe-kubeconfig", "", "publish-key --watch: kubeconfig whose server is this host's apiserver (e.g. https://127.0.0.1:6443, not the load balancer) and whose identity may create tokens for --token-probe-service-account (examples/rbac/token-probe.yaml); every --token-probe-interval a token from it is presented to every apiserver and the row exported as kube_apiserver_safe_restart_token_accepted{issuer_host,verifier_host} on --publisher-metrics-addr; empty: no probe")
	fs.StringVar(&p.serviceAccount, "token-probe-service-account", tokenprobe.DefaultServiceAccount, "publish-key --watch: NAMESPACE/NAME of the service account the probe's tokens are for")
	fs.DurationVar(&p.interval, "token-probe-interval", tokenprobe.DefaultInterval, "publish-key --watch: how often the token probe runs")
	fs.StringSliceVar(&p.apiservers, "token-probe-apiservers", nil, "publish-key --watch: the apiservers the probe presents tokens to, HOST=URL (repeatable or comma-separated; HOST is the verifier_host label); empty: the kubernetes Service's EndpointSlices in default (verifier_host is the address)")
}

// validateTokenProbe checks the probe's flags when publish-key --watch
// would run it (config shows them all).
func validateTokenProbe(o *options) []error {
	p := o.tokenProbe
	if (o.sub != cmdPublishKey || !o.watch || p.kubeconfig == "") && o.sub != cmdConfig {
		return nil
	}
	var errs []error
	if p.interval <= 0 {
		errs = append(errs, usagef("--token-probe-interval %s: must be positive", p.interval))
	}
	if _, _, err := tokenprobe.ParseServiceAccount(p.serviceAccount); err != nil {
		errs = append(errs, usagef("%v", err))
	}
	if _, err := tokenprobe.ParseTargets(p.apiservers); err != nil {
		errs = append(errs, usagef("%v", err))
	}
	return errs
}

// addTokenProbe adds the probe to the publisher's runners, its metrics to
// the publisher's registry, when --token-probe-kubeconfig is set. An
// unusable kubeconfig is logged and the publisher runs without the probe:
// publishing the keys matters more than measuring them.
func (a *app) addTokenProbe(ctx context.Context, w *keywatch.Watcher, m *keywatch.Metrics) {
	p := a.o.tokenProbe
	if p.kubeconfig == "" {
		return
	}
	targets, _ := tokenprobe.ParseTargets(p.apiservers) // validated
	host := a.trustHost(ctx)
	log := a.log.WithField("host", host).WithField("probe", "token")
	pr, err := tokenprobe.New(tokenprobe.Config{Host: host, Kubeconfig: p.kubeconfig, ServiceAccount: p.serviceAccount,
		Targets: targets, Interval: p.interval, Timeout: min(tokenprobe.DefaultTimeout, p.interval), Log: log})
	if err == nil {
		err = pr.Register(m.Registry)
	}
	if err != nil {
		log.WithError(err).Error("token probe not started; fix --token-probe-kubeconfig and restart the publisher")
		return
	}
	w.Runners = append(w.Runners, pr.Run)
}
