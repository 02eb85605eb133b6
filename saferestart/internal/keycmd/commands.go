// Package keycmd is kube-apiserver-safe-restart's service-account key
// commands: trust, wait-trusted, publish-key (and --watch), rotate-key,
// retire-keys and forget-host, each on one etcd client. See
// safe-restart.md.
package keycmd

import (
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

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

type Trust struct {
	Shared *cmdkit.Shared
	cmdkit.Lock
	cmdkit.Prefixes
	cmdkit.OutputFlag
}

func (o *Trust) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.OutputFlag.Flags(fs)
}

func (o *Trust) Validate() []error {
	errs := cmdkit.ValidateEtcd(o.Shared, &o.Lock, nil, nil)
	errs = append(errs, o.Prefixes.Validate()...)
	return append(errs, o.OutputFlag.Validate()...)
}

type WaitTrusted struct {
	Shared *cmdkit.Shared
	cmdkit.Lock
	cmdkit.Prefixes
	cmdkit.Host
	cmdkit.PublicKeyFlag
	cmdkit.TimeoutFlag
	cmdkit.WaitTrustedFlags
	cmdkit.Preflight
	cmdkit.TTLFlag
}

func (o *WaitTrusted) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.Host.Flags(fs)
	o.PublicKeyFlag.Flags(fs)
	o.TimeoutFlag.Flags(fs)
	o.WaitTrustedFlags.Flags(fs)
	o.Preflight.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.TTLFlag.Flags(fs)
}

func (o *WaitTrusted) Validate() []error {
	errs := cmdkit.ValidateEtcd(o.Shared, &o.Lock, o.TTLFlag.Validate(), nil)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	if o.PublicKey == "" {
		errs = append(errs, cmdkit.Usagef("wait-trusted needs --public-key FILE"))
	}
	return append(errs, cmdkit.ValidateTimeout(o.Timeout)...)
}

type RotateKey struct {
	Shared *cmdkit.Shared
	cmdkit.Restarting
	cmdkit.PublicKeyFlag
	cmdkit.TimeoutFlag
	cmdkit.GraceFlag
	cmdkit.RotateKeyFlags
}

func (o *RotateKey) Flags(fs *pflag.FlagSet) {
	o.Restarting.Flags(fs)
	o.PublicKeyFlag.Flags(fs)
	o.TimeoutFlag.Flags(fs)
	o.GraceFlag.Flags(fs)
	o.RotateKeyFlags.Flags(fs)
}

// Args takes the command after --, as restart does.
func (o *RotateKey) Args(cmd *cobra.Command, args []string) error {
	return restartcmd.RestartArgs(&o.Restarting, cmd, args, o.Shared.Origin)
}

func (o *RotateKey) Validate() []error {
	errs := o.Restarting.Validate(o.Shared, nil)
	cmdkit.KeyFileDefaults(&o.SigningKey, &o.PublicKey)
	if o.Algorithm != rotation.RSA2048 && o.Algorithm != rotation.ECDSAP256 {
		errs = append(errs, cmdkit.Usagef("--algorithm %q: want %s or %s", o.Algorithm, rotation.RSA2048, rotation.ECDSAP256))
	}
	errs = append(errs, cmdkit.ValidateGrace(o.Grace)...)
	errs = append(errs, cmdkit.ValidateTimeout(o.Timeout)...)
	if o.Abort && (o.Rollback || o.DryRun) {
		errs = append(errs, cmdkit.Usagef("--abort goes with neither --rollback nor --dry-run"))
	}
	if o.Rollback && o.DryRun {
		errs = append(errs, cmdkit.Usagef("--rollback goes without --dry-run"))
	}
	return errs
}

type RetireKeys struct {
	Shared *cmdkit.Shared
	cmdkit.Lock
	cmdkit.DryRunFlag
	cmdkit.Prefixes
	cmdkit.Host
	cmdkit.PublicKeyFlag
	cmdkit.SigningKeyFlag
	cmdkit.KubeconfigFlag
	cmdkit.ControllerManager
	cmdkit.RetireKeysFlags
}

func (o *RetireKeys) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.DryRunFlag.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.Host.Flags(fs)
	o.PublicKeyFlag.Flags(fs)
	o.SigningKeyFlag.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.KubeconfigFlag.Flags(fs)
	o.ControllerManager.Flags(fs)
	o.RetireKeysFlags.Flags(fs)
}

func (o *RetireKeys) Validate() []error {
	errs := cmdkit.ValidateEtcd(o.Shared, &o.Lock, nil, map[string]time.Duration{"--stale-token-window": o.StaleTokenWindow})
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	cmdkit.KeyFileDefaults(&o.SigningKey, &o.PublicKey)
	return append(errs, o.ControllerManager.Validate()...)
}

type PublishKey struct {
	Shared *cmdkit.Shared
	cmdkit.Lock
	cmdkit.KeysPrefixFlag
	cmdkit.TrustPrefixFlag // the fleet gauges read the trust records
	cmdkit.Host
	cmdkit.PublicKeyFlag
	cmdkit.SigningKeyFlag
	cmdkit.RotationPrefixFlag
	cmdkit.GraceFlag
	cmdkit.PublishKeyFlags
	cmdkit.PublishWatchFlags
	cmdkit.TTLFlag
	cmdkit.StaleToken
	cmdkit.HealthCreds
	cmdkit.TokenProbe
}

func (o *PublishKey) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.Host.Flags(fs)
	o.PublicKeyFlag.Flags(fs)
	o.SigningKeyFlag.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.GraceFlag.Flags(fs)
	o.PublishKeyFlags.Flags(fs)
	o.PublishWatchFlags.Flags(fs)
	o.TTLFlag.Flags(fs)
	o.StaleToken.Flags(fs)
	o.HealthCreds.Flags(fs)
	o.TokenProbe.Flags(fs)
}

func (o *PublishKey) Validate() []error {
	var pre []error
	if o.Watch {
		pre = o.TTLFlag.Validate()
	}
	errs := cmdkit.ValidateEtcd(o.Shared, &o.Lock, pre, nil)
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
	Shared *cmdkit.Shared
	host   string // the HOST forgotten
	cmdkit.Lock
	cmdkit.DryRunFlag
	cmdkit.Prefixes
	cmdkit.Host
	cmdkit.GraceFlag
	cmdkit.KubeconfigFlag
}

func (o *ForgetHost) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.DryRunFlag.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.Host.Flags(fs)
	o.GraceFlag.Flags(fs)
	o.KubeconfigFlag.Flags(fs)
}

func (o *ForgetHost) Validate() []error {
	errs := cmdkit.ValidateEtcd(o.Shared, &o.Lock, nil, nil)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	return append(errs, cmdkit.ValidateGrace(o.Grace)...)
}
