package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/backends"
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
	PrintVersion     bool
}

const defaultConfigFile = "/etc/confd/confd.toml"

// newFlagSet declares confd 0.16's flags (those that apply to the etcd v3,
// env and file backends) plus this implementation's additions.
func newFlagSet(c *Config, out io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("confd", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.SortFlags = true
	fs.StringVar(&c.Store.Backend, "backend", "etcd", "backend to use: etcdv3 (alias etcd), env or file")
	fs.StringSliceVar(&c.Store.Nodes, "node", nil, "backend node URL, e.g. https://10.0.0.1:2379 (repeatable; comma-separated also accepted)")
	fs.StringVar(&c.Prefix, "prefix", "", "key path prefix; when set it replaces every resource's own prefix")
	fs.StringVar(&c.ConfDir, "confdir", "/etc/confd", "confd conf directory (holds conf.d/ and templates/)")
	fs.StringVar(&c.ConfigFile, "config-file", defaultConfigFile, "the confd config file (a missing default file is not an error)")
	fs.IntVar(&c.Interval, "interval", 600, "backend polling interval in seconds")
	fs.BoolVar(&c.Watch, "watch", false, "enable watch support: render on every change of a resource's keys")
	fs.BoolVar(&c.OneTime, "onetime", false, "run once and exit; non-zero exit when any resource failed")
	fs.BoolVar(&c.Noop, "noop", false, "only show pending changes (unified diff on stdout); write nothing, run nothing")
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
	fs.DurationVar(&c.CheckCmdTimeout, "check-cmd-timeout", 60*time.Second, "default timeout of check_cmd; a resource's check_cmd_timeout overrides it")
	fs.DurationVar(&c.ReloadCmdTimeout, "reload-cmd-timeout", 10*time.Minute, "default timeout of reload_cmd; a resource's reload_cmd_timeout overrides it")
	fs.DurationVar(&c.CommandGrace, "command-grace", 10*time.Second, "how long check_cmd and reload_cmd get between SIGTERM (at their timeout, or when confd stops) and SIGKILL")
	fs.DurationVar(&c.Store.DialTimeout, "dial-timeout", 5*time.Second, "how long to wait for the backend to answer at start")
	fs.DurationVar(&c.Store.RequestTimeout, "request-timeout", 10*time.Second, "deadline of each backend read")
	fs.BoolVar(&c.PrintVersion, "version", false, "print version and exit")
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage of confd:\n  confd [flags]\n\nFlags may be written -flag or --flag, with -flag=value or -flag value, as with confd 0.16.\n\n%s", fs.FlagUsages())
	}
	return fs
}

// normalizeArgs turns Go flag package spellings (-watch, -node=X, -node X)
// into pflag's (--watch ...), so that existing systemd units keep working.
// Only names of declared flags are rewritten; "--" ends flag processing.
func normalizeArgs(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name := strings.SplitN(a[1:], "=", 2)[0]
			if fs.Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}
