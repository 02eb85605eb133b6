package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/backends/connect"
	"github.com/keysync/confd/daemon"
	"github.com/keysync/confd/internal/suggest"
	"github.com/keysync/confd/internal/waitspec"
	"github.com/keysync/confd/resource"
)

// Config is the one value that main builds from defaults, confd.toml, the
// environment and the command line, in rising precedence.
type Config struct {
	Store            backends.Config // backend selection and connection
	Prefix           string
	ConfDir          string
	ConfigFile       string
	Interval         int
	Watch            bool
	OneTime          bool
	Noop             bool
	SyncOnly         bool
	KeepStageFile    bool
	LogLevel         string
	LogFormat        string
	CheckCmdTimeout  time.Duration
	ReloadCmdTimeout time.Duration
	CommandGrace     time.Duration
	DestLockTimeout  time.Duration
	LockDir          string // the destinations' locks, shared by every confd on the host
	PrintVersion     bool
	CheckConfig      bool     // vet confd.toml, resources and templates; no store
	Validate         bool     // render from MockData; no store, no writes, no commands
	MockData         string   // the key/values -validate renders from
	Resources        []string // limit any mode to these resource files
	// NoopShowSecrets lets -noop print the diff of files that are not world-readable.
	NoopShowSecrets bool
	// SecretKeyring is the armoured OpenPGP secret keyring for cget, cgets,
	// cgetv and cgetvs (confd 0.16's -secret-keyring).
	SecretKeyring string
	Wait          waitspec.Spec // default quiescence of -watch
	Resync        time.Duration // -watch: full reconcile every Resync; 0 = off
	MetricsAddr   string        // HOST:PORT for /metrics, /healthz, /readyz
	MaxCommands   int           // check_cmd/reload_cmd run at once, across groups
}

const defaultConfigFile = "/etc/confd/confd.toml"

// newFlagSet declares confd 0.16's flags (those that apply to the etcd v3,
// env and file backends) plus this implementation's additions.
func newFlagSet(c *Config, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("confd", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.SortFlags = true
	fs.StringVar(&c.Store.Backend, "backend", "etcd", "backend to use: "+strings.Join(backends.Names(), ", ")+" (etcd is an alias of etcdv3)")
	fs.StringSliceVar(&c.Store.Nodes, "node", nil, "backend node URL, e.g. https://10.0.0.1:2379 (repeatable; comma-separated also accepted)")
	fs.StringVar(&c.Prefix, "prefix", "", "key path prefix; when set it replaces every resource's own prefix")
	fs.StringVar(&c.ConfDir, "confdir", "/etc/confd", "confd conf directory (holds conf.d/ and templates/)")
	fs.StringVar(&c.ConfigFile, "config-file", defaultConfigFile, "the confd config file (a missing default file is not an error)")
	fs.IntVar(&c.Interval, "interval", 600, "backend polling interval in seconds")
	fs.BoolVar(&c.Watch, "watch", false, "enable watch support: render on every change of a resource's keys")
	fs.BoolVar(&c.OneTime, "onetime", false, "run once and exit; non-zero exit when any resource failed")
	fs.BoolVar(&c.Noop, "noop", false, "only show pending changes (unified diff on stdout); write nothing, run nothing")
	fs.BoolVar(&c.NoopShowSecrets, "noop-show-secrets", false, "with -noop, also print the diff of files that are not world-readable (mode 0600, 0640, ...); without it only changed line counts are shown")
	fs.StringVar(&c.SecretKeyring, "secret-keyring", "", "path to an armored PGP secret keyring (for use with the crypt functions cget, cgets, cgetv, cgetvs)")
	fs.BoolVar(&c.SyncOnly, "sync-only", false, "sync without check_cmd and reload_cmd")
	fs.BoolVar(&c.KeepStageFile, "keep-stage-file", false, "keep the stage file of a failed check_cmd for inspection")
	fs.StringVar(&c.LogLevel, "log-level", "", "level which confd should log messages (debug, info, warn, error; default info)")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text (confd's) or json")
	fs.StringVar(&c.Store.ClientCert, "client-cert", "", "the client cert (PEM) for TLS to etcd; env CONFD_CLIENT_CERT")
	fs.StringVar(&c.Store.ClientKey, "client-key", "", "the client key (PEM) for TLS to etcd; env CONFD_CLIENT_KEY")
	fs.StringVar(&c.Store.ClientCAKeys, "client-ca-keys", "", "the CA certificates (PEM) that sign etcd's server certificate; env CONFD_CLIENT_CAKEYS")
	fs.BoolVar(&c.Store.ClientInsecure, "client-insecure", false, "do not verify etcd's server certificate (testing only)")
	fs.BoolVar(&c.Store.BasicAuth, "basic-auth", false, "accepted for confd compatibility; username/password are sent whenever -username is set")
	fs.StringVar(&c.Store.Username, "username", "", "the username to authenticate to etcd as; env CONFD_USERNAME")
	fs.StringVar(&c.Store.Password, "password", "", "the password to authenticate with; prefer env CONFD_PASSWORD or confd.toml, which ps cannot show")
	fs.StringVar(&c.Store.SRVDomain, "srv-domain", "", "the domain whose SRV records (_<backend>._tcp as confd 0.16, then _etcd-client._tcp) list the nodes")
	fs.StringVar(&c.Store.SRVRecord, "srv-record", "", "the SRV record to search for backend nodes, e.g. _etcd-client._tcp.example.com")
	fs.StringVar(&c.Store.Scheme, "scheme", "http", "the URI scheme for nodes retrieved from DNS SRV records (http or https)")
	fs.StringArrayVar(&c.Store.YAMLFiles, "file", nil, "the YAML/JSON file or directory to read (repeatable; only with -backend=file)")
	fs.StringVar(&c.Store.Filter, "filter", "*", "file name filter for directories given to -file (only with -backend=file)")
	fs.DurationVar(&c.CheckCmdTimeout, "check-cmd-timeout", resource.DefaultCheckTimeout, "default timeout of check_cmd; a resource's check_cmd_timeout overrides it")
	fs.DurationVar(&c.ReloadCmdTimeout, "reload-cmd-timeout", resource.DefaultReloadTimeout, "default timeout of reload_cmd; a resource's reload_cmd_timeout overrides it")
	fs.DurationVar(&c.CommandGrace, "command-grace", 10*time.Second, "how long check_cmd and reload_cmd get between SIGTERM (at their timeout, or when a -onetime confd is stopped) and SIGKILL")
	fs.DurationVar(&c.DestLockTimeout, "dest-lock-timeout", apply.DefaultDestLockTimeout, "how long a pass waits for another confd's pass over the same destination file before it fails naming that confd's PID")
	fs.StringVar(&c.LockDir, "lock-dir", apply.DefaultLockDir(), "the directory of the destinations' lock files (created 0700); every confd that writes the same destination must use the same one (default for root /run/confd/locks, for another user $TMPDIR/confd-UID-locks)")
	fs.DurationVar(&c.Store.DialTimeout, "dial-timeout", connect.DefaultDialTimeout, "how long to wait for the backend to answer at start")
	fs.DurationVar(&c.Store.RequestTimeout, "request-timeout", connect.DefaultRequestTimeout, "deadline of each backend read")
	fs.DurationVar(&c.Store.WatchStallTimeout, "watch-stall-timeout", connect.DefaultWatchStallTimeout, "-watch: reconnect (and re-read) when etcd answers nothing, progress requests included, for this long; long enough for a defrag of a large etcd (a lost connection is noticed at once)")
	fs.BoolVar(&c.PrintVersion, "version", false, "print version and exit")
	fs.Var(&c.Wait, "wait", "-watch: render once MIN passed without a new change, never later than MAX after the first (Go durations, e.g. 2s:10s; MAX defaults to 4×MIN; a resource's wait overrides it)")
	fs.DurationVar(&c.Resync, "resync", 10*time.Minute, "-watch: re-read and reconcile every resource this often as a safety net (0 = never)")
	fs.IntVar(&c.MaxCommands, "max-commands", daemon.DefaultMaxCommands, "how many check_cmd and reload_cmd commands may run at once across independent resources (-watch, -interval); others wait for their turn")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "HOST:PORT to serve Prometheus /metrics, /healthz and /readyz on (off when empty)")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "check confd.toml, every resource and the templates they name (syntax, keys, functions) without contacting a store; exit 0 when all are fine, 1 otherwise")
	fs.BoolVar(&c.Validate, "validate", false, "render resources from -mock-data instead of a store and print them (with -noop: the diff against the live file); writes nothing, runs no command")
	fs.StringVar(&c.MockData, "mock-data", "", "the JSON or YAML file of key/values -validate renders from: absolute keys to strings, or the file backend's nested YAML")
	fs.StringArrayVar(&c.Resources, "resource", nil, "process only this resource file, relative to conf.d, with or without .toml (repeatable; any mode)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of confd:\n  confd [flags]\n\nFlags may be written -flag or --flag, with -flag=value or -flag value, as with confd 0.16.\n\n%s", fs.FlagUsages())
	}
	return fs
}

// parseFlags parses args as confd 0.16 accepted them and reports errors
// with flag names spelt as the user wrote them.
func parseFlags(fs *pflag.FlagSet, args []string) error {
	normalized, err := normalizeArgs(fs, args)
	if err != nil {
		return err
	}
	err = fs.Parse(normalized)
	if err == nil || errors.Is(err, pflag.ErrHelp) {
		return err
	}
	msg := err.Error()
	for _, a := range args {
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			msg = strings.ReplaceAll(msg, `"--`+name+`"`, `"-`+name+`"`)
		}
	}
	return errors.New(msg + didYouMean(fs, msg))
}

// didYouMean is a hint for an unknown flag: the declared flag it most
// likely meant (the same matching as confd.toml's and a resource's keys).
func didYouMean(fs *pflag.FlagSet, msg string) string {
	rest, ok := strings.CutPrefix(msg, "unknown flag: ")
	if !ok {
		return ""
	}
	dash := "-"
	if strings.HasPrefix(rest, "--") {
		dash = "--"
	}
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	if m := suggest.Closest(strings.TrimLeft(rest, "-"), names); m != "" {
		return fmt.Sprintf("; did you mean %s%s? (confd --help lists every flag)", dash, m)
	}
	return " (confd --help lists every flag)"
}

// normalizeArgs turns Go flag package spellings (-watch, -node=X, -node X)
// into pflag's (--watch ...), so that existing systemd units keep working.
// Only names of declared flags are rewritten; "--" ends flag processing. A
// single-dash name that is not declared is reported as the user wrote it
// ("unknown flag: -auth-token"): pflag would read it as a cluster of
// one-letter flags and complain about the first letter.
func normalizeArgs(fs *pflag.FlagSet, args []string) ([]string, error) {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...), nil
		}
		if len(a) < 2 || a[0] != '-' {
			out = append(out, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		switch {
		case f == nil && (name == "h" || name == "help"):
			// pflag answers -h and --help with the usage text.
		case f == nil && a[1] != '-':
			msg := "unknown flag: -" + name
			return nil, errors.New(msg + didYouMean(fs, msg))
		case f != nil && a[1] != '-':
			a = "-" + a
		}
		out = append(out, a)
		// A value given as the next argument is taken whatever it looks
		// like ("-prefix -x" sets the prefix to "-x"), as Go's flag did.
		if f != nil && !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out, nil
}
