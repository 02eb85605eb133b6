package sasigner

import (
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/etcdflags"
	"github.com/keysync/confd/internal/trust"
)

// defaultConfig is --config's default, read only when present; tests set
// it to "" so that they never read the host's file.
var defaultConfig = config.DefaultPath

const progName = "kube-apiserver-sa-signer"

// Defaults. The etcd prefixes are the trust package's, which
// kube-apiserver-safe-restart uses too.
const (
	defaultSocket      = "/run/kube-apiserver-sa-signer/signer.sock"
	defaultCacheFile   = "/var/lib/kube-apiserver-sa-signer/keys.json"
	defaultSigningKey  = "/etc/kubernetes/pki/sa.key"
	defaultKeysPrefix  = trust.DefaultKeysPrefix + "/"
	defaultTrustPrefix = trust.DefaultPrefix + "/"
)

// options are the command line after environment fallbacks. Long flag
// names are the other binaries' where the meaning is the same, so that one
// configuration file serves all three.
type options struct {
	endpoints      []string
	cacert         string
	cert           string
	key            string
	user           string
	password       string
	dialTimeout    time.Duration
	commandTimeout time.Duration

	socket             string
	socketGroup        string
	signingKey         string
	keysPrefix         string
	cacheFile          string
	refreshHint        time.Duration
	maxTokenExpiration time.Duration
	trustPrefix        string
	trustTimeout       time.Duration
	host               string
	metricsAddr        string
	cmFlagsFiles       []string

	logLevel   string
	logFormat  string
	configPath string
	version    bool
	help       bool

	gid int // resolved --socket-group, -1 when not given
}

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
	etcdflags.Register(fs, o.etcdTargets())

	fs.StringVar(&o.socket, "socket", defaultSocket, "Unix socket kube-apiserver's --service-account-signing-endpoint names (in a directory of its own)")
	fs.StringVar(&o.socketGroup, "socket-group", "", "group (name or ID) given the socket and its directory, for an apiserver not running as root")
	fs.StringVar(&o.signingKey, "signing-key", defaultSigningKey, "this host's service-account signing key (RSA or ECDSA private key PEM); re-read on SIGHUP")
	fs.StringVar(&o.keysPrefix, "keys-prefix", defaultKeysPrefix, "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)")
	fs.StringVar(&o.cacheFile, "cache-file", defaultCacheFile, "the last good key set, served when etcd is unreachable at start (public keys only)")
	fs.DurationVar(&o.refreshHint, "refresh-hint", 10*time.Second, "how often the apiserver asks for the keys again (FetchKeys' refresh_hint_seconds; whole seconds)")
	fs.DurationVar(&o.maxTokenExpiration, "max-token-expiration", 8760*time.Hour, "longest token lifetime the apiserver may ask for (Metadata; at least 10m)")
	fs.StringVar(&o.trustPrefix, "trust-prefix", defaultTrustPrefix, "etcd prefix of the trust records (PREFIX/HOST)")
	fs.DurationVar(&o.trustTimeout, "trust-timeout", 15*time.Minute, "how long a new signing key may wait for every host's apiserver to fetch it")
	fs.StringVar(&o.host, "host", "", "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f)")
	fs.StringArrayVar(&o.cmFlagsFiles, "controller-manager-flags-file", nil, "kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable): the trust record names the key its --service-account-private-key-file holds, so that retire-keys does not retire a key it still signs with")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "HOST:PORT to serve Prometheus /metrics and /healthz on (off when empty)")

	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json (logs go to stderr)")
	fs.StringVar(&o.configPath, "config", defaultConfig, "TOML file whose keys are the long flag names, shared with kube-apiserver-safe-restart (read when present; '' reads none); a flag, then ETCDCTL_*, beat it")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVarP(&o.help, "help", "h", false, "show this help")
	return fs
}

type lookupEnv func(string) (string, bool)

func parseArgs(args []string, env lookupEnv) (*options, *pflag.FlagSet, error) {
	o := &options{gid: -1}
	fs := newFlagSet(o)
	if err := fs.Parse(args); err != nil {
		return nil, fs, usagef("%v", err)
	}
	if o.help || o.version {
		return o, fs, nil
	}
	if fs.NArg() > 0 {
		return nil, fs, usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := readConfig(o, fs); err != nil {
		return nil, fs, err
	}
	if err := applyEnv(o, fs, env); err != nil {
		return nil, fs, err
	}
	return o, fs, validate(o)
}

// readConfig sets, from --config, the flags the command line did not give:
// precedence flag > ETCDCTL_* environment > file > default, as for
// kube-apiserver-safe-restart. Keys of the other binaries are skipped.
func readConfig(o *options, fs *pflag.FlagSet) error {
	if o.configPath == "" {
		return nil
	}
	if !fs.Changed("config") {
		if _, err := os.Stat(o.configPath); err != nil {
			return nil // the default, absent: no file
		}
	}
	f, err := config.Load(o.configPath)
	if err != nil {
		return usagef("--config: %v", err)
	}
	if _, err := f.Apply(fs, nil); err != nil {
		return usagef("--config: %v", err)
	}
	return nil
}

// applyEnv fills etcd settings from etcdctl's environment variables where
// the flag was not given, as kube-apiserver-safe-restart does.
func applyEnv(o *options, fs *pflag.FlagSet, env lookupEnv) error {
	if err := etcdflags.ApplyEnv(fs, o.etcdTargets(), env, nil); err != nil {
		return usagef("%v", err)
	}
	if _, err := etcdflags.SplitUser(&o.user, &o.password); err != nil {
		return usagef("%v", err)
	}
	return nil
}

func validate(o *options) error {
	var errs []string
	add := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(format, a...)) }
	if o.dialTimeout <= 0 || o.commandTimeout <= 0 {
		add("--dial-timeout and --command-timeout must be positive")
	}
	if len(o.endpoints) == 0 {
		add("--endpoints: no etcd endpoint")
	}
	if (o.cert == "") != (o.key == "") {
		add("--cert and --key go together")
	}
	if o.socket == "" || !strings.HasPrefix(o.socket, "/") {
		add("--socket %q: want an absolute path", o.socket)
	}
	if o.signingKey == "" {
		add("--signing-key: required")
	}
	if p := strings.TrimRight(o.keysPrefix, "/"); p == "" {
		add("--keys-prefix %q: want a non-root prefix", o.keysPrefix)
	}
	if p := strings.TrimRight(o.trustPrefix, "/"); p == "" {
		add("--trust-prefix %q: want a non-root prefix", o.trustPrefix)
	}
	if o.refreshHint < time.Second || o.refreshHint%time.Second != 0 {
		add("--refresh-hint %s: want whole seconds, at least 1s (FetchKeys carries seconds; the apiserver refuses 0)", o.refreshHint)
	}
	// kube-apiserver exits when Metadata says less than 600 s.
	if o.maxTokenExpiration < 600*time.Second || o.maxTokenExpiration%time.Second != 0 {
		add("--max-token-expiration %s: want whole seconds, at least 10m0s (kube-apiserver refuses less)", o.maxTokenExpiration)
	}
	if o.trustTimeout < 0 {
		add("--trust-timeout %s: must not be negative", o.trustTimeout)
	}
	if o.socketGroup != "" {
		gid, err := lookupGroup(o.socketGroup)
		if err != nil {
			add("--socket-group %q: %v", o.socketGroup, err)
		}
		o.gid = gid
	}
	if len(errs) > 0 {
		return &usageError{strings.Join(errs, "; ")}
	}
	return nil
}

func lookupGroup(name string) (int, error) {
	if id, err := strconv.Atoi(name); err == nil && id >= 0 {
		return id, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, err
	}
	return strconv.Atoi(g.Gid)
}

func writeHelp(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprintf(w, `Usage:
  %[1]s [flags]

Serves kube-apiserver's external JWT signer (ExternalJWTSigner v1) on
--socket: Sign with --signing-key; FetchKeys with every public key published
under --keys-prefix plus the signing key; Metadata with
--max-token-expiration. Start kube-apiserver with
--service-account-signing-endpoint=SOCKET instead of
--service-account-key-file and --service-account-signing-key-file.
SIGHUP re-reads --signing-key. See docs/signer.md.

Flags:
%[2]s
Environment: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,
ETCDCTL_USER, ETCDCTL_PASSWORD, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT as
for etcdctl; a flag beats the environment. The password is never logged.
`, progName, fs.FlagUsages())
}
