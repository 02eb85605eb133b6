// Package keycmd is kube-apiserver-safe-restart's service-account key
// commands: trust, wait-trusted, publish-key (and --watch), rotate-key,
// retire-keys and forget-host, each on one etcd client. See
// safe-restart.md.
package keycmd

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// The commands' names, as the key records name what changed them.
const (
	byPublishKey = "publish-key"
	byRotateKey  = "rotate-key"
	byForgetHost = "forget-host"
)

// The options of each command: its flags in the order its --help lists
// them (cmdkit.Register).

type Trust struct {
	cmdkit.Lock
	cmdkit.Prefixes
	cmdkit.OutputFlag
}

func (o *Trust) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
	errs = append(errs, o.Prefixes.Validate()...)
	return append(errs, o.OutputFlag.Validate()...)
}

type WaitTrusted struct {
	cmdkit.Lock
	KeysPrefix  string `flag:"keys-prefix"`
	TrustPrefix string `flag:"trust-prefix"`
	cmdkit.Host
	PublicKey string        `flag:"public-key"`
	Timeout   time.Duration `flag:"timeout"`
	cmdkit.WaitTrustedFlags
	cmdkit.Preflight
	RotationPrefix string `flag:"rotation-prefix"`
	cmdkit.TTLFlag
}

func (o *WaitTrusted) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, o.TTLFlag.Validate(), nil)
	errs = append(errs, cmdkit.ValidatePrefixes(&o.KeysPrefix, &o.TrustPrefix, &o.RotationPrefix)...)
	errs = append(errs, o.Host.Validate()...)
	errs = append(errs, cli.UsageIf(o.PublicKey == "", "wait-trusted needs --public-key FILE")...)
	return append(errs, cmdkit.ValidateTimeout(o.Timeout)...)
}

type RotateKey struct {
	cmdkit.Restarting
	PublicKey string        `flag:"public-key"`
	Timeout   time.Duration `flag:"timeout"`
	Grace     time.Duration `flag:"grace"`
	cmdkit.RotateKeyFlags
}

// Args takes the command after --, as restart does.
func (o *RotateKey) Args(s *cmdkit.Shared, cmd *cobra.Command, args []string) error {
	return restartcmd.RestartArgs(&o.Restarting, cmd, args, s.Origin)
}

func (o *RotateKey) Validate(s *cmdkit.Shared) []error {
	errs := o.Restarting.Validate(s)
	cmdkit.KeyFileDefaults(&o.SigningKey, &o.PublicKey)
	errs = append(errs, cli.UsageIf(o.Algorithm != rotation.RSA2048 && o.Algorithm != rotation.ECDSAP256, "--algorithm %q: want %s or %s", o.Algorithm, rotation.RSA2048, rotation.ECDSAP256)...)
	errs = append(errs, cmdkit.ValidateGrace(o.Grace)...)
	errs = append(errs, cmdkit.ValidateTimeout(o.Timeout)...)
	errs = append(errs, cli.UsageIf(o.Abort && (o.Rollback || o.DryRun), "--abort goes with neither --rollback nor --dry-run")...)
	return append(errs, cli.UsageIf(o.Rollback && o.DryRun, "--rollback goes without --dry-run")...)
}

type RetireKeys struct {
	cmdkit.Lock
	DryRun      bool   `flag:"dry-run"`
	KeysPrefix  string `flag:"keys-prefix"`
	TrustPrefix string `flag:"trust-prefix"`
	cmdkit.Host
	PublicKey      string `flag:"public-key"`
	SigningKey     string `flag:"signing-key"`
	RotationPrefix string `flag:"rotation-prefix"`
	Kubeconfig     string `flag:"kubeconfig"`
	cmdkit.ControllerManager
	cmdkit.RetireKeysFlags
}

func (o *RetireKeys) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, map[string]time.Duration{"--stale-token-window": o.StaleTokenWindow})
	errs = append(errs, cmdkit.ValidatePrefixes(&o.KeysPrefix, &o.TrustPrefix, &o.RotationPrefix)...)
	errs = append(errs, o.Host.Validate()...)
	cmdkit.KeyFileDefaults(&o.SigningKey, &o.PublicKey)
	return append(errs, o.ControllerManager.Validate()...)
}

type PublishKey struct {
	cmdkit.Lock
	KeysPrefix  string `flag:"keys-prefix"`
	TrustPrefix string `flag:"trust-prefix"` // the fleet gauges read the trust records
	cmdkit.Host
	PublicKey      string        `flag:"public-key"`
	SigningKey     string        `flag:"signing-key"`
	RotationPrefix string        `flag:"rotation-prefix"`
	Grace          time.Duration `flag:"grace"`
	Certificate    string        `flag:"certificate"`
	cmdkit.PublishWatchFlags
	cmdkit.TTLFlag
	APIServerMetricsURL string `flag:"apiserver-metrics-url"` // the stale-token sampler's
	cmdkit.HealthCreds
	cmdkit.TokenProbe
}

func (o *PublishKey) Validate(s *cmdkit.Shared) []error {
	var pre []error
	if o.Watch {
		pre = o.TTLFlag.Validate()
	}
	errs := cmdkit.ValidateEtcd(s, &o.Lock, pre, nil)
	errs = append(errs, cmdkit.ValidatePrefixes(&o.KeysPrefix, &o.TrustPrefix, &o.RotationPrefix)...)
	errs = append(errs, o.Host.Validate()...)
	errs = append(errs, o.TokenProbe.Validate(o.Watch && o.TokenProbeKubeconfig != "")...)
	// The public half of --signing-key only when no --public-key.
	if o.PublicKey == "" && o.SigningKey == "" && o.Certificate == "" {
		o.PublicKey = cmdkit.DefaultPublicKey
	}
	errs = append(errs, cmdkit.ValidateGrace(o.Grace)...)
	return append(errs, o.PublishWatchFlags.Validate()...)
}

type ForgetHost struct {
	host string // the HOST forgotten
	cmdkit.Lock
	DryRun bool `flag:"dry-run"`
	cmdkit.Prefixes
	cmdkit.Host
	Grace      time.Duration `flag:"grace"`
	Kubeconfig string        `flag:"kubeconfig"`
}

func (o *ForgetHost) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	return append(errs, cmdkit.ValidateGrace(o.Grace)...)
}
