package cmdkit

import (
	"maps"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/redact"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/fleet"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/keywatch"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// ProgName is the binary's name, in messages and help.
const ProgName = "kube-apiserver-safe-restart"

// Shared is what every command has: --config, --log-level, --log-format,
// the file read and where each value came from, and the etcd flags (taken
// by the commands that talk to etcd).
type Shared struct {
	cli.Common
	cli.Etcd
}

// The flag groups: each is the values of one registration function, and
// a command's options embed the groups it registers, so that a command
// holds only its own flags' values.

type Lock struct{ LockName, HoldKey string }

// TTLFlag is --ttl.
type TTLFlag struct{ TTL int }

// HealthCreds are the health gate's credentials (--health-cacert,
// --health-cert, --health-key, --health-token-file).
type HealthCreds struct{ HealthCACert, HealthCert, HealthKey, HealthToken string }

// RestartFlags: how restart and rotate-key restart kube-apiserver.
type RestartFlags struct {
	TTLFlag
	LockTimeout          time.Duration
	IgnoreHold           bool
	RestartTimeout       time.Duration
	Attempts             int
	RetryDelay           time.Duration
	RestartMode          string
	CRIEndpoint          string
	StaticPodStopTimeout time.Duration
	HealthURL            string
	HealthCreds
	HealthSettle      time.Duration
	HealthTimeout     time.Duration
	HealthInterval    time.Duration
	JWKSKeyFiles      []string
	TrustTimeout      time.Duration
	FleetLeaseAge     time.Duration
	MinLiveAPIServers int
	FleetTimeout      time.Duration
}

// Preflight is --preflight-file and --preflight-flags-file.
type Preflight struct{ PreflightFiles, PreflightFlagsFiles []string }

// DryRunFlag is --dry-run.
type DryRunFlag struct{ DryRun bool }

// KeysPrefixFlag is --keys-prefix.
type KeysPrefixFlag struct{ KeysPrefix string }

// TrustPrefixFlag is --trust-prefix.
type TrustPrefixFlag struct{ TrustPrefix string }

// RotationPrefixFlag is --rotation-prefix.
type RotationPrefixFlag struct{ RotationPrefix string }

// Prefixes: the three prefixes, for the commands that read trust.
type Prefixes struct {
	KeysPrefixFlag
	TrustPrefixFlag
	RotationPrefixFlag
}

// Host is --host.
type Host struct{ HostName string }

// PublicKeyFlag is --public-key.
type PublicKeyFlag struct{ PublicKey string }

// SigningKeyFlag is --signing-key.
type SigningKeyFlag struct{ SigningKey string }

// TimeoutFlag is --timeout.
type TimeoutFlag struct{ Timeout time.Duration }

// KubeconfigFlag is --kubeconfig.
type KubeconfigFlag struct{ Kubeconfig string }

// GraceFlag is --grace.
type GraceFlag struct{ Grace time.Duration }

// OutputFlag is --output.
type OutputFlag struct{ Output string }

// ControllerManager: kube-controller-manager's flags.
type ControllerManager struct {
	CMFlagsFiles   []string
	CMRestartMode  string
	CMHealthURL    string
	CMHealthCACert string
}

// StaleToken is --apiserver-metrics-url, the stale-token sampler's.
type StaleToken struct{ APIServerMetricsURL string }

// HoldFlags are hold's own flags.
type HoldFlags struct{ Reason string }

// CheckFlags are check's own flags.
type CheckFlags struct {
	PublicOnly, KeysOnly bool
	RequireKeys          []string
	RequireSigningKeys   bool
}

// WaitTrustedFlags are wait-trusted's own flags.
type WaitTrustedFlags struct {
	ExcludeHosts             []string
	SkipUnrecorded, IfNewKey bool
}

// RotateKeyFlags are rotate-key's own flags.
type RotateKeyFlags struct {
	Algorithm       string
	Abort, Rollback bool
	Signer          bool // this host signs through kube-apiserver-sa-signer (restartcmd.Step)
}

// PublishKeyFlags are publish-key's own flags.
type PublishKeyFlags struct{ Certificate string }

// PublishWatchFlags are publish-key --watch's flags.
type PublishWatchFlags struct {
	Watch                bool
	PublisherMetricsAddr string
	StateDir             string
	ReconcileInterval    time.Duration
}

// RetireKeysFlags are retire-keys' own flags.
type RetireKeysFlags struct {
	IgnoreLegacyTokens bool
	// stale-token evidence (keycmd): retire-keys' window and override
	StaleTokenWindow  time.Duration
	IgnoreStaleTokens bool
}

// Restarting are the flags of the commands that restart kube-apiserver
// (restart, rotate-key) and their command after --.
type Restarting struct {
	Argv []string
	Lock
	RestartFlags
	Preflight
	DryRunFlag
	Prefixes
	Host
	SigningKeyFlag
	KubeconfigFlag
	ControllerManager
	MetricsTextfileFlag
}

// Flags registers the restarting commands' flags, in --help's order.
func (o *Restarting) Flags(fs *pflag.FlagSet) {
	o.Lock.Flags(fs)
	o.RestartFlags.Flags(fs)
	o.Preflight.Flags(fs)
	o.DryRunFlag.Flags(fs)
	o.KeysPrefixFlag.Flags(fs)
	o.TrustPrefixFlag.Flags(fs)
	o.RotationPrefixFlag.Flags(fs)
	o.Host.Flags(fs)
	o.SigningKeyFlag.Flags(fs)
	o.KubeconfigFlag.Flags(fs)
	o.ControllerManager.Flags(fs)
	o.MetricsTextfileFlag.Flags(fs)
}

// MetricsTextfileFlag is restart's and rotate-key's node_exporter textfile
// (saferestart's textfile.go writes it at exit).
type MetricsTextfileFlag struct{ MetricsTextfile string }

func (o *MetricsTextfileFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.MetricsTextfile, "metrics-textfile", "", "restart, rotate-key: at exit, write when the command ended and its exit code (kube_apiserver_safe_restart_last_run_timestamp_seconds{command}, ..._last_run_exit_code{command}) to this node_exporter textfile (a .prom file in its --collector.textfile.directory), atomically, keeping the other command's lines; not with --dry-run")
}

// UsageError is a command-line mistake (exit 2).
type UsageError = cli.UsageError

// Usagef is a usage error (exit 2).
func Usagef(format string, a ...any) error { return cli.Usagef(format, a...) }

// The flags come in groups, each registered by the commands it means
// something to (saferestart.commands): a command's --help lists only its own, and
// any other flag is unknown to it. Long names are config.Keys, shared
// with kube-apiserver-sa-signer.

// Lock flags: the lock and its hold; every command that talks to etcd.
func (l *Lock) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&l.LockName, "lock-name", "kube-apiserver-restart", "lock name, shared with etcdctl lock NAME")
	fs.StringVar(&l.HoldKey, "hold-key", "", "etcd key of the hold record (default LOCK-NAME-hold)")
}

// ControllerManager flags: kube-controller-manager, which signs legacy tokens with the
// service-account key too: read by restart (its key goes in the trust
// record), rotate-key (restarted after the apiserver) and retire-keys
// (refuses to retire the key it signs with).
func (o *ControllerManager) Flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.CMFlagsFiles, "controller-manager-flags-file", nil, "rotate-key: kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable); when its --service-account-private-key-file holds the rotated key, it is restarted after the apiserver")
	fs.StringVar(&o.CMRestartMode, "controller-manager-restart-mode", ModeSystemd, "rotate-key: systemd (systemctl restart kube-controller-manager.service) or static-pod (its container, through crictl)")
	fs.StringVar(&o.CMHealthURL, "controller-manager-health-url", "https://127.0.0.1:10257/healthz", "rotate-key: kube-controller-manager's health URL, polled after its restart")
	fs.StringVar(&o.CMHealthCACert, "controller-manager-health-cacert", "", "rotate-key: CA of kube-controller-manager's serving certificate (empty: not verified, logged)")
}

// RestartFlags flags: how restart and rotate-key restart kube-apiserver.
func (o *RestartFlags) Flags(fs *pflag.FlagSet) {
	o.TTLFlag.Flags(fs)
	fs.DurationVar(&o.LockTimeout, "lock-timeout", 10*time.Minute, "give up waiting for the lock after this long")
	fs.BoolVar(&o.IgnoreHold, "ignore-hold", false, "restart even while a hold is active")
	fs.DurationVar(&o.RestartTimeout, "restart-timeout", 3*time.Minute, "kill the restart command's process group after this long")
	fs.IntVar(&o.Attempts, "attempts", 2, "restart attempts (command + health gate) under one lock before stopping the line")
	fs.DurationVar(&o.RetryDelay, "retry-delay", 5*time.Second, "pause between attempts")
	fs.StringVar(&o.RestartMode, "restart-mode", ModeSystemd, "how kube-apiserver is restarted without a command after --: systemd (systemctl restart kube-apiserver.service) or static-pod (stop its container through the CRI with crictl; the kubelet starts a new one)")
	fs.StringVar(&o.CRIEndpoint, "cri-endpoint", "", "static-pod: container runtime endpoint, passed to crictl as --runtime-endpoint (empty: crictl's own configuration)")
	fs.DurationVar(&o.StaticPodStopTimeout, "static-pod-stop-timeout", 30*time.Second, "static-pod: how long the stopped container may drain before it is killed (crictl stop --timeout); --restart-timeout defaults to this plus the kubelet's 5m back-off and 30s")
	fs.StringVar(&o.HealthURL, "health-url", "https://127.0.0.1:6443/readyz", "readiness URL polled after the restart while the lock is held; empty turns the gate off")
	o.HealthCreds.Flags(fs)
	fs.DurationVar(&o.HealthSettle, "health-settle", 5*time.Second, "how long the apiserver must stay ready")
	fs.DurationVar(&o.HealthTimeout, "health-timeout", 3*time.Minute, "give up waiting for readiness after this long")
	fs.DurationVar(&o.HealthInterval, "health-interval", time.Second, "pause between health probes")
	fs.StringArrayVar(&o.JWKSKeyFiles, "jwks-key-file", nil, "service-account public key file the apiserver's JWKS must serve once ready (repeatable)")
	fs.DurationVar(&o.TrustTimeout, "trust-timeout", 15*time.Minute, "restart: when this host is about to sign with a new key, wait this long without the lock for every other host to trust it (0: do not wait)")
	fs.DurationVar(&o.FleetLeaseAge, "fleet-lease-age", DefaultFleetLeaseAge, "an apiserver whose identity Lease was renewed longer ago than this is not live (kube-apiserver renews every 10 s)")
	fs.IntVar(&o.MinLiveAPIServers, "min-live-apiservers", fleet.AllOthers, "other apiservers that must be live before this one goes down (-1: every other apiserver that renewed its Lease in the last hour, and every other host that publishes keys and records trust)")
	fs.DurationVar(&o.FleetTimeout, "fleet-timeout", 10*time.Minute, "wait this long, holding no lock, for enough other apiservers to be live; then exit 5, nothing restarted")
}

// HealthCreds flags: how this host's helpers reach their own apiserver (the
// health gate; the stale-token sampler reads /metrics with the same
// identity, so one set of keys in safe-restart.toml serves both).
func (o *HealthCreds) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.HealthCACert, "health-cacert", "", "CA bundle to verify the apiserver's serving certificate (health gate; stale-token sampler)")
	fs.StringVar(&o.HealthCert, "health-cert", "", "client certificate for the health check and the stale-token sampler's /metrics reads")
	fs.StringVar(&o.HealthKey, "health-key", "", "client private key for the health check and the stale-token sampler's /metrics reads")
	fs.StringVar(&o.HealthToken, "health-token-file", "", "file holding a bearer token for the health check and the stale-token sampler's /metrics reads")
}

// StaleToken flags: the stale-token sampler's own flag, for the long-running
// publisher that runs it (with healthCredFlags, unless the command has the
// restart flags already).
func (o *StaleToken) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.APIServerMetricsURL, "apiserver-metrics-url", "", "this host's apiserver's /metrics (e.g. https://127.0.0.1:6443/metrics), sampled every minute for serviceaccount_stale_tokens_total into ROTATION-PREFIX/HOST/stale-tokens, which retire-keys weighs; read with --health-cacert and --health-cert/--health-key or --health-token-file (needs get on the non-resource URL /metrics); empty: not sampled")
}

// DefaultFleetLeaseAge is --fleet-lease-age's default: three of
// kube-apiserver's 10 s renewals. forget-host takes an apiserver whose Lease
// is younger as live.
const DefaultFleetLeaseAge = 30 * time.Second

// TTLFlag flags: the lease of what a command keeps in etcd while it runs (the
// lock's session; wait-trusted's waiting record), gone this long after the
// process dies.
// ClaimTTL is --ttl's default, and the lease of the rotation claim of the
// commands without --ttl (retire-keys, forget-host), gone this long after
// the process dies.
const ClaimTTL = 10

func (o *TTLFlag) Flags(fs *pflag.FlagSet) {
	fs.IntVar(&o.TTL, "ttl", ClaimTTL, "session lease TTL in seconds (as etcdctl lock --ttl); wait-trusted: of its waiting record; publish-key --watch: of its alive record")
}

// Preflight flags: the files checked before the lock (restart,
// rotate-key) or by check; for wait-trusted --if-new-key, the files the
// apiserver about to start loads, recorded as its trust.
func (o *Preflight) Flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.PreflightFiles, "preflight-file", nil, "PEM file checked before taking the lock (repeatable); wait-trusted --if-new-key: recorded as the starting apiserver's trust")
	fs.StringArrayVar(&o.PreflightFlagsFiles, "preflight-flags-file", nil, "kube-apiserver flags file or EnvironmentFile whose referenced files are checked before taking the lock (repeatable); wait-trusted --if-new-key: its service-account key files are recorded as the starting apiserver's trust")
}

func (o *DryRunFlag) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.DryRun, "dry-run", false, "restart, rotate-key: run preflight and the hold check, report what would happen and the worst-case duration (for confd's reload_cmd_timeout); lock and run nothing; retire-keys, forget-host: print what would be retired, written or deleted, and write nothing")
}

func (o *KeysPrefixFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.KeysPrefix, "keys-prefix", trust.DefaultKeysPrefix, "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)")
}

func (o *TrustPrefixFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.TrustPrefix, "trust-prefix", trust.DefaultPrefix, "etcd prefix of the trust records: PREFIX/HOST lists the keys HOST's apiserver loaded at its last successful restart")
}

func (o *Host) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.HostName, "host", "", "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f, as the publisher writes it), and in holds and the lock queue (default there: the kernel's host name)")
}

func (o *PublicKeyFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.PublicKey, "public-key", "", "wait-trusted: PEM file whose key(s) must be trusted (public key, or a private key's public half); rotate-key, retire-keys: this host's published public keys (default /etc/kubernetes/pki/sa.pub)")
}

func (o *SigningKeyFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.SigningKey, "signing-key", "", "rotate-key, retire-keys: this host's service-account signing key (default /etc/kubernetes/pki/sa.key); publish-key: publish its public half when --public-key is not given; restart, check: the key kube-apiserver-sa-signer signs with, looked for in its FetchKeys answer when a flags file names --service-account-signing-endpoint")
}

func (o *TimeoutFlag) Flags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.Timeout, "timeout", 15*time.Minute, "wait-trusted, rotate-key: how long to wait for every host to trust the key")
}

func (o *KubeconfigFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the local apiserver: restart, rotate-key: before going down, count the live apiservers from their identity Leases (needs list on leases in kube-system); retire-keys: refuse while legacy token Secrets hold the retiring key (needs list on secrets); forget-host: refuse while HOST's apiserver's identity Lease is live (needs list on leases); empty: none of these")
}

func (o *RotationPrefixFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.RotationPrefix, "rotation-prefix", rotation.DefaultPrefix, "etcd prefix of the per-host rotation records: PREFIX/HOST/state (rotate-key, retire-keys; shown by status), PREFIX/HOST/kept (the key record: superseded and retired keys, forgotten hosts; publish-key, rotate-key, retire-keys, forget-host), PREFIX/HOST/waiting (written by wait-trusted while it waits; read by restart's fleet check, status and trust) and PREFIX/HOST/alive (kept by publish-key --watch while it runs; forget-host refuses while it exists)")
}

func (o *GraceFlag) Flags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.Grace, "grace", 24*time.Hour, "rotate-key, publish-key, forget-host: how long a superseded public key (the previous key, one the published source no longer holds, or a forgotten host's) stays published before retire-keys retires it; fixed when superseded (0: at the next retire-keys)")
}

func (o *OutputFlag) Flags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.Output, "output", "o", "text", "status, --dry-run: text or json")
}

// The flags of one command each.

func (o *HoldFlags) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Reason, "reason", "", "hold: why the line is stopped (required)")
}

func (o *CheckFlags) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.PublicOnly, "public-only", false, "check: refuse private keys (the files must hold public material only)")
	fs.BoolVar(&o.KeysOnly, "keys-only", false, "check: refuse certificates (every block must be a key, as a published service-account key is)")
	fs.StringArrayVar(&o.RequireKeys, "require-key", nil, "check: the public half of this key file (public or private key PEM) must be loaded from every FILE (repeatable)")
	fs.BoolVar(&o.RequireSigningKeys, "require-signing-keys", false, "check: read the trust records (--trust-prefix) and the published keys (--keys-prefix) from etcd and refuse (exit 3) a FILE that lacks a key a host's apiserver, kube-apiserver-sa-signer or kube-controller-manager signs with; etcd not answering refuses too (exit 1)")
}

func (o *WaitTrustedFlags) Flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.ExcludeHosts, "exclude-host", nil, "wait-trusted: do not wait for this host (repeatable; e.g. the host whose apiserver is about to start)")
	fs.BoolVar(&o.SkipUnrecorded, "skip-unrecorded", false, "wait-trusted: do not wait for hosts that publish keys but have never recorded trust (new hosts, keys of hosts not running this tool)")
	fs.BoolVar(&o.IfNewKey, "if-new-key", false, "wait-trusted: wait only for keys this host (--host) was not signing with at its last recorded restart, and not for this host itself: a plain restart or reboot passes at once, as the restart's own trust gate does")
}

func (o *RotateKeyFlags) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Algorithm, "algorithm", "rsa-2048", "rotate-key: algorithm of the next key: rsa-2048 or ecdsa-p256")
	fs.BoolVar(&o.Abort, "abort", false, "rotate-key: abandon this host's rotation before its next key is installed (withdraws the next key; exit 3 once installed)")
	fs.BoolVar(&o.Rollback, "rollback", false, "rotate-key: after the install, sign with the previous key again, through the lock, while it is still published (exit 3 once retired); the rolled-back key is retired by retire-keys after --grace")
	fs.BoolVar(&o.Signer, "signer", false, "rotate-key: this host's apiserver signs through kube-apiserver-sa-signer: reload the signer (default command: systemctl reload kube-apiserver-sa-signer.service) instead of restarting the apiserver, and wait until it signs with the next key")
}

func (o *PublishKeyFlags) Flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Certificate, "certificate", "", "publish-key: publish this certificate (PEM) instead of a key; a previous one with another key stays published beside it until retire-keys after --grace")
}

// PublishWatchFlags flags: publish-key --watch, the long-running publisher.
func (o *PublishWatchFlags) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.Watch, "watch", false, "publish-key: keep running and keep this host's keys and every tombstone seen published: reconcile at start, when the key files change, when etcd's copy changes, after an etcd restore and every --reconcile-interval (sa-key-publish.service)")
	fs.DurationVar(&o.ReconcileInterval, "reconcile-interval", DefaultReconcileInterval, "publish-key --watch: reconcile at least this often (at most 30s: what etcd lost is published again within it)")
	fs.StringVar(&o.StateDir, "state-dir", DefaultStateDir, "publish-key --watch: directory of the tombstones this master has seen ("+KeywatchTombstones+"), written back to etcd when a restore loses them; unwritable: logged and counted, not fatal")
	fs.StringVar(&o.PublisherMetricsAddr, "publisher-metrics-addr", "", "publish-key --watch: serve Prometheus metrics (kube_apiserver_safe_restart_publisher_...) and /healthz on this address (empty: none)")
}

func (o *RetireKeysFlags) Flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.IgnoreLegacyTokens, "ignore-legacy-tokens", false, "retire-keys: with --kubeconfig, retire even while legacy token Secrets hold tokens signed with the retiring key (logged)")
	fs.DurationVar(&o.StaleTokenWindow, "stale-token-window", time.Hour, "retire-keys: keep a due key while any apiserver's serviceaccount_stale_tokens_total (ROTATION-PREFIX/HOST/stale-tokens) grew within this long, and more than an hour after the key stopped signing (logged, exit 0)")
	fs.BoolVar(&o.IgnoreStaleTokens, "ignore-stale-tokens", false, "retire-keys: retire even while stale service-account tokens are in use (logged at warning with the hosts and times overridden)")
}

// ValidateEtcd checks what every command that talks to etcd through the
// lock's names checks: pre (the command's own checks that come first),
// then durations that must be positive (the etcd timeouts and the
// command's), the etcd settings, the lock and hold names.
func ValidateEtcd(s *Shared, l *Lock, pre []error, positive map[string]time.Duration) []error {
	errs := pre
	p := map[string]time.Duration{"--dial-timeout": s.DialTimeout, "--command-timeout": s.CommandTimeout}
	maps.Copy(p, positive)
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if p[n] <= 0 {
			errs = append(errs, Usagef("%s %s: must be positive", n, p[n]))
		}
	}
	if len(s.Endpoints) == 0 {
		errs = append(errs, Usagef("--endpoints: no etcd endpoint"))
	}
	if (s.Cert == "") != (s.Key == "") {
		errs = append(errs, Usagef("--cert and --key go together"))
	}
	return append(errs, l.Validate()...)
}

func (l *Lock) Validate() []error {
	var errs []error
	if l.LockName == "" || strings.HasSuffix(l.LockName, "/") {
		errs = append(errs, Usagef("--lock-name %q: must be non-empty and not end in /", l.LockName))
	}
	// A hold key under the lock's prefix would join the mutex queue as its
	// oldest key: every restarter would wait behind it forever.
	if l.LockName != "" && strings.HasPrefix(l.HoldKeyOrDefault(), lock.Prefix(l.LockName)) {
		errs = append(errs, Usagef("--hold-key %q: inside the lock's prefix %q, where it would wedge the lock queue", l.HoldKeyOrDefault(), lock.Prefix(l.LockName)))
	}
	// The same goes for the restart intents under it (--hold-key equal to
	// --lock-name puts them in the mutex queue), and for the participants'
	// info, which the queue listing reads by prefix too.
	if ip := hold.IntentPrefix(l.HoldKeyOrDefault()); l.LockName != "" &&
		(strings.HasPrefix(ip, lock.Prefix(l.LockName)) || strings.HasPrefix(ip, lock.InfoPrefix(l.LockName))) {
		errs = append(errs, Usagef("--hold-key %q: its restart intents (%s) would be inside the lock's prefixes %q or %q, where they would wedge the lock queue", l.HoldKeyOrDefault(), ip, lock.Prefix(l.LockName), lock.InfoPrefix(l.LockName)))
	}
	return errs
}

// validate checks the restart flags; their durations that must be
// positive go to positive, to be reported in order with the others.
func (o *RestartFlags) Validate(positive map[string]time.Duration) []error {
	errs := o.TTLFlag.Validate()
	positive["--lock-timeout"] = o.LockTimeout
	positive["--restart-timeout"] = o.RestartTimeout
	if o.HealthURL != "" {
		positive["--health-timeout"] = o.HealthTimeout
		positive["--health-interval"] = o.HealthInterval
	}
	if o.Attempts < 1 {
		errs = append(errs, Usagef("--attempts %d: must be at least 1", o.Attempts))
	}
	if o.RetryDelay < 0 || o.HealthSettle < 0 {
		errs = append(errs, Usagef("--retry-delay and --health-settle must not be negative"))
	}
	// A gate that must stay ready for as long as it may wait can never pass.
	if o.HealthURL != "" && o.HealthTimeout > 0 && o.HealthSettle >= o.HealthTimeout {
		errs = append(errs, Usagef("--health-settle %s must be shorter than --health-timeout %s", o.HealthSettle, o.HealthTimeout))
	}
	if (o.HealthCert == "") != (o.HealthKey == "") {
		errs = append(errs, Usagef("--health-cert and --health-key go together"))
	}
	return errs
}

func (o *TTLFlag) Validate() []error {
	if o.TTL < 1 {
		return []error{Usagef("--ttl %d: must be at least 1 second", o.TTL)}
	}
	return nil
}

// validate: the restarting commands' flags after the etcd ones.
func (o *Restarting) Validate(s *Shared, pre []error) []error {
	positive := map[string]time.Duration{}
	errs := ValidateEtcd(s, &o.Lock, append(pre, o.RestartFlags.Validate(positive)...), positive)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	if o.TrustTimeout < 0 {
		errs = append(errs, Usagef("--trust-timeout %s: must not be negative", o.TrustTimeout))
	}
	errs = append(errs, ValidateFleetFlags(o)...)
	return append(errs, o.ControllerManager.Validate()...)
}

func (o *OutputFlag) Validate() []error {
	if o.Output != "text" && o.Output != "json" {
		return []error{Usagef("--output %q: want text or json", o.Output)}
	}
	return nil
}

func (o *HoldFlags) Validate() []error {
	var errs []error
	if strings.TrimSpace(o.Reason) == "" {
		errs = append(errs, Usagef("hold needs --reason TEXT"))
	}
	// The reason is stored in etcd, readable by every host, and printed
	// by hold and status: key material must not get there, masked or not.
	if redact.HasKey(o.Reason) {
		errs = append(errs, Usagef("--reason holds private key material (not shown, nothing stored); describe the problem in words and name the key's file instead"))
	}
	return errs
}

// JoinUsage is one usage error of all of errs, nil when there are none.
func JoinUsage(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &UsageError{Msg: strings.Join(msgs, "; ")}
}

func (l *Lock) HoldKeyOrDefault() string {
	if l.HoldKey != "" {
		return l.HoldKey
	}
	return l.LockName + "-hold"
}

// Hostname is the host name recorded in holder info and holds.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host-pid-" + strconv.Itoa(os.Getpid())
	}
	return h
}

// ValidatePrefixes: the prefixes given must not be empty, and the keys'
// and the trust records' must differ (p: flag name -> value, in order).
func ValidatePrefixes(keysPrefix, trustPrefix, rotationPrefix *string) []error {
	var errs []error
	for _, p := range []struct {
		name string
		v    *string
	}{{"--keys-prefix", keysPrefix}, {"--trust-prefix", trustPrefix}, {"--rotation-prefix", rotationPrefix}} {
		if p.v != nil && strings.TrimSuffix(*p.v, "/") == "" {
			errs = append(errs, Usagef("%s %q: must not be empty", p.name, *p.v))
		}
	}
	if keysPrefix != nil && trustPrefix != nil && etcdkey.Dir(*keysPrefix) == etcdkey.Dir(*trustPrefix) {
		errs = append(errs, Usagef("--keys-prefix and --trust-prefix must differ (%q)", *keysPrefix))
	}
	return errs
}

func (p *Prefixes) Validate() []error {
	return ValidatePrefixes(&p.KeysPrefix, &p.TrustPrefix, &p.RotationPrefix)
}

func (p *Prefixes) TrustPrefixes() trust.Prefixes {
	// The rotation prefix holds the key records: which published keys are
	// superseded and which hosts forget-host removed (not waited for).
	return trust.Prefixes{Keys: p.KeysPrefix, Trust: p.TrustPrefix, Rotation: p.RotationPrefix}
}

func (h *Host) Validate() []error {
	if h.HostName != "" {
		if err := etcdkey.ValidHost(h.HostName); err != nil {
			return []error{Usagef("--host: %v", err)}
		}
	}
	return nil
}

// hostFlag is --host, for the invocation's host names.
func (h *Host) HostFlag() string { return h.HostName }

// KeyFileDefaults: rotate-key and retire-keys read sa.key and sa.pub unless
// told otherwise.
func KeyFileDefaults(signingKey, publicKey *string) {
	if *signingKey == "" {
		*signingKey = DefaultSigningKey
	}
	if *publicKey == "" {
		*publicKey = DefaultPublicKey
	}
}

func ValidateGrace(grace time.Duration) []error {
	if grace < 0 {
		return []error{Usagef("--grace %s: must not be negative", grace)}
	}
	return nil
}

func ValidateTimeout(timeout time.Duration) []error {
	if timeout <= 0 {
		return []error{Usagef("--timeout %s: must be positive", timeout)}
	}
	return nil
}

func (o *PublishWatchFlags) Validate() []error {
	var errs []error
	if o.ReconcileInterval <= 0 || o.ReconcileInterval > MaxReconcileInterval {
		errs = append(errs, Usagef("--reconcile-interval %s: must be positive and at most %s", o.ReconcileInterval, MaxReconcileInterval))
	}
	// Without --watch the publisher's settings are ignored, not refused:
	// the one file that sets them serves the one-shot publish-key too.
	return errs
}

// ValidateFleetFlags checks the fleet check's flags.
func ValidateFleetFlags(o *Restarting) []error {
	var errs []error
	if o.Kubeconfig == "" {
		return nil
	}
	if o.FleetLeaseAge <= 0 {
		errs = append(errs, Usagef("--fleet-lease-age %s: must be positive", o.FleetLeaseAge))
	}
	if o.FleetTimeout < 0 {
		errs = append(errs, Usagef("--fleet-timeout %s: must not be negative", o.FleetTimeout))
	}
	return errs
}

// validateControllerManagerFlags checks the controller-manager's flags.
func (o *ControllerManager) Validate() []error {
	switch o.CMRestartMode {
	case ModeSystemd, ModeStaticPod:
		return nil
	}
	return []error{Usagef("--controller-manager-restart-mode %q: want %s or %s", o.CMRestartMode, ModeSystemd, ModeStaticPod)}
}

const (
	DefaultSigningKey = "/etc/kubernetes/pki/sa.key"
	DefaultPublicKey  = "/etc/kubernetes/pki/sa.pub"
)

const (
	// DefaultReconcileInterval bounds how long etcd may lack what a
	// master keeps published (issue 31: within 30 s).
	DefaultReconcileInterval = 30 * time.Second
	MaxReconcileInterval     = 30 * time.Second
	DefaultStateDir          = "/var/lib/kube-apiserver-safe-restart"
	KeywatchTombstones       = keywatch.TombstonesFile
)

// Restart modes (--restart-mode): how kube-apiserver is restarted when no
// command is given after --.
const (
	ModeSystemd   = "systemd"
	ModeStaticPod = "static-pod"
)
