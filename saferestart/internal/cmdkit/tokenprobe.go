package cmdkit

import (
	"time"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/tokenprobe"
)

// TokenProbe are publish-key --watch's cross-acceptance probe's flags
// (publish-key and config). The fields carry the flags' prefix so that no
// other group's field (Kubeconfig, Interval) is shadowed where both are
// embedded.
type TokenProbe struct {
	TokenProbeKubeconfig     string        `flag:"token-probe-kubeconfig"`
	TokenProbeServiceAccount string        `flag:"token-probe-service-account"`
	TokenProbeInterval       time.Duration `flag:"token-probe-interval"`
	TokenProbeAPIServers     []string      `flag:"token-probe-apiservers"`
}

// Validate checks the probe's flags where the probe would run (publish-key
// --watch with --token-probe-kubeconfig) or is shown (config): elsewhere
// they are ignored, as the one file that sets them serves every command.
func (p *TokenProbe) Validate(runs bool) []error {
	if !runs {
		return nil
	}
	errs := cli.UsageIf(p.TokenProbeInterval <= 0, "--token-probe-interval %s: must be positive", p.TokenProbeInterval)
	_, _, err := tokenprobe.ParseServiceAccount(p.TokenProbeServiceAccount)
	errs = append(errs, cli.UsageIf(err != nil, "%v", err)...)
	_, err = tokenprobe.ParseTargets(p.TokenProbeAPIServers)
	return append(errs, cli.UsageIf(err != nil, "%v", err)...)
}
