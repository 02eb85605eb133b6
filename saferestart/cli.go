package saferestart

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/keysync/confd/internal/etcdflags"
	"github.com/keysync/confd/internal/redact"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/suggest"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/fleet"
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
	// The effective configuration and where each value came from.
	cmdConfig = "config"
)

var subcommands = []string{cmdRestart, cmdStatus, cmdHold, cmdUnhold, cmdCheck, cmdVersion, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey, cmdConfig}

// restarting lists the subcommands that restart kube-apiserver and so take
// the restart flags and a command after --.
var restarting = []string{cmdRestart, cmdRotateKey}

// options is everything the command line says, after env fallbacks.
type options struct {
	sub  string
	argv []string // restart command; check: files

	// configPath is --config; cfg the file read ("" / nil: none), and
	// origin says where each flag's value came from: "flag", "env NAME",
	// "FILE:LINE" or "default".
	configPath string
	cfg        *config.File
	origin     map[string]string

	// etcd
	endpoints []string
	// endpointsFrom names where endpoints came from, for etcd errors.
	endpointsFrom  string
	cacert         string
	cert           string
	key            string
	user           string
	password       string
	dialTimeout    time.Duration
	commandTimeout time.Duration

	// lock and hold
	lockName    string
	ttl         int
	lockTimeout time.Duration
	holdKey     string
	ignoreHold  bool

	// restart
	restartTimeout time.Duration
	attempts       int
	retryDelay     time.Duration
	dryRun         bool

	// health gate
	healthURL      string
	healthCACert   string
	healthCert     string
	healthKey      string
	healthToken    string
	healthSettle   time.Duration
	healthTimeout  time.Duration
	healthInterval time.Duration
	jwksKeyFiles   []string

	// preflight
	preflightFiles      []string
	preflightFlagsFiles []string

	// key trust and rotation
	keysPrefix     string
	trustPrefix    string
	trustHostName  string
	trustTimeout   time.Duration
	publicKey      string
	signingKey     string
	certificate    string
	timeout        time.Duration
	excludeHosts   []string
	skipUnrecorded bool
	ifNewKey       bool
	algorithm      string
	grace          time.Duration
	rotationPrefix string
	abort          bool
	rollback       bool
	signer         bool // rotate-key: this host signs through kube-apiserver-sa-signer (signer.go)

	// fleet check (fleet.go)
	kubeconfig        string
	fleetLeaseAge     time.Duration
	minLiveAPIServers int
	fleetTimeout      time.Duration

	// restart modes (staticpod.go)
	restartMode          string
	criEndpoint          string
	staticPodStopTimeout time.Duration

	// kube-controller-manager (controllermanager.go)
	cmFlagsFiles   []string
	cmRestartMode  string
	cmHealthURL    string
	cmHealthCACert string
	// retire-keys
	ignoreLegacyTokens bool

	// subcommands
	reason      string
	publicOnly  bool
	keysOnly    bool
	requireKeys []string
	output      string

	logLevel  string
	logFormat string
	help      bool
}

// usageError is a command-line mistake (exit 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// etcdTargets are the options the shared etcd flags fill.
func (o *options) etcdTargets() etcdflags.Targets {
	return etcdflags.Targets{Endpoints: &o.endpoints, CACert: &o.cacert, Cert: &o.cert, Key: &o.key,
		User: &o.user, Password: &o.password, DialTimeout: &o.dialTimeout, CommandTimeout: &o.commandTimeout}
}

func newFlagSet(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet(progName, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false

	fs.StringVar(&o.configPath, "config", defaultConfig, "TOML file whose keys are these flags' long names (read only when present if not given; '' reads none); a flag beats ETCDCTL_* beats the file")
	etcdflags.Register(fs, o.etcdTargets())

	fs.StringVar(&o.lockName, "lock-name", "kube-apiserver-restart", "lock name, shared with etcdctl lock NAME")
	fs.IntVar(&o.ttl, "ttl", 10, "session lease TTL in seconds (as etcdctl lock --ttl)")
	fs.DurationVar(&o.lockTimeout, "lock-timeout", 10*time.Minute, "give up waiting for the lock after this long")
	fs.StringVar(&o.holdKey, "hold-key", "", "etcd key of the hold record (default LOCK-NAME-hold)")
	fs.BoolVar(&o.ignoreHold, "ignore-hold", false, "restart even while a hold is active")

	fs.DurationVar(&o.restartTimeout, "restart-timeout", 3*time.Minute, "kill the restart command's process group after this long")
	fs.IntVar(&o.attempts, "attempts", 2, "restart attempts (command + health gate) under one lock before stopping the line")
	fs.DurationVar(&o.retryDelay, "retry-delay", 5*time.Second, "pause between attempts")
	fs.StringVar(&o.restartMode, "restart-mode", modeSystemd, "how kube-apiserver is restarted without a command after --: systemd (systemctl restart kube-apiserver.service) or static-pod (stop its container through the CRI with crictl; the kubelet starts a new one)")
	fs.StringVar(&o.criEndpoint, "cri-endpoint", "", "static-pod: container runtime endpoint, passed to crictl as --runtime-endpoint (empty: crictl's own configuration)")
	fs.DurationVar(&o.staticPodStopTimeout, "static-pod-stop-timeout", 30*time.Second, "static-pod: how long the stopped container may drain before it is killed (crictl stop --timeout); --restart-timeout defaults to this plus the kubelet's 5m back-off and 30s")
	fs.BoolVar(&o.dryRun, "dry-run", false, "run preflight and the hold check, report what would happen and the worst-case duration (for confd's reload_cmd_timeout); lock and run nothing")

	fs.StringVar(&o.healthURL, "health-url", "https://127.0.0.1:6443/readyz", "readiness URL polled after the restart while the lock is held; empty turns the gate off")
	fs.StringVar(&o.healthCACert, "health-cacert", "", "CA bundle to verify the apiserver's serving certificate")
	fs.StringVar(&o.healthCert, "health-cert", "", "client certificate for the health check")
	fs.StringVar(&o.healthKey, "health-key", "", "client private key for the health check")
	fs.StringVar(&o.healthToken, "health-token-file", "", "file holding a bearer token for the health check")
	fs.DurationVar(&o.healthSettle, "health-settle", 5*time.Second, "how long the apiserver must stay ready")
	fs.DurationVar(&o.healthTimeout, "health-timeout", 3*time.Minute, "give up waiting for readiness after this long")
	fs.DurationVar(&o.healthInterval, "health-interval", time.Second, "pause between health probes")
	fs.StringArrayVar(&o.jwksKeyFiles, "jwks-key-file", nil, "service-account public key file the apiserver's JWKS must serve once ready (repeatable)")

	fs.StringArrayVar(&o.preflightFiles, "preflight-file", nil, "PEM file checked before taking the lock (repeatable)")
	fs.StringArrayVar(&o.preflightFlagsFiles, "preflight-flags-file", nil, "kube-apiserver flags file or EnvironmentFile whose referenced files are checked before taking the lock (repeatable)")

	fs.StringVar(&o.keysPrefix, "keys-prefix", trust.DefaultKeysPrefix, "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)")
	fs.StringVar(&o.trustPrefix, "trust-prefix", trust.DefaultPrefix, "etcd prefix of the trust records: PREFIX/HOST lists the keys HOST's apiserver loaded at its last successful restart")
	fs.StringVar(&o.trustHostName, "host", "", "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f, as the publisher writes it), and in holds and the lock queue (default there: the kernel's host name)")
	fs.DurationVar(&o.trustTimeout, "trust-timeout", 15*time.Minute, "restart: when this host is about to sign with a new key, wait this long without the lock for every other host to trust it (0: do not wait)")
	fs.StringVar(&o.publicKey, "public-key", "", "wait-trusted: PEM file whose key(s) must be trusted (public key, or a private key's public half); rotate-key, retire-keys: this host's published public keys (default /etc/kubernetes/pki/sa.pub)")
	fs.StringVar(&o.signingKey, "signing-key", "", "rotate-key, retire-keys: this host's service-account signing key (default /etc/kubernetes/pki/sa.key); publish-key: publish its public half when --public-key is not given; restart, check: the key kube-apiserver-sa-signer signs with, looked for in its FetchKeys answer when a flags file names --service-account-signing-endpoint")
	fs.StringVar(&o.certificate, "certificate", "", "publish-key: publish this certificate (PEM) instead of a key; the previous one stays published beside it until retire-keys after --grace")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "wait-trusted, rotate-key: how long to wait for every host to trust the key")
	fs.StringArrayVar(&o.excludeHosts, "exclude-host", nil, "wait-trusted: do not wait for this host (repeatable; e.g. the host whose apiserver is about to start)")
	fs.BoolVar(&o.skipUnrecorded, "skip-unrecorded", false, "wait-trusted: do not wait for hosts that publish keys but have never recorded trust (new hosts, keys of hosts not running this tool)")
	fs.BoolVar(&o.ifNewKey, "if-new-key", false, "wait-trusted: wait only for keys this host (--host) was not signing with at its last recorded restart, and not for this host itself: a plain restart or reboot passes at once, as the restart's own trust gate does")
	fs.StringVar(&o.algorithm, "algorithm", "rsa-2048", "rotate-key: algorithm of the next key: rsa-2048 or ecdsa-p256")
	fs.DurationVar(&o.grace, "grace", 24*time.Hour, "rotate-key: how long the previous public key stays trusted after the new key signs (0: retire-keys may drop it at once)")
	fs.StringVar(&o.rotationPrefix, "rotation-prefix", rotation.DefaultPrefix, "rotate-key, retire-keys: etcd prefix of the per-host rotation state")
	fs.BoolVar(&o.abort, "abort", false, "rotate-key: abandon this host's rotation before its next key is installed (withdraws the next key; exit 3 once installed)")
	fs.BoolVar(&o.rollback, "rollback", false, "rotate-key: after the install, sign with the previous key again, through the lock, while it is still published (exit 3 once retired); the rolled-back key is retired by retire-keys after --grace")
	fs.BoolVar(&o.signer, "signer", false, "rotate-key: this host's apiserver signs through kube-apiserver-sa-signer: reload the signer (default command: systemctl reload kube-apiserver-sa-signer.service) instead of restarting the apiserver, and wait until it signs with the next key")

	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the local apiserver: restart, rotate-key: before going down, count the live apiservers from their identity Leases (needs list on leases in kube-system); retire-keys: refuse while legacy token Secrets hold the retiring key (needs list on secrets); empty: neither")
	fs.DurationVar(&o.fleetLeaseAge, "fleet-lease-age", 30*time.Second, "an apiserver whose identity Lease was renewed longer ago than this is not live (kube-apiserver renews every 10 s)")
	fs.IntVar(&o.minLiveAPIServers, "min-live-apiservers", fleet.AllOthers, "other apiservers that must be live before this one goes down (-1: every other apiserver that renewed its Lease in the last hour, and every other host that publishes keys and records trust)")
	fs.DurationVar(&o.fleetTimeout, "fleet-timeout", 10*time.Minute, "wait this long, holding no lock, for enough other apiservers to be live; then exit 5, nothing restarted")

	fs.StringArrayVar(&o.cmFlagsFiles, "controller-manager-flags-file", nil, "rotate-key: kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable); when its --service-account-private-key-file holds the rotated key, it is restarted after the apiserver")
	fs.StringVar(&o.cmRestartMode, "controller-manager-restart-mode", modeSystemd, "rotate-key: systemd (systemctl restart kube-controller-manager.service) or static-pod (its container, through crictl)")
	fs.StringVar(&o.cmHealthURL, "controller-manager-health-url", "https://127.0.0.1:10257/healthz", "rotate-key: kube-controller-manager's health URL, polled after its restart")
	fs.StringVar(&o.cmHealthCACert, "controller-manager-health-cacert", "", "rotate-key: CA of kube-controller-manager's serving certificate (empty: not verified, logged)")

	fs.BoolVar(&o.ignoreLegacyTokens, "ignore-legacy-tokens", false, "retire-keys: with --kubeconfig, retire even while legacy token Secrets hold tokens signed with the retiring key (logged)")

	fs.StringVar(&o.reason, "reason", "", "hold: why the line is stopped (required)")
	fs.BoolVar(&o.publicOnly, "public-only", false, "check: refuse private keys (the files must hold public material only)")
	fs.BoolVar(&o.keysOnly, "keys-only", false, "check: refuse certificates (every block must be a key, as a published service-account key is)")
	fs.StringArrayVar(&o.requireKeys, "require-key", nil, "check: the public half of this key file (public or private key PEM) must be loaded from every FILE (repeatable)")
	fs.StringVarP(&o.output, "output", "o", "text", "status, --dry-run: text or json")

	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json (logs go to stderr)")
	fs.BoolVarP(&o.help, "help", "h", false, "show this help")
	return fs
}

// flagScope lists the subcommands a flag applies to; flags not listed apply
// to all but check and version.
var flagScope = map[string][]string{
	"ttl": restarting, "lock-timeout": restarting, "ignore-hold": restarting,
	"restart-timeout": restarting, "attempts": restarting, "retry-delay": restarting, "dry-run": {cmdRestart, cmdRotateKey, cmdRetireKeys},
	"health-url": restarting, "health-cacert": restarting, "health-cert": restarting, "health-key": restarting,
	"health-token-file": restarting, "health-settle": restarting, "health-timeout": restarting,
	"health-interval": restarting, "jwks-key-file": restarting,
	"preflight-file": {cmdRestart, cmdRotateKey, cmdCheck}, "preflight-flags-file": {cmdRestart, cmdRotateKey, cmdCheck},
	"keys-prefix":   {cmdRestart, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"trust-prefix":  {cmdRestart, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys},
	"host":          {cmdRestart, cmdHold, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"trust-timeout": restarting,
	"public-key":    {cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"signing-key":   {cmdRotateKey, cmdRetireKeys, cmdPublishKey, cmdRestart, cmdCheck},
	"certificate":   {cmdPublishKey},
	"config":        subcommands,
	"timeout":       {cmdWaitTrusted, cmdRotateKey},
	"exclude-host":  {cmdWaitTrusted}, "skip-unrecorded": {cmdWaitTrusted}, "if-new-key": {cmdWaitTrusted},
	"algorithm": {cmdRotateKey}, "grace": {cmdRotateKey, cmdPublishKey}, "abort": {cmdRotateKey}, "rollback": {cmdRotateKey},
	"rotation-prefix": {cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"signer":          {cmdRotateKey},
	"reason":          {cmdHold},
	"public-only":     {cmdCheck},
	"require-key":     {cmdCheck},
	"keys-only":       {cmdCheck},
	"output":          {cmdStatus, cmdRestart, cmdTrust},
	"log-level":       subcommands, "log-format": subcommands, "help": subcommands,
	"restart-mode": restarting, "cri-endpoint": restarting, "static-pod-stop-timeout": restarting,
	"kubeconfig": {cmdRestart, cmdRotateKey, cmdRetireKeys}, "ignore-legacy-tokens": {cmdRetireKeys}, "fleet-lease-age": restarting, "min-live-apiservers": restarting, "fleet-timeout": restarting,
}

type lookupEnv func(string) (string, bool)

// parseArgs turns the command line into options. The first positional
// argument (before any --) names the subcommand; none means restart.
func parseArgs(args []string, env lookupEnv) (*options, *pflag.FlagSet, error) {
	o := &options{origin: map[string]string{}}
	fs := newFlagSet(o)
	if err := fs.Parse(args); err != nil {
		return nil, fs, flagError(fs, err)
	}
	if o.help {
		return o, fs, nil
	}
	pos, after := fs.Args(), []string(nil)
	if d := fs.ArgsLenAtDash(); d >= 0 {
		pos, after = fs.Args()[:d], fs.Args()[d:]
	}
	o.sub = cmdRestart
	if len(pos) > 0 {
		o.sub = pos[0]
		pos = pos[1:]
	}
	known := false
	for _, s := range subcommands {
		known = known || s == o.sub
	}
	if !known {
		if m := suggest.Closest(o.sub, subcommands); m != "" {
			return nil, fs, usagef("unknown subcommand %q; did you mean %s?", o.sub, m)
		}
		return nil, fs, usagef("unknown subcommand %q (want one of %s; put a restart command after --)", o.sub, strings.Join(subcommands, ", "))
	}
	var bad []string
	fs.Visit(func(f *pflag.Flag) {
		o.origin[f.Name] = "flag"
		if !applies(f.Name, o.sub) {
			bad = append(bad, "--"+f.Name)
		}
	})
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, fs, usagef("%s does not apply to %s", strings.Join(bad, ", "), o.sub)
	}
	switch o.sub {
	case cmdRestart, cmdRotateKey:
		if len(pos) > 0 {
			return nil, fs, usagef("unexpected argument %q: put the restart command after --", pos[0])
		}
		if err := applyRestartMode(o, fs); err != nil {
			return nil, fs, err
		}
		o.argv = modeCommand(o)
		if fs.ArgsLenAtDash() >= 0 {
			if len(after) == 0 {
				return nil, fs, usagef("no command after --")
			}
			o.argv = after
		}
	case cmdCheck:
		o.argv = append(pos, after...)
		if err := o.readConfig(fs); err != nil {
			return nil, fs, err
		}
		if len(o.argv)+len(o.preflightFiles)+len(o.preflightFlagsFiles) == 0 {
			return nil, fs, usagef("check needs at least one FILE, --preflight-file or --preflight-flags-file")
		}
		if len(o.requireKeys) > 0 && len(o.argv) == 0 {
			return nil, fs, usagef("--require-key applies to bundle FILEs, and none was given")
		}
	default:
		if len(pos)+len(after) > 0 {
			return nil, fs, usagef("%s takes no arguments, got %q", o.sub, append(pos, after...))
		}
	}
	if o.sub != cmdCheck && o.sub != cmdVersion { // they use no etcd
		if err := o.readConfig(fs); err != nil {
			return nil, fs, err
		}
		if err := applyEnv(o, fs, env); err != nil {
			return nil, fs, err
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if o.origin[f.Name] == "" {
			o.origin[f.Name] = "default"
		}
	})
	return o, fs, o.fromFile(validate(o))
}

// applies reports whether a flag means something to a subcommand: flags
// not in flagScope apply to all but check and version; config shows them
// all.
func applies(flag, sub string) bool {
	if sub == cmdConfig {
		return true
	}
	scope, ok := flagScope[flag]
	if !ok {
		return sub != cmdCheck && sub != cmdVersion
	}
	return slices.Contains(scope, sub)
}

// readConfig reads --config (its default only when present) and sets the
// flags the command line did not give and the subcommand uses.
func (o *options) readConfig(fs *pflag.FlagSet) error {
	path := o.configPath
	if path == "" {
		return nil
	}
	if !fs.Changed("config") {
		if _, err := os.Stat(path); err != nil {
			return nil // the default, absent: no file
		}
	}
	f, err := config.Load(path)
	if err != nil {
		return usagef("--config: %v", err)
	}
	o.cfg = f
	// check's inputs from the file are the restart's: check reads them
	// only when its command line names nothing to check (then it checks
	// what the restart would preflight).
	given := o.sub == cmdCheck && (len(o.argv) > 0 || fs.Changed("preflight-file") || fs.Changed("preflight-flags-file"))
	set, err := f.Apply(fs, func(name string) bool {
		if given && (name == "preflight-file" || name == "preflight-flags-file") {
			return false
		}
		return applies(name, o.sub)
	})
	for _, n := range set {
		o.origin[n] = f.Where(n)
	}
	if err != nil {
		return usagef("--config: %v", err)
	}
	return nil
}

// flagRef matches a flag named in a message.
var flagRef = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)

// fromFile adds to a usage error the place in the configuration file of
// every value it names that came from there: the operator fixes the file,
// not a command line they never typed.
func (o *options) fromFile(err error) error {
	var ue *usageError
	if err == nil || o.cfg == nil || !errors.As(err, &ue) {
		return err
	}
	msg := flagRef.ReplaceAllStringFunc(ue.msg, func(m string) string {
		if where := o.cfg.Where(m[2:]); where != "" && o.origin[m[2:]] == where {
			return m + " (" + where + ")"
		}
		return m
	})
	return &usageError{msg}
}

// flagError is pflag's error, with what an unknown flag probably meant.
func flagError(fs *pflag.FlagSet, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) && ne.GetSpecifiedName() != "" {
		var names []string
		fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
		if m := suggest.Closest(ne.GetSpecifiedName(), names); m != "" {
			return usagef("%v; did you mean --%s?", err, m)
		}
	}
	return usagef("%v", err)
}

// applyEnv fills etcd settings from etcdctl's environment variables where
// the flag was not given: a flag beats the environment.
func applyEnv(o *options, fs *pflag.FlagSet, env lookupEnv) error {
	o.endpointsFrom = endpointsDefault
	if fs.Changed("endpoints") {
		o.endpointsFrom = "from --endpoints"
	} else if where := o.cfg.Where("endpoints"); where != "" && o.origin["endpoints"] == where {
		o.endpointsFrom = "from " + where
	}
	err := etcdflags.ApplyEnv(fs, o.etcdTargets(), env, func(flag, variable string) {
		o.origin[flag] = "env " + variable
		if flag == "endpoints" {
			o.endpointsFrom = "from " + variable
		}
	})
	if err != nil {
		return usagef("%v", err)
	}
	split, err := etcdflags.SplitUser(&o.user, &o.password)
	if split {
		o.origin["password"] = o.origin["user"]
	}
	if err != nil {
		return usagef("%v", err)
	}
	return nil
}

// endpointsDefault is endpointsFrom when neither the flag nor the
// environment named the endpoints.
const endpointsDefault = "the default: neither --endpoints, ETCDCTL_ENDPOINTS nor the configuration file sets them"

func validate(o *options) error {
	if o.sub == cmdCheck || o.sub == cmdVersion {
		return nil
	}
	var errs []error
	positive := map[string]time.Duration{
		"--dial-timeout": o.dialTimeout, "--command-timeout": o.commandTimeout,
	}
	if slices.Contains(restarting, o.sub) {
		positive["--lock-timeout"] = o.lockTimeout
		positive["--restart-timeout"] = o.restartTimeout
		if o.healthURL != "" {
			positive["--health-timeout"] = o.healthTimeout
			positive["--health-interval"] = o.healthInterval
		}
		if o.ttl < 1 {
			errs = append(errs, usagef("--ttl %d: must be at least 1 second", o.ttl))
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
	}
	names := make([]string, 0, len(positive))
	for n := range positive {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if positive[n] <= 0 {
			errs = append(errs, usagef("%s %s: must be positive", n, positive[n]))
		}
	}
	if len(o.endpoints) == 0 {
		errs = append(errs, usagef("--endpoints: no etcd endpoint"))
	}
	if (o.cert == "") != (o.key == "") {
		errs = append(errs, usagef("--cert and --key go together"))
	}
	if o.lockName == "" || strings.HasSuffix(o.lockName, "/") {
		errs = append(errs, usagef("--lock-name %q: must be non-empty and not end in /", o.lockName))
	}
	// A hold key under the lock's prefix would join the mutex queue as its
	// oldest key: every restarter would wait behind it forever.
	if o.lockName != "" && strings.HasPrefix(o.holdKeyOrDefault(), lock.Prefix(o.lockName)) {
		errs = append(errs, usagef("--hold-key %q: inside the lock's prefix %q, where it would wedge the lock queue", o.holdKeyOrDefault(), lock.Prefix(o.lockName)))
	}
	errs = append(errs, validateKeyFlags(o)...)
	errs = append(errs, validateFleetFlags(o)...)
	errs = append(errs, validateControllerManagerFlags(o)...)
	if o.sub == cmdHold && strings.TrimSpace(o.reason) == "" {
		errs = append(errs, usagef("hold needs --reason TEXT"))
	}
	// The reason is stored in etcd, readable by every host, and printed
	// by hold and status: key material must not get there, masked or not.
	if o.sub == cmdHold && redact.HasKey(o.reason) {
		errs = append(errs, usagef("--reason holds private key material (not shown, nothing stored); describe the problem in words and name the key's file instead"))
	}
	if o.output != "text" && o.output != "json" {
		errs = append(errs, usagef("--output %q: want text or json", o.output))
	}
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return &usageError{strings.Join(msgs, "; ")}
}

func (o *options) holdKeyOrDefault() string {
	if o.holdKey != "" {
		return o.holdKey
	}
	return o.lockName + "-hold"
}

func writeHelp(w io.Writer, fs *pflag.FlagSet) {
	var b strings.Builder
	fmt.Fprintf(&b, `Usage:
  %[1]s [flags] [-- COMMAND ARGS...]   restart (default command: %[2]s)
  %[1]s status [--output json]         show lock holder, waiters (FIFO) and hold
  %[1]s hold --reason TEXT             stop every host from restarting
  %[1]s unhold                         allow restarts again
  %[1]s check [--public-only] [--keys-only] [--require-key K] [FILE...] [--preflight-flags-file F [--signing-key K]]  validate PEM files or an apiserver flags file (confd check_cmd); no etcd
  %[1]s version
  %[1]s trust [--output json]          hosts × service-account key IDs: signing, trusted, stale hosts
  %[1]s wait-trusted --public-key FILE [--timeout D]   exit 0 once every publishing host trusts FILE's key; 5 on timeout
  %[1]s rotate-key [restart flags] [-- COMMAND]        rotate this host's service-account key (resumable; --dry-run shows the steps)
  %[1]s retire-keys                    drop the previous public key once its --grace is over (for a systemd timer)
  %[1]s publish-key [--certificate F]   publish this host's public key(s) (--public-key, or --signing-key's public half) when they changed
  %[1]s config                         print the effective configuration and where each value came from

Configuration: every flag's long name is a key of the TOML file --config
(default %[3]s, read when present): e.g. endpoints = ["https://..."],
health-url = "...", preflight-flags-file = [...]. A flag beats ETCDCTL_*,
which beats the file; a list on the command line replaces the file's.

Restart: preflight the files the new apiserver will read; refuse if a hold is
active; take the etcd lock (interoperable with `+"`etcdctl lock NAME`"+`; the command
gets ETCD_LOCK_KEY and ETCD_LOCK_REV); check the hold again; run the command in
its own process group; hold the lock until the health URL reports ready; on
failure write a hold that stops every host until `+"`unhold`"+`.

Flags:
`, progName, strings.Join(defaultCommand, " "), config.DefaultPath)
	b.WriteString(fs.FlagUsages())
	b.WriteString("\nExit codes:\n")
	for _, c := range exitCodeDocs {
		fmt.Fprintf(&b, "  %d  %s\n", c.code, c.text)
	}
	b.WriteString("\nEnvironment: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,\nETCDCTL_USER, ETCDCTL_PASSWORD, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT as for\netcdctl; a flag beats the environment. The password is never logged, and\nETCDCTL_USER/ETCDCTL_PASSWORD are removed from the restart command's environment.\n")
	_, _ = io.WriteString(w, b.String())
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
