// Package config reads the one configuration file of the key-sync tools
// (kube-apiserver-safe-restart and kube-apiserver-sa-signer): flat TOML
// whose keys are the binaries' long flag names, so that the units, confd's
// reload_cmd, Puppet and the runbook say each setting once.
//
// Precedence, highest first: a flag on the command line, an ETCDCTL_*
// environment variable (etcd settings only), the file, the default. A list
// given on the command line replaces the file's list, as any other value.
package config

// DefaultPath is read when present and no --config is given.
const DefaultPath = "/etc/kubernetes/safe-restart.toml"

// Kind is the TOML type a key takes.
type Kind int

const (
	String   Kind = iota
	List          // an array of strings (a single string is a list of one)
	Duration      // a string time.ParseDuration takes, e.g. "30s"
	Int
	Bool
)

func (k Kind) String() string {
	switch k {
	case List:
		return "a list of strings"
	case Duration:
		return `a duration (a string such as "30s")`
	case Int:
		return "an integer"
	case Bool:
		return "a boolean"
	}
	return "a string"
}

// Key is one setting the file may hold.
type Key struct {
	Name string
	Kind Kind
	// Secret values are masked wherever the configuration is printed.
	Secret bool
}

// Keys is every key any of the binaries reads: one list, so that one file
// serves all of them. A binary ignores the keys it has no flag for, and
// each subcommand those it does not use. Command-line-only choices
// (--help, --version, --config, --dry-run, hold's --reason, rotate-key's --abort and
// --rollback, publish-key's --watch) are not keys.
var Keys = []Key{
	// etcd, as etcdctl takes it (ETCDCTL_* beats the file).
	{Name: "endpoints", Kind: List},
	{Name: "cacert", Kind: String},
	{Name: "cert", Kind: String},
	{Name: "key", Kind: String},
	{Name: "user", Kind: String, Secret: true}, // may be name:password
	{Name: "password", Kind: String, Secret: true},
	{Name: "dial-timeout", Kind: Duration},
	{Name: "command-timeout", Kind: Duration},

	// The restart lock and hold.
	{Name: "lock-name", Kind: String},
	{Name: "ttl", Kind: Int},
	{Name: "lock-timeout", Kind: Duration},
	{Name: "hold-key", Kind: String},
	{Name: "ignore-hold", Kind: Bool},

	// The restart.
	{Name: "restart-timeout", Kind: Duration},
	// restart and rotate-key: node_exporter's textfile of the last run.
	{Name: "metrics-textfile", Kind: String},
	{Name: "attempts", Kind: Int},
	{Name: "retry-delay", Kind: Duration},
	{Name: "restart-mode", Kind: String},
	{Name: "static-pod-stop-timeout", Kind: Duration},
	{Name: "cri-endpoint", Kind: String},

	// The health gate.
	{Name: "health-url", Kind: String},
	{Name: "health-cacert", Kind: String},
	{Name: "health-cert", Kind: String},
	{Name: "health-key", Kind: String},
	{Name: "health-token-file", Kind: String},
	{Name: "health-settle", Kind: Duration},
	{Name: "health-timeout", Kind: Duration},
	{Name: "health-interval", Kind: Duration},
	{Name: "jwks-key-file", Kind: List},

	// Preflight.
	{Name: "preflight-file", Kind: List},
	{Name: "preflight-flags-file", Kind: List},

	// The controller-manager's copy of the key.
	{Name: "controller-manager-flags-file", Kind: List},
	{Name: "controller-manager-restart-mode", Kind: String},
	{Name: "controller-manager-health-url", Kind: String},
	{Name: "controller-manager-health-cacert", Kind: String},

	// The fleet check and legacy tokens.
	{Name: "kubeconfig", Kind: String},
	{Name: "fleet-lease-age", Kind: Duration},
	{Name: "min-live-apiservers", Kind: Int},
	{Name: "fleet-timeout", Kind: Duration},
	{Name: "ignore-legacy-tokens", Kind: Bool},
	// Stale service-account tokens: the sampler's /metrics URL (its
	// credentials are the health gate's), retire-keys' window and override.
	{Name: "apiserver-metrics-url", Kind: String},
	{Name: "stale-token-window", Kind: Duration},
	{Name: "ignore-stale-tokens", Kind: Bool},

	// Key trust, publication and rotation.
	{Name: "keys-prefix", Kind: String},
	{Name: "trust-prefix", Kind: String},
	{Name: "host", Kind: String},
	{Name: "trust-timeout", Kind: Duration},
	{Name: "public-key", Kind: String},
	{Name: "signing-key", Kind: String},
	{Name: "certificate", Kind: String},
	{Name: "timeout", Kind: Duration},
	{Name: "exclude-host", Kind: List},
	{Name: "skip-unrecorded", Kind: Bool},
	{Name: "if-new-key", Kind: Bool},
	{Name: "algorithm", Kind: String},
	{Name: "grace", Kind: Duration},
	{Name: "rotation-prefix", Kind: String},
	// publish-key --watch (the signer's metrics-addr stays the signer's).
	{Name: "reconcile-interval", Kind: Duration},
	{Name: "state-dir", Kind: String},
	{Name: "publisher-metrics-addr", Kind: String},
	// publish-key --watch's token probe (saferestart/tokenprobe.go).
	{Name: "token-probe-kubeconfig", Kind: String},
	{Name: "token-probe-service-account", Kind: String},
	{Name: "token-probe-interval", Kind: Duration},
	{Name: "token-probe-apiservers", Kind: List},
	// rotate-key: the host signs through kube-apiserver-sa-signer.
	{Name: "signer", Kind: Bool},

	// check.
	{Name: "public-only", Kind: Bool},
	{Name: "keys-only", Kind: Bool},
	{Name: "require-key", Kind: List},
	{Name: "require-signing-keys", Kind: Bool},

	// The external signer (kube-apiserver-sa-signer).
	{Name: "socket", Kind: String},
	{Name: "socket-group", Kind: String},
	{Name: "max-token-expiration", Kind: Duration},
	{Name: "refresh-hint", Kind: Duration},
	{Name: "cache-file", Kind: String},
	// The signer's; kube-apiserver-safe-restart has no such flag and so
	// skips it, as any other binary's key.
	{Name: "metrics-addr", Kind: String},

	// Output and logs.
	{Name: "output", Kind: String},
	{Name: "log-level", Kind: String},
	{Name: "log-format", Kind: String},
}

// CommandLineOnly are flags that are no keys: choices for one run.
var CommandLineOnly = []string{"help", "version", "config", "dry-run", "reason", "abort", "rollback", "watch"}

// Lookup finds a key by name.
func Lookup(name string) (Key, bool) {
	for _, k := range Keys {
		if k.Name == name {
			return k, true
		}
	}
	return Key{}, false
}

// Names lists every key's name, in Keys' order.
func Names() []string {
	out := make([]string, len(Keys))
	for i, k := range Keys {
		out[i] = k.Name
	}
	return out
}
