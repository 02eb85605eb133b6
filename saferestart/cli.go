package saferestart

import (
	"maps"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/redact"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/fleet"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

const progName = "kube-apiserver-safe-restart"

var defaultCommand = []string{"systemctl", "restart", "kube-apiserver.service"}

// defaultConfig is --config's default, read only when present. A variable
// so that tests never read the real one.
var defaultConfig = config.DefaultPath

// Subcommands; restart is the default.
const (
	cmdRestart = "restart"
	cmdStatus  = "status"
	cmdHold    = "hold"
	cmdUnhold  = "unhold"
	cmdCheck   = "check"
	cmdVersion = "version"
	// Service-account key trust and rotation (trust.go, rotate.go).
	cmdTrust       = "trust"
	cmdWaitTrusted = "wait-trusted"
	cmdRotateKey   = "rotate-key"
	cmdRetireKeys  = "retire-keys"
	cmdPublishKey  = "publish-key"
	// Removing a master for good (forget.go).
	cmdForgetHost = "forget-host"
	// The effective configuration and where each value came from.
	cmdConfig = "config"
)

// shared is what every command has: --config, --log-level, --log-format,
// the file read and where each value came from, and the etcd flags (taken
// by the commands that talk to etcd).
type shared struct {
	cli.Common
	cli.Etcd
}

// The flag groups: each is the values of one registration function, and
// a command's options embed the groups it registers, so that a command
// holds only its own flags' values.

type lockOpts struct{ lockName, holdKey string }

type ttlOpt struct{ ttl int }

type healthCreds struct{ healthCACert, healthCert, healthKey, healthToken string }

// restartOpts: how restart and rotate-key restart kube-apiserver.
type restartOpts struct {
	ttlOpt
	lockTimeout          time.Duration
	ignoreHold           bool
	restartTimeout       time.Duration
	attempts             int
	retryDelay           time.Duration
	restartMode          string
	criEndpoint          string
	staticPodStopTimeout time.Duration
	healthURL            string
	healthCreds
	healthSettle      time.Duration
	healthTimeout     time.Duration
	healthInterval    time.Duration
	jwksKeyFiles      []string
	trustTimeout      time.Duration
	fleetLeaseAge     time.Duration
	minLiveAPIServers int
	fleetTimeout      time.Duration
}

type preflightOpts struct{ preflightFiles, preflightFlagsFiles []string }

type dryRunOpt struct{ dryRun bool }

type keysPrefixOpt struct{ keysPrefix string }

type trustPrefixOpt struct{ trustPrefix string }

type rotationPrefixOpt struct{ rotationPrefix string }

// prefixOpts: the three prefixes, for the commands that read trust.
type prefixOpts struct {
	keysPrefixOpt
	trustPrefixOpt
	rotationPrefixOpt
}

type hostOpt struct{ trustHostName string }

type publicKeyOpt struct{ publicKey string }

type signingKeyOpt struct{ signingKey string }

type timeoutOpt struct{ timeout time.Duration }

type kubeconfigOpt struct{ kubeconfig string }

type graceOpt struct{ grace time.Duration }

type outputOpt struct{ output string }

// cmOpts: kube-controller-manager's flags.
type cmOpts struct {
	cmFlagsFiles   []string
	cmRestartMode  string
	cmHealthURL    string
	cmHealthCACert string
}

type staleTokenOpt struct{ apiserverMetricsURL string }

type holdOpts struct{ reason string }

type checkOpts struct {
	publicOnly, keysOnly bool
	requireKeys          []string
	requireSigningKeys   bool
}

type waitTrustedOpts struct {
	excludeHosts             []string
	skipUnrecorded, ifNewKey bool
}

type rotateKeyOpts struct {
	algorithm       string
	abort, rollback bool
	signer          bool // this host signs through kube-apiserver-sa-signer (signer.go)
}

type publishKeyOpts struct{ certificate string }

type publishWatchOpts struct {
	watch                bool
	publisherMetricsAddr string
	stateDir             string
	reconcileInterval    time.Duration
}

type retireKeysOpts struct {
	ignoreLegacyTokens bool
	// stale-token evidence (staletokens.go): retire-keys' window and override
	staleTokenWindow  time.Duration
	ignoreStaleTokens bool
}

// restartingOpts are the flags of the commands that restart kube-apiserver
// (restart, rotate-key) and their command after --.
type restartingOpts struct {
	argv []string
	lockOpts
	restartOpts
	preflightOpts
	dryRunOpt
	prefixOpts
	hostOpt
	signingKeyOpt
	kubeconfigOpt
	cmOpts
}

func (o *restartingOpts) flags(fs *pflag.FlagSet) {
	o.lockOpts.flags(fs)
	o.restartOpts.flags(fs)
	o.preflightOpts.flags(fs)
	o.dryRunOpt.flags(fs)
	o.keysPrefixOpt.flags(fs)
	o.trustPrefixOpt.flags(fs)
	o.rotationPrefixOpt.flags(fs)
	o.hostOpt.flags(fs)
	o.signingKeyOpt.flags(fs)
	o.kubeconfigOpt.flags(fs)
	o.cmOpts.flags(fs)
}

// usageError is a command-line mistake (exit 2).
type usageError = cli.UsageError

func usagef(format string, a ...any) error { return cli.Usagef(format, a...) }

// The flags come in groups, each registered by the commands it means
// something to (commands.go): a command's --help lists only its own, and
// any other flag is unknown to it. Long names are config.Keys, shared
// with kube-apiserver-sa-signer.

// lockOpts flags: the lock and its hold; every command that talks to etcd.
func (l *lockOpts) flags(fs *pflag.FlagSet) {
	fs.StringVar(&l.lockName, "lock-name", "kube-apiserver-restart", "lock name, shared with etcdctl lock NAME")
	fs.StringVar(&l.holdKey, "hold-key", "", "etcd key of the hold record (default LOCK-NAME-hold)")
}

// cmOpts flags: kube-controller-manager, which signs legacy tokens with the
// service-account key too: read by restart (its key goes in the trust
// record), rotate-key (restarted after the apiserver) and retire-keys
// (refuses to retire the key it signs with).
func (o *cmOpts) flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.cmFlagsFiles, "controller-manager-flags-file", nil, "rotate-key: kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable); when its --service-account-private-key-file holds the rotated key, it is restarted after the apiserver")
	fs.StringVar(&o.cmRestartMode, "controller-manager-restart-mode", modeSystemd, "rotate-key: systemd (systemctl restart kube-controller-manager.service) or static-pod (its container, through crictl)")
	fs.StringVar(&o.cmHealthURL, "controller-manager-health-url", "https://127.0.0.1:10257/healthz", "rotate-key: kube-controller-manager's health URL, polled after its restart")
	fs.StringVar(&o.cmHealthCACert, "controller-manager-health-cacert", "", "rotate-key: CA of kube-controller-manager's serving certificate (empty: not verified, logged)")
}

// restartOpts flags: how restart and rotate-key restart kube-apiserver.
func (o *restartOpts) flags(fs *pflag.FlagSet) {
	o.ttlOpt.flags(fs)
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 10*time.Minute, "give up waiting for the lock after this long")
	fs.BoolVar(&o.ignoreHold, "ignore-hold", false, "restart even while a hold is active")
	fs.DurationVar(&o.restartTimeout, "restart-timeout", 3*time.Minute, "kill the restart command's process group after this long")
	fs.IntVar(&o.attempts, "attempts", 2, "restart attempts (command + health gate) under one lock before stopping the line")
	fs.DurationVar(&o.retryDelay, "retry-delay", 5*time.Second, "pause between attempts")
	fs.StringVar(&o.restartMode, "restart-mode", modeSystemd, "how kube-apiserver is restarted without a command after --: systemd (systemctl restart kube-apiserver.service) or static-pod (stop its container through the CRI with crictl; the kubelet starts a new one)")
	fs.StringVar(&o.criEndpoint, "cri-endpoint", "", "static-pod: container runtime endpoint, passed to crictl as --runtime-endpoint (empty: crictl's own configuration)")
	fs.DurationVar(&o.staticPodStopTimeout, "static-pod-stop-timeout", 30*time.Second, "static-pod: how long the stopped container may drain before it is killed (crictl stop --timeout); --restart-timeout defaults to this plus the kubelet's 5m back-off and 30s")
	fs.StringVar(&o.healthURL, "health-url", "https://127.0.0.1:6443/readyz", "readiness URL polled after the restart while the lock is held; empty turns the gate off")
	o.healthCreds.flags(fs)
	fs.DurationVar(&o.healthSettle, "health-settle", 5*time.Second, "how long the apiserver must stay ready")
	fs.DurationVar(&o.healthTimeout, "health-timeout", 3*time.Minute, "give up waiting for readiness after this long")
	fs.DurationVar(&o.healthInterval, "health-interval", time.Second, "pause between health probes")
	fs.StringArrayVar(&o.jwksKeyFiles, "jwks-key-file", nil, "service-account public key file the apiserver's JWKS must serve once ready (repeatable)")
	fs.DurationVar(&o.trustTimeout, "trust-timeout", 15*time.Minute, "restart: when this host is about to sign with a new key, wait this long without the lock for every other host to trust it (0: do not wait)")
	fs.DurationVar(&o.fleetLeaseAge, "fleet-lease-age", defaultFleetLeaseAge, "an apiserver whose identity Lease was renewed longer ago than this is not live (kube-apiserver renews every 10 s)")
	fs.IntVar(&o.minLiveAPIServers, "min-live-apiservers", fleet.AllOthers, "other apiservers that must be live before this one goes down (-1: every other apiserver that renewed its Lease in the last hour, and every other host that publishes keys and records trust)")
	fs.DurationVar(&o.fleetTimeout, "fleet-timeout", 10*time.Minute, "wait this long, holding no lock, for enough other apiservers to be live; then exit 5, nothing restarted")
}

// healthCreds flags: how this host's helpers reach their own apiserver (the
// health gate; the stale-token sampler reads /metrics with the same
// identity, so one set of keys in safe-restart.toml serves both).
func (o *healthCreds) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.healthCACert, "health-cacert", "", "CA bundle to verify the apiserver's serving certificate (health gate; stale-token sampler)")
	fs.StringVar(&o.healthCert, "health-cert", "", "client certificate for the health check and the stale-token sampler's /metrics reads")
	fs.StringVar(&o.healthKey, "health-key", "", "client private key for the health check and the stale-token sampler's /metrics reads")
	fs.StringVar(&o.healthToken, "health-token-file", "", "file holding a bearer token for the health check and the stale-token sampler's /metrics reads")
}

// staleTokenOpt flags: the stale-token sampler's own flag, for the long-running
// publisher that runs it (with healthCredFlags, unless the command has the
// restart flags already).
func (o *staleTokenOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.apiserverMetricsURL, "apiserver-metrics-url", "", "this host's apiserver's /metrics (e.g. https://127.0.0.1:6443/metrics), sampled every minute for serviceaccount_stale_tokens_total into ROTATION-PREFIX/HOST/stale-tokens, which retire-keys weighs; read with --health-cacert and --health-cert/--health-key or --health-token-file (needs get on the non-resource URL /metrics); empty: not sampled")
}

// defaultFleetLeaseAge is --fleet-lease-age's default: three of
// kube-apiserver's 10 s renewals. forget-host takes an apiserver whose Lease
// is younger as live.
const defaultFleetLeaseAge = 30 * time.Second

// ttlOpt flags: the lease of what a command keeps in etcd while it runs (the
// lock's session; wait-trusted's waiting record), gone this long after the
// process dies.
// claimTTL is --ttl's default, and the lease of the rotation claim of the
// commands without --ttl (retire-keys, forget-host), gone this long after
// the process dies.
const claimTTL = 10

func (o *ttlOpt) flags(fs *pflag.FlagSet) {
	fs.IntVar(&o.ttl, "ttl", claimTTL, "session lease TTL in seconds (as etcdctl lock --ttl); wait-trusted: of its waiting record; publish-key --watch: of its alive record")
}

// preflightOpts flags: the files checked before the lock (restart,
// rotate-key) or by check; for wait-trusted --if-new-key, the files the
// apiserver about to start loads, recorded as its trust.
func (o *preflightOpts) flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.preflightFiles, "preflight-file", nil, "PEM file checked before taking the lock (repeatable); wait-trusted --if-new-key: recorded as the starting apiserver's trust")
	fs.StringArrayVar(&o.preflightFlagsFiles, "preflight-flags-file", nil, "kube-apiserver flags file or EnvironmentFile whose referenced files are checked before taking the lock (repeatable); wait-trusted --if-new-key: its service-account key files are recorded as the starting apiserver's trust")
}

func (o *dryRunOpt) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.dryRun, "dry-run", false, "restart, rotate-key: run preflight and the hold check, report what would happen and the worst-case duration (for confd's reload_cmd_timeout); lock and run nothing; retire-keys, forget-host: print what would be retired, written or deleted, and write nothing")
}

func (o *keysPrefixOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.keysPrefix, "keys-prefix", trust.DefaultKeysPrefix, "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)")
}

func (o *trustPrefixOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.trustPrefix, "trust-prefix", trust.DefaultPrefix, "etcd prefix of the trust records: PREFIX/HOST lists the keys HOST's apiserver loaded at its last successful restart")
}

func (o *hostOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.trustHostName, "host", "", "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f, as the publisher writes it), and in holds and the lock queue (default there: the kernel's host name)")
}

func (o *publicKeyOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.publicKey, "public-key", "", "wait-trusted: PEM file whose key(s) must be trusted (public key, or a private key's public half); rotate-key, retire-keys: this host's published public keys (default /etc/kubernetes/pki/sa.pub)")
}

func (o *signingKeyOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.signingKey, "signing-key", "", "rotate-key, retire-keys: this host's service-account signing key (default /etc/kubernetes/pki/sa.key); publish-key: publish its public half when --public-key is not given; restart, check: the key kube-apiserver-sa-signer signs with, looked for in its FetchKeys answer when a flags file names --service-account-signing-endpoint")
}

func (o *timeoutOpt) flags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "wait-trusted, rotate-key: how long to wait for every host to trust the key")
}

func (o *kubeconfigOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the local apiserver: restart, rotate-key: before going down, count the live apiservers from their identity Leases (needs list on leases in kube-system); retire-keys: refuse while legacy token Secrets hold the retiring key (needs list on secrets); forget-host: refuse while HOST's apiserver's identity Lease is live (needs list on leases); empty: none of these")
}

func (o *rotationPrefixOpt) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.rotationPrefix, "rotation-prefix", rotation.DefaultPrefix, "etcd prefix of the per-host rotation records: PREFIX/HOST/state (rotate-key, retire-keys; shown by status), PREFIX/HOST/kept (the key record: superseded and retired keys, forgotten hosts; publish-key, rotate-key, retire-keys, forget-host), PREFIX/HOST/waiting (written by wait-trusted while it waits; read by restart's fleet check, status and trust) and PREFIX/HOST/alive (kept by publish-key --watch while it runs; forget-host refuses while it exists)")
}

func (o *graceOpt) flags(fs *pflag.FlagSet) {
	fs.DurationVar(&o.grace, "grace", 24*time.Hour, "rotate-key, publish-key, forget-host: how long a superseded public key (the previous key, one the published source no longer holds, or a forgotten host's) stays published before retire-keys retires it; fixed when superseded (0: at the next retire-keys)")
}

func (o *outputOpt) flags(fs *pflag.FlagSet) {
	fs.StringVarP(&o.output, "output", "o", "text", "status, --dry-run: text or json")
}

// The flags of one command each.

func (o *holdOpts) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.reason, "reason", "", "hold: why the line is stopped (required)")
}

func (o *checkOpts) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.publicOnly, "public-only", false, "check: refuse private keys (the files must hold public material only)")
	fs.BoolVar(&o.keysOnly, "keys-only", false, "check: refuse certificates (every block must be a key, as a published service-account key is)")
	fs.StringArrayVar(&o.requireKeys, "require-key", nil, "check: the public half of this key file (public or private key PEM) must be loaded from every FILE (repeatable)")
	fs.BoolVar(&o.requireSigningKeys, "require-signing-keys", false, "check: read the trust records (--trust-prefix) and the published keys (--keys-prefix) from etcd and refuse (exit 3) a FILE that lacks a key a host's apiserver, kube-apiserver-sa-signer or kube-controller-manager signs with; etcd not answering refuses too (exit 1)")
}

func (o *waitTrustedOpts) flags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.excludeHosts, "exclude-host", nil, "wait-trusted: do not wait for this host (repeatable; e.g. the host whose apiserver is about to start)")
	fs.BoolVar(&o.skipUnrecorded, "skip-unrecorded", false, "wait-trusted: do not wait for hosts that publish keys but have never recorded trust (new hosts, keys of hosts not running this tool)")
	fs.BoolVar(&o.ifNewKey, "if-new-key", false, "wait-trusted: wait only for keys this host (--host) was not signing with at its last recorded restart, and not for this host itself: a plain restart or reboot passes at once, as the restart's own trust gate does")
}

func (o *rotateKeyOpts) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.algorithm, "algorithm", "rsa-2048", "rotate-key: algorithm of the next key: rsa-2048 or ecdsa-p256")
	fs.BoolVar(&o.abort, "abort", false, "rotate-key: abandon this host's rotation before its next key is installed (withdraws the next key; exit 3 once installed)")
	fs.BoolVar(&o.rollback, "rollback", false, "rotate-key: after the install, sign with the previous key again, through the lock, while it is still published (exit 3 once retired); the rolled-back key is retired by retire-keys after --grace")
	fs.BoolVar(&o.signer, "signer", false, "rotate-key: this host's apiserver signs through kube-apiserver-sa-signer: reload the signer (default command: systemctl reload kube-apiserver-sa-signer.service) instead of restarting the apiserver, and wait until it signs with the next key")
}

func (o *publishKeyOpts) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.certificate, "certificate", "", "publish-key: publish this certificate (PEM) instead of a key; a previous one with another key stays published beside it until retire-keys after --grace")
}

// publishWatchOpts flags: publish-key --watch, the long-running publisher.
func (o *publishWatchOpts) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.watch, "watch", false, "publish-key: keep running and keep this host's keys and every tombstone seen published: reconcile at start, when the key files change, when etcd's copy changes, after an etcd restore and every --reconcile-interval (sa-key-publish.service)")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", defaultReconcileInterval, "publish-key --watch: reconcile at least this often (at most 30s: what etcd lost is published again within it)")
	fs.StringVar(&o.stateDir, "state-dir", defaultStateDir, "publish-key --watch: directory of the tombstones this master has seen ("+keywatchTombstones+"), written back to etcd when a restore loses them; unwritable: logged and counted, not fatal")
	fs.StringVar(&o.publisherMetricsAddr, "publisher-metrics-addr", "", "publish-key --watch: serve Prometheus metrics (kube_apiserver_safe_restart_publisher_...) and /healthz on this address (empty: none)")
}

func (o *retireKeysOpts) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.ignoreLegacyTokens, "ignore-legacy-tokens", false, "retire-keys: with --kubeconfig, retire even while legacy token Secrets hold tokens signed with the retiring key (logged)")
	fs.DurationVar(&o.staleTokenWindow, "stale-token-window", time.Hour, "retire-keys: keep a due key while any apiserver's serviceaccount_stale_tokens_total (ROTATION-PREFIX/HOST/stale-tokens) grew within this long, and more than an hour after the key stopped signing (logged, exit 0)")
	fs.BoolVar(&o.ignoreStaleTokens, "ignore-stale-tokens", false, "retire-keys: retire even while stale service-account tokens are in use (logged at warning with the hosts and times overridden)")
}

// validateEtcd checks what every command that talks to etcd through the
// lock's names checks: pre (the command's own checks that come first),
// then durations that must be positive (the etcd timeouts and the
// command's), the etcd settings, the lock and hold names.
func validateEtcd(s *shared, l *lockOpts, pre []error, positive map[string]time.Duration) []error {
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
			errs = append(errs, usagef("%s %s: must be positive", n, p[n]))
		}
	}
	if len(s.Endpoints) == 0 {
		errs = append(errs, usagef("--endpoints: no etcd endpoint"))
	}
	if (s.Cert == "") != (s.Key == "") {
		errs = append(errs, usagef("--cert and --key go together"))
	}
	return append(errs, l.validate()...)
}

func (l *lockOpts) validate() []error {
	var errs []error
	if l.lockName == "" || strings.HasSuffix(l.lockName, "/") {
		errs = append(errs, usagef("--lock-name %q: must be non-empty and not end in /", l.lockName))
	}
	// A hold key under the lock's prefix would join the mutex queue as its
	// oldest key: every restarter would wait behind it forever.
	if l.lockName != "" && strings.HasPrefix(l.holdKeyOrDefault(), lock.Prefix(l.lockName)) {
		errs = append(errs, usagef("--hold-key %q: inside the lock's prefix %q, where it would wedge the lock queue", l.holdKeyOrDefault(), lock.Prefix(l.lockName)))
	}
	// The same goes for the restart intents under it (--hold-key equal to
	// --lock-name puts them in the mutex queue), and for the participants'
	// info, which the queue listing reads by prefix too.
	if ip := hold.IntentPrefix(l.holdKeyOrDefault()); l.lockName != "" &&
		(strings.HasPrefix(ip, lock.Prefix(l.lockName)) || strings.HasPrefix(ip, lock.InfoPrefix(l.lockName))) {
		errs = append(errs, usagef("--hold-key %q: its restart intents (%s) would be inside the lock's prefixes %q or %q, where they would wedge the lock queue", l.holdKeyOrDefault(), ip, lock.Prefix(l.lockName), lock.InfoPrefix(l.lockName)))
	}
	return errs
}

// validate checks the restart flags; their durations that must be
// positive go to positive, to be reported in order with the others.
func (o *restartOpts) validate(positive map[string]time.Duration) []error {
	errs := o.ttlOpt.validate()
	positive["--lock-timeout"] = o.lockTimeout
	positive["--restart-timeout"] = o.restartTimeout
	if o.healthURL != "" {
		positive["--health-timeout"] = o.healthTimeout
		positive["--health-interval"] = o.healthInterval
	}
	if o.attempts < 1 {
		errs = append(errs, usagef("--attempts %d: must be at least 1", o.attempts))
	}
	if o.retryDelay < 0 || o.healthSettle < 0 {
		errs = append(errs, usagef("--retry-delay and --health-settle must not be negative"))
	}
	// A gate that must stay ready for as long as it may wait can never pass.
	if o.healthURL != "" && o.healthTimeout > 0 && o.healthSettle >= o.healthTimeout {
		errs = append(errs, usagef("--health-settle %s must be shorter than --health-timeout %s", o.healthSettle, o.healthTimeout))
	}
	if (o.healthCert == "") != (o.healthKey == "") {
		errs = append(errs, usagef("--health-cert and --health-key go together"))
	}
	return errs
}

func (o *ttlOpt) validate() []error {
	if o.ttl < 1 {
		return []error{usagef("--ttl %d: must be at least 1 second", o.ttl)}
	}
	return nil
}

// validate: the restarting commands' flags after the etcd ones.
func (o *restartingOpts) validate(s *shared, pre []error) []error {
	positive := map[string]time.Duration{}
	errs := validateEtcd(s, &o.lockOpts, append(pre, o.restartOpts.validate(positive)...), positive)
	errs = append(errs, o.prefixOpts.validate()...)
	errs = append(errs, o.hostOpt.validate()...)
	if o.trustTimeout < 0 {
		errs = append(errs, usagef("--trust-timeout %s: must not be negative", o.trustTimeout))
	}
	errs = append(errs, validateFleetFlags(o)...)
	return append(errs, o.cmOpts.validate()...)
}

func (o *outputOpt) validate() []error {
	if o.output != "text" && o.output != "json" {
		return []error{usagef("--output %q: want text or json", o.output)}
	}
	return nil
}

func (o *holdOpts) validate() []error {
	var errs []error
	if strings.TrimSpace(o.reason) == "" {
		errs = append(errs, usagef("hold needs --reason TEXT"))
	}
	// The reason is stored in etcd, readable by every host, and printed
	// by hold and status: key material must not get there, masked or not.
	if redact.HasKey(o.reason) {
		errs = append(errs, usagef("--reason holds private key material (not shown, nothing stored); describe the problem in words and name the key's file instead"))
	}
	return errs
}

// joinUsage is one usage error of all of errs, nil when there are none.
func joinUsage(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &usageError{Msg: strings.Join(msgs, "; ")}
}

func (l *lockOpts) holdKeyOrDefault() string {
	if l.holdKey != "" {
		return l.holdKey
	}
	return l.lockName + "-hold"
}

// hostname is the host name recorded in holder info and holds.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host-pid-" + strconv.Itoa(os.Getpid())
	}
	return h
}

func operatorUser() string {
	for _, v := range []string{"SUDO_USER", "USER", "LOGNAME"} {
		if u := os.Getenv(v); u != "" {
			return u
		}
	}
	return ""
}
