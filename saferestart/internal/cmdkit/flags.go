package cmdkit

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/fleet"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/keywatch"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
	"github.com/keysync/confd/saferestart/internal/tokenprobe"
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

// A command's options hold the values of its own flags only: a field
// tagged `flag:"NAME"` is flag --NAME, and groups of flags several commands
// take are embedded. Register adds them in field order, which is the order
// --help lists them in; any other flag is unknown to the command. Long
// names are config.Keys, shared with kube-apiserver-sa-signer.

// Lock is the lock and its hold: every command that talks to etcd.
type Lock struct {
	LockName string `flag:"lock-name"`
	HoldKey  string `flag:"hold-key"`
}

// TTLFlag is the lease of what a command keeps in etcd while it runs (the
// lock's session; wait-trusted's waiting record; the publisher's alive
// record), gone this long after the process dies.
type TTLFlag struct {
	TTL int `flag:"ttl"`
}

// HealthCreds are how this host's helpers reach their own apiserver (the
// health gate; the stale-token sampler reads /metrics with the same
// identity, so one set of keys in safe-restart.toml serves both).
type HealthCreds struct {
	HealthCACert string `flag:"health-cacert"`
	HealthCert   string `flag:"health-cert"`
	HealthKey    string `flag:"health-key"`
	HealthToken  string `flag:"health-token-file"`
}

// RestartFlags: how restart and rotate-key restart kube-apiserver.
type RestartFlags struct {
	TTLFlag
	LockTimeout          time.Duration `flag:"lock-timeout"`
	IgnoreHold           bool          `flag:"ignore-hold"`
	RestartTimeout       time.Duration `flag:"restart-timeout"`
	Attempts             int           `flag:"attempts"`
	RetryDelay           time.Duration `flag:"retry-delay"`
	RestartMode          string        `flag:"restart-mode"`
	CRIEndpoint          string        `flag:"cri-endpoint"`
	StaticPodStopTimeout time.Duration `flag:"static-pod-stop-timeout"`
	HealthURL            string        `flag:"health-url"`
	HealthCreds
	HealthSettle      time.Duration `flag:"health-settle"`
	HealthTimeout     time.Duration `flag:"health-timeout"`
	HealthInterval    time.Duration `flag:"health-interval"`
	JWKSKeyFiles      []string      `flag:"jwks-key-file"`
	TrustTimeout      time.Duration `flag:"trust-timeout"`
	FleetLeaseAge     time.Duration `flag:"fleet-lease-age"`
	MinLiveAPIServers int           `flag:"min-live-apiservers"`
	FleetTimeout      time.Duration `flag:"fleet-timeout"`
}

// Preflight are the files checked before the lock (restart, rotate-key) or
// by check; for wait-trusted --if-new-key, the files the apiserver about to
// start loads, recorded as its trust.
type Preflight struct {
	PreflightFiles      []string `flag:"preflight-file"`
	PreflightFlagsFiles []string `flag:"preflight-flags-file"`
}

// Prefixes: the three prefixes, for the commands that read trust.
type Prefixes struct {
	KeysPrefix     string `flag:"keys-prefix"`
	TrustPrefix    string `flag:"trust-prefix"`
	RotationPrefix string `flag:"rotation-prefix"`
}

type Host struct {
	HostName string `flag:"host"`
}

type OutputFlag struct {
	Output string `flag:"output"`
}

// ControllerManager: kube-controller-manager, which signs legacy tokens
// with the service-account key too: read by restart (its key goes in the
// trust record), rotate-key (restarted after the apiserver) and
// retire-keys (refuses to retire the key it signs with).
type ControllerManager struct {
	CMFlagsFiles   []string `flag:"controller-manager-flags-file"`
	CMRestartMode  string   `flag:"controller-manager-restart-mode"`
	CMHealthURL    string   `flag:"controller-manager-health-url"`
	CMHealthCACert string   `flag:"controller-manager-health-cacert"`
}

type CheckFlags struct {
	PublicOnly         bool     `flag:"public-only"`
	KeysOnly           bool     `flag:"keys-only"`
	RequireKeys        []string `flag:"require-key"`
	RequireSigningKeys bool     `flag:"require-signing-keys"`
}

type WaitTrustedFlags struct {
	ExcludeHosts   []string `flag:"exclude-host"`
	SkipUnrecorded bool     `flag:"skip-unrecorded"`
	IfNewKey       bool     `flag:"if-new-key"`
}

type RotateKeyFlags struct {
	Algorithm string `flag:"algorithm"`
	Abort     bool   `flag:"abort"`
	Rollback  bool   `flag:"rollback"`
	Signer    bool   `flag:"signer"` // this host signs through kube-apiserver-sa-signer (restartcmd.Step)
}

type PublishWatchFlags struct {
	Watch                bool          `flag:"watch"`
	ReconcileInterval    time.Duration `flag:"reconcile-interval"`
	StateDir             string        `flag:"state-dir"`
	PublisherMetricsAddr string        `flag:"publisher-metrics-addr"`
}

type RetireKeysFlags struct {
	IgnoreLegacyTokens bool `flag:"ignore-legacy-tokens"`
	// stale-token evidence (keycmd): retire-keys' window and override
	StaleTokenWindow  time.Duration `flag:"stale-token-window"`
	IgnoreStaleTokens bool          `flag:"ignore-stale-tokens"`
}

// Restarting are the flags of the commands that restart kube-apiserver
// (restart, rotate-key) and their command after --.
type Restarting struct {
	Argv []string
	Lock
	RestartFlags
	Preflight
	DryRun bool `flag:"dry-run"`
	Prefixes
	Host
	SigningKey string `flag:"signing-key"`
	Kubeconfig string `flag:"kubeconfig"`
	ControllerManager
	// restart's and rotate-key's node_exporter textfile (saferestart's
	// textfile.go writes it at exit)
	MetricsTextfile string `flag:"metrics-textfile"`
}

// flagDefs are every flag's default and help, by long name.
var flagDefs = map[string]struct {
	def   any
	help  string
	short string
	comma bool // a []string flag that also splits on commas
}{
	"lock-name": {def: "kube-apiserver-restart", help: "lock name, shared with etcdctl lock NAME"},
	"hold-key":  {def: "", help: "etcd key of the hold record (default LOCK-NAME-hold)"},

	// The restart: how restart and rotate-key restart kube-apiserver. --ttl is
	// also the lease of what wait-trusted and publish-key --watch keep in etcd
	// while they run (their waiting and alive records).
	"ttl":                     {def: ClaimTTL, help: "session lease TTL in seconds (as etcdctl lock --ttl); wait-trusted: of its waiting record; publish-key --watch: of its alive record"},
	"lock-timeout":            {def: 10 * time.Minute, help: "give up waiting for the lock after this long"},
	"ignore-hold":             {def: false, help: "restart even while a hold is active"},
	"restart-timeout":         {def: 3 * time.Minute, help: "kill the restart command's process group after this long"},
	"attempts":                {def: 2, help: "restart attempts (command + health gate) under one lock before stopping the line"},
	"retry-delay":             {def: 5 * time.Second, help: "pause between attempts"},
	"restart-mode":            {def: ModeSystemd, help: "how kube-apiserver is restarted without a command after --: systemd (systemctl restart kube-apiserver.service) or static-pod (stop its container through the CRI with crictl; the kubelet starts a new one)"},
	"cri-endpoint":            {def: "", help: "static-pod: container runtime endpoint, passed to crictl as --runtime-endpoint (empty: crictl's own configuration)"},
	"static-pod-stop-timeout": {def: 30 * time.Second, help: "static-pod: how long the stopped container may drain before it is killed (crictl stop --timeout); --restart-timeout defaults to this plus the kubelet's 5m back-off and 30s"},
	"health-url":              {def: "https://127.0.0.1:6443/readyz", help: "readiness URL polled after the restart while the lock is held; empty turns the gate off"},

	"health-cacert":     {def: "", help: "CA bundle to verify the apiserver's serving certificate (health gate; stale-token sampler)"},
	"health-cert":       {def: "", help: "client certificate for the health check and the stale-token sampler's /metrics reads"},
	"health-key":        {def: "", help: "client private key for the health check and the stale-token sampler's /metrics reads"},
	"health-token-file": {def: "", help: "file holding a bearer token for the health check and the stale-token sampler's /metrics reads"},

	"health-settle":       {def: 5 * time.Second, help: "how long the apiserver must stay ready"},
	"health-timeout":      {def: 3 * time.Minute, help: "give up waiting for readiness after this long"},
	"health-interval":     {def: time.Second, help: "pause between health probes"},
	"jwks-key-file":       {help: "service-account public key file the apiserver's JWKS must serve once ready (repeatable)"},
	"trust-timeout":       {def: 15 * time.Minute, help: "restart: when this host is about to sign with a new key, wait this long without the lock for every other host to trust it (0: do not wait)"},
	"fleet-lease-age":     {def: DefaultFleetLeaseAge, help: "an apiserver whose identity Lease was renewed longer ago than this is not live (kube-apiserver renews every 10 s)"},
	"min-live-apiservers": {def: fleet.AllOthers, help: "other apiservers that must be live before this one goes down (-1: every other apiserver that renewed its Lease in the last hour, and every other host that publishes keys and records trust)"},
	"fleet-timeout":       {def: 10 * time.Minute, help: "wait this long, holding no lock, for enough other apiservers to be live; then exit 5, nothing restarted"},

	"preflight-file":       {help: "PEM file checked before taking the lock (repeatable); wait-trusted --if-new-key: recorded as the starting apiserver's trust"},
	"preflight-flags-file": {help: "kube-apiserver flags file or EnvironmentFile whose referenced files are checked before taking the lock (repeatable); wait-trusted --if-new-key: its service-account key files are recorded as the starting apiserver's trust"},

	"dry-run":         {def: false, help: "restart, rotate-key: run preflight and the hold check, report what would happen and the worst-case duration (for confd's reload_cmd_timeout); lock and run nothing; retire-keys, forget-host: print what would be retired, written or deleted, and write nothing"},
	"keys-prefix":     {def: trust.DefaultKeysPrefix, help: "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)"},
	"trust-prefix":    {def: trust.DefaultPrefix, help: "etcd prefix of the trust records: PREFIX/HOST lists the keys HOST's apiserver loaded at its last successful restart"},
	"rotation-prefix": {def: rotation.DefaultPrefix, help: "etcd prefix of the per-host rotation records: PREFIX/HOST/state (rotate-key, retire-keys; shown by status), PREFIX/HOST/kept (the key record: superseded and retired keys, forgotten hosts; publish-key, rotate-key, retire-keys, forget-host), PREFIX/HOST/waiting (written by wait-trusted while it waits; read by restart's fleet check, status and trust) and PREFIX/HOST/alive (kept by publish-key --watch while it runs; forget-host refuses while it exists)"},
	"host":            {def: "", help: "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f, as the publisher writes it), and in holds and the lock queue (default there: the kernel's host name)"},
	"public-key":      {def: "", help: "wait-trusted: PEM file whose key(s) must be trusted (public key, or a private key's public half); rotate-key, retire-keys: this host's published public keys (default /etc/kubernetes/pki/sa.pub)"},
	"signing-key":     {def: "", help: "rotate-key, retire-keys: this host's service-account signing key (default /etc/kubernetes/pki/sa.key); publish-key: publish its public half when --public-key is not given; restart, check: the key kube-apiserver-sa-signer signs with, looked for in its FetchKeys answer when a flags file names --service-account-signing-endpoint"},
	"timeout":         {def: 15 * time.Minute, help: "wait-trusted, rotate-key: how long to wait for every host to trust the key"},
	"kubeconfig":      {def: "", help: "kubeconfig of the local apiserver: restart, rotate-key: before going down, count the live apiservers from their identity Leases (needs list on leases in kube-system); retire-keys: refuse while legacy token Secrets hold the retiring key (needs list on secrets); forget-host: refuse while HOST's apiserver's identity Lease is live (needs list on leases); empty: none of these"},
	"grace":           {def: 24 * time.Hour, help: "rotate-key, publish-key, forget-host: how long a superseded public key (the previous key, one the published source no longer holds, or a forgotten host's) stays published before retire-keys retires it; fixed when superseded (0: at the next retire-keys)"},
	"output":          {def: "text", short: "o", help: "status, trust, restart --dry-run: text or json"},

	"controller-manager-flags-file":    {help: "rotate-key: kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable); when its --service-account-private-key-file holds the rotated key, it is restarted after the apiserver"},
	"controller-manager-restart-mode":  {def: ModeSystemd, help: "rotate-key: systemd (systemctl restart kube-controller-manager.service) or static-pod (its container, through crictl)"},
	"controller-manager-health-url":    {def: "https://127.0.0.1:10257/healthz", help: "rotate-key: kube-controller-manager's health URL, polled after its restart"},
	"controller-manager-health-cacert": {def: "", help: "rotate-key: CA of kube-controller-manager's serving certificate (empty: not verified, logged)"},

	"metrics-textfile":      {def: "", help: "restart, rotate-key: at exit, write when the command ended and its exit code (kube_apiserver_safe_restart_last_run_timestamp_seconds{command}, ..._last_run_exit_code{command}) to this node_exporter textfile (a .prom file in its --collector.textfile.directory), atomically, keeping the other command's lines; not with --dry-run"},
	"apiserver-metrics-url": {def: "", help: "this host's apiserver's /metrics (e.g. https://127.0.0.1:6443/metrics), sampled every minute for serviceaccount_stale_tokens_total into ROTATION-PREFIX/HOST/stale-tokens, which retire-keys weighs; read with --health-cacert and --health-cert/--health-key or --health-token-file (needs get on the non-resource URL /metrics); empty: not sampled"},

	// The flags of one command each.
	"reason":                 {def: "", help: "hold: why the line is stopped (required)"},
	"public-only":            {def: false, help: "check: refuse private keys (the files must hold public material only)"},
	"keys-only":              {def: false, help: "check: refuse certificates (every block must be a key, as a published service-account key is)"},
	"require-key":            {help: "check: the public half of this key file (public or private key PEM) must be loaded from every FILE (repeatable)"},
	"require-signing-keys":   {def: false, help: "check: read the trust records (--trust-prefix) and the published keys (--keys-prefix) from etcd and refuse (exit 3) a FILE that lacks a key a host's apiserver, kube-apiserver-sa-signer or kube-controller-manager signs with; etcd not answering refuses too (exit 1)"},
	"exclude-host":           {help: "wait-trusted: do not wait for this host (repeatable; e.g. the host whose apiserver is about to start)"},
	"skip-unrecorded":        {def: false, help: "wait-trusted: do not wait for hosts that publish keys but have never recorded trust (new hosts, keys of hosts not running this tool)"},
	"if-new-key":             {def: false, help: "wait-trusted: wait only for keys this host (--host) was not signing with at its last recorded restart, and not for this host itself: a plain restart or reboot passes at once, as the restart's own trust gate does"},
	"algorithm":              {def: "rsa-2048", help: "rotate-key: algorithm of the next key: rsa-2048 or ecdsa-p256"},
	"abort":                  {def: false, help: "rotate-key: abandon this host's rotation before its next key is installed (withdraws the next key; exit 3 once installed)"},
	"rollback":               {def: false, help: "rotate-key: after the install, sign with the previous key again, through the lock, while it is still published (exit 3 once retired); the rolled-back key is retired by retire-keys after --grace"},
	"signer":                 {def: false, help: "rotate-key: this host's apiserver signs through kube-apiserver-sa-signer: reload the signer (default command: systemctl reload kube-apiserver-sa-signer.service) instead of restarting the apiserver, and wait until it signs with the next key"},
	"certificate":            {def: "", help: "publish-key: publish this certificate (PEM) instead of a key; a previous one with another key stays published beside it until retire-keys after --grace"},
	"watch":                  {def: false, help: "publish-key: keep running and keep this host's keys and every tombstone seen published: reconcile at start, when the key files change, when etcd's copy changes, after an etcd restore and every --reconcile-interval (sa-key-publish.service)"},
	"reconcile-interval":     {def: MaxReconcileInterval, help: "publish-key --watch: reconcile at least this often (at most 30s: what etcd lost is published again within it)"},
	"state-dir":              {def: "/var/lib/kube-apiserver-safe-restart", help: "publish-key --watch: directory of the tombstones this master has seen (" + keywatch.TombstonesFile + "), written back to etcd when a restore loses them; unwritable: logged and counted, not fatal"},
	"publisher-metrics-addr": {def: "", help: "publish-key --watch: serve Prometheus metrics (kube_apiserver_safe_restart_publisher_...) and /healthz on this address (empty: none)"},
	"ignore-legacy-tokens":   {def: false, help: "retire-keys: with --kubeconfig, retire even while legacy token Secrets hold tokens signed with the retiring key (logged)"},
	"stale-token-window":     {def: time.Hour, help: "retire-keys: keep a due key while any apiserver's serviceaccount_stale_tokens_total (ROTATION-PREFIX/HOST/stale-tokens) grew within this long, and more than an hour after the key stopped signing (logged, exit 0)"},
	"ignore-stale-tokens":    {def: false, help: "retire-keys: retire even while stale service-account tokens are in use (logged at warning with the hosts and times overridden)"},

	// publish-key --watch's cross-acceptance probe.
	"token-probe-kubeconfig":      {def: "", help: "publish-key --watch: kubeconfig whose server is this host's apiserver (e.g. https://127.0.0.1:6443, not the load balancer) and whose identity may create tokens for --token-probe-service-account (examples/rbac/token-probe.yaml); every --token-probe-interval a token from it is presented to every apiserver and the row exported as kube_apiserver_safe_restart_token_accepted{issuer_host,verifier_host} on --publisher-metrics-addr; empty: no probe"},
	"token-probe-service-account": {def: tokenprobe.DefaultServiceAccount, help: "publish-key --watch: NAMESPACE/NAME of the service account the probe's tokens are for"},
	"token-probe-interval":        {def: tokenprobe.DefaultInterval, help: "publish-key --watch: how often the token probe runs"},
	"token-probe-apiservers":      {help: "publish-key --watch: the apiservers the probe presents tokens to, HOST=URL (repeatable or comma-separated; HOST is the verifier_host label); empty: the kubernetes Service's EndpointSlices in default (verifier_host is the address)", comma: true},
}

// Register adds to fs the flags of o's tagged fields, those of its
// embedded groups included, in field order.
func Register(fs *pflag.FlagSet, o any) {
	v := reflect.ValueOf(o).Elem()
	for i := range v.NumField() {
		sf := v.Type().Field(i)
		name := sf.Tag.Get("flag")
		if sf.Anonymous && sf.Type.Kind() == reflect.Struct {
			Register(fs, v.Field(i).Addr().Interface())
			continue
		}
		if name == "" {
			continue
		}
		d, ok := flagDefs[name]
		if !ok {
			panic(fmt.Sprintf("cmdkit.Register: field %s: flag %q has no row in flagDefs", sf.Name, name))
		}
		switch p := v.Field(i).Addr().Interface().(type) {
		case *string:
			fs.StringVarP(p, name, d.short, d.def.(string), d.help)
		case *bool:
			fs.BoolVar(p, name, d.def.(bool), d.help)
		case *int:
			fs.IntVar(p, name, d.def.(int), d.help)
		case *time.Duration:
			fs.DurationVar(p, name, d.def.(time.Duration), d.help)
		case *[]string:
			if d.comma {
				fs.StringSliceVar(p, name, nil, d.help)
			} else {
				fs.StringArrayVar(p, name, nil, d.help)
			}
		default:
			// A type added without a case here would silently register
			// no flag: the command's tests fail at start-up instead.
			panic(fmt.Sprintf("cmdkit.Register: field %s: flag %q of type %s has no case", sf.Name, name, sf.Type))
		}
	}
}

// DefaultFleetLeaseAge is --fleet-lease-age's default: three of
// kube-apiserver's 10 s renewals. forget-host takes an apiserver whose Lease
// is younger as live.
const DefaultFleetLeaseAge = 30 * time.Second

// ClaimTTL is --ttl's default, and the lease of the rotation claim of the
// commands without --ttl (retire-keys, forget-host), gone this long after
// the process dies.
const ClaimTTL = 10

// ValidateEtcd checks what every command that talks to etcd through the
// lock's names checks: pre (the command's own checks that come first),
// then durations that must be positive (the etcd timeouts and the
// command's), the etcd settings, the lock and hold names.
func ValidateEtcd(s *Shared, l *Lock, pre []error, positive map[string]time.Duration) []error {
	errs := pre
	p := map[string]time.Duration{"--dial-timeout": s.DialTimeout, "--command-timeout": s.CommandTimeout}
	maps.Copy(p, positive)
	for _, n := range slices.Sorted(maps.Keys(p)) {
		errs = append(errs, cli.UsageIf(p[n] <= 0, "%s %s: must be positive", n, p[n])...)
	}
	errs = append(errs, cli.UsageIf(len(s.Endpoints) == 0, "--endpoints: no etcd endpoint")...)
	errs = append(errs, cli.UsageIf((s.Cert == "") != (s.Key == ""), "--cert and --key go together")...)
	return append(errs, l.Validate()...)
}

func (l *Lock) Validate() []error {
	errs := cli.UsageIf(l.LockName == "" || strings.HasSuffix(l.LockName, "/"), "--lock-name %q: must be non-empty and not end in /", l.LockName)
	// A hold key under the lock's prefix would join the mutex queue as its
	// oldest key: every restarter would wait behind it forever.
	errs = append(errs, cli.UsageIf(l.LockName != "" && strings.HasPrefix(l.HoldKeyOrDefault(), lock.Prefix(l.LockName)), "--hold-key %q: inside the lock's prefix %q, where it would wedge the lock queue", l.HoldKeyOrDefault(), lock.Prefix(l.LockName))...)
	// The same goes for the restart intents under it (--hold-key equal to
	// --lock-name puts them in the mutex queue), and for the participants'
	// info, which the queue listing reads by prefix too.
	ip := hold.IntentPrefix(l.HoldKeyOrDefault())
	return append(errs, cli.UsageIf(l.LockName != "" && (strings.HasPrefix(ip, lock.Prefix(l.LockName)) || strings.HasPrefix(ip, lock.InfoPrefix(l.LockName))),
		"--hold-key %q: its restart intents (%s) would be inside the lock's prefixes %q or %q, where they would wedge the lock queue", l.HoldKeyOrDefault(), ip, lock.Prefix(l.LockName), lock.InfoPrefix(l.LockName))...)
}

// Validate checks the restart flags; their durations that must be
// positive go to positive, to be reported in order with the others.
func (o *RestartFlags) Validate(positive map[string]time.Duration) []error {
	errs := o.TTLFlag.Validate()
	positive["--lock-timeout"] = o.LockTimeout
	positive["--restart-timeout"] = o.RestartTimeout
	if o.HealthURL != "" {
		positive["--health-timeout"] = o.HealthTimeout
		positive["--health-interval"] = o.HealthInterval
	}
	errs = append(errs, cli.UsageIf(o.Attempts < 1, "--attempts %d: must be at least 1", o.Attempts)...)
	errs = append(errs, cli.UsageIf(o.RetryDelay < 0 || o.HealthSettle < 0, "--retry-delay and --health-settle must not be negative")...)
	// A gate that must stay ready for as long as it may wait can never pass.
	errs = append(errs, cli.UsageIf(o.HealthURL != "" && o.HealthTimeout > 0 && o.HealthSettle >= o.HealthTimeout, "--health-settle %s must be shorter than --health-timeout %s", o.HealthSettle, o.HealthTimeout)...)
	return append(errs, cli.UsageIf((o.HealthCert == "") != (o.HealthKey == ""), "--health-cert and --health-key go together")...)
}

func (o *TTLFlag) Validate() []error {
	return cli.UsageIf(o.TTL < 1, "--ttl %d: must be at least 1 second", o.TTL)
}

// Validate: the restarting commands' flags after the etcd ones.
func (o *Restarting) Validate(s *Shared) []error {
	positive := map[string]time.Duration{}
	errs := ValidateEtcd(s, &o.Lock, o.RestartFlags.Validate(positive), positive)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	errs = append(errs, cli.UsageIf(o.TrustTimeout < 0, "--trust-timeout %s: must not be negative", o.TrustTimeout)...)
	errs = append(errs, ValidateFleetFlags(o)...)
	return append(errs, o.ControllerManager.Validate()...)
}

func (o *OutputFlag) Validate() []error {
	return cli.UsageIf(o.Output != "text" && o.Output != "json", "--output %q: want text or json", o.Output)
}

func (l *Lock) HoldKeyOrDefault() string { return cmp.Or(l.HoldKey, l.LockName+"-hold") }

// Hostname is the host name recorded in holder info and holds.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host-pid-" + strconv.Itoa(os.Getpid())
	}
	return h
}

// ValidatePrefixes: the prefixes given must not be empty, and the keys'
// and the trust records' must differ.
func ValidatePrefixes(keysPrefix, trustPrefix, rotationPrefix *string) []error {
	var errs []error
	for _, p := range []struct {
		name string
		v    *string
	}{{"--keys-prefix", keysPrefix}, {"--trust-prefix", trustPrefix}, {"--rotation-prefix", rotationPrefix}} {
		if p.v != nil && strings.TrimSuffix(*p.v, "/") == "" {
			errs = append(errs, cli.Usagef("%s %q: must not be empty", p.name, *p.v))
		}
	}
	if keysPrefix != nil && trustPrefix != nil && etcdkey.Dir(*keysPrefix) == etcdkey.Dir(*trustPrefix) {
		errs = append(errs, cli.Usagef("--keys-prefix and --trust-prefix must differ (%q)", *keysPrefix))
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
	if h.HostName == "" {
		return nil
	}
	err := etcdkey.ValidHost(h.HostName)
	return cli.UsageIf(err != nil, "--host: %v", err)
}

func (h *Host) HostFlag() string { return h.HostName }

// KeyFileDefaults: rotate-key and retire-keys read sa.key and sa.pub unless
// told otherwise.
func KeyFileDefaults(signingKey, publicKey *string) {
	*signingKey = cmp.Or(*signingKey, DefaultSigningKey)
	*publicKey = cmp.Or(*publicKey, DefaultPublicKey)
}

func ValidateGrace(grace time.Duration) []error {
	return cli.UsageIf(grace < 0, "--grace %s: must not be negative", grace)
}

func ValidateTimeout(timeout time.Duration) []error {
	return cli.UsageIf(timeout <= 0, "--timeout %s: must be positive", timeout)
}

// Validate: without --watch the publisher's settings are ignored, not
// refused: the one file that sets them serves the one-shot publish-key too.
func (o *PublishWatchFlags) Validate() []error {
	return cli.UsageIf(o.ReconcileInterval <= 0 || o.ReconcileInterval > MaxReconcileInterval, "--reconcile-interval %s: must be positive and at most %s", o.ReconcileInterval, MaxReconcileInterval)
}

func ValidateFleetFlags(o *Restarting) []error {
	if o.Kubeconfig == "" {
		return nil
	}
	return append(cli.UsageIf(o.FleetLeaseAge <= 0, "--fleet-lease-age %s: must be positive", o.FleetLeaseAge),
		cli.UsageIf(o.FleetTimeout < 0, "--fleet-timeout %s: must not be negative", o.FleetTimeout)...)
}

func (o *ControllerManager) Validate() []error {
	return cli.UsageIf(o.CMRestartMode != ModeSystemd && o.CMRestartMode != ModeStaticPod,
		"--controller-manager-restart-mode %q: want %s or %s", o.CMRestartMode, ModeSystemd, ModeStaticPod)
}

const (
	DefaultSigningKey = "/etc/kubernetes/pki/sa.key"
	DefaultPublicKey  = "/etc/kubernetes/pki/sa.pub"
)

// MaxReconcileInterval, --reconcile-interval's default and bound, is how
// long etcd may lack what a master keeps published (issue 31: within 30 s).
const MaxReconcileInterval = 30 * time.Second

// Restart modes (--restart-mode): how kube-apiserver is restarted when no
// command is given after --.
const (
	ModeSystemd   = "systemd"
	ModeStaticPod = "static-pod"
)
