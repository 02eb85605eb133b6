package cmdkit

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/saferestart/internal/tokenprobe"
)

// TokenProbe are publish-key --watch's cross-acceptance probe's flags
// (publish-key and config). The fields carry the flags' prefix so that no
// other group's field (Kubeconfig, Interval) is shadowed where both are
// embedded.
type TokenProbe struct {
	TokenProbeKubeconfig     string
	TokenProbeServiceAccount string
	TokenProbeInterval       time.Duration
	TokenProbeAPIServers     []string
}

func (p *TokenProbe) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&p.TokenProbeKubeconfig, "token-probe-kubeconfig", "", "publish-key --watch: kubeconfig whose server is this host's apiserver (e.g. https://127.0.0.1:6443, not the load balancer) and whose identity may create tokens for --token-probe-service-account (examples/rbac/token-probe.yaml); every --token-probe-interval a token from it is presented to every apiserver and the row exported as kube_apiserver_safe_restart_token_accepted{issuer_host,verifier_host} on --publisher-metrics-addr; empty: no probe")
	fs.StringVar(&p.TokenProbeServiceAccount, "token-probe-service-account", tokenprobe.DefaultServiceAccount, "publish-key --watch: NAMESPACE/NAME of the service account the probe's tokens are for")
	fs.DurationVar(&p.TokenProbeInterval, "token-probe-interval", tokenprobe.DefaultInterval, "publish-key --watch: how often the token probe runs")
	fs.StringSliceVar(&p.TokenProbeAPIServers, "token-probe-apiservers", nil, "publish-key --watch: the apiservers the probe presents tokens to, HOST=URL (repeatable or comma-separated; HOST is the verifier_host label); empty: the kubernetes Service's EndpointSlices in default (verifier_host is the address)")
}

// Validate checks the probe's flags where the probe would run (publish-key
// --watch with --token-probe-kubeconfig) or is shown (config): elsewhere
// they are ignored, as the one file that sets them serves every command.
func (p *TokenProbe) Validate(runs bool) []error {
	if !runs {
		return nil
	}
	var errs []error
	if p.TokenProbeInterval <= 0 {
		errs = append(errs, Usagef("--token-probe-interval %s: must be positive", p.TokenProbeInterval))
	}
	if _, _, err := tokenprobe.ParseServiceAccount(p.TokenProbeServiceAccount); err != nil {
		errs = append(errs, Usagef("%v", err))
	}
	if _, err := tokenprobe.ParseTargets(p.TokenProbeAPIServers); err != nil {
		errs = append(errs, Usagef("%v", err))
	}
	return errs
}
