package sasigner

import (
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/trust"
)

// defaultConfig is --config's default, read only when present; tests set
// it to "" so that they never read the host's file.
var defaultConfig = config.DefaultPath

const progName = "kube-apiserver-sa-signer"

// options are the command line after the configuration file and the
// environment. Long flag names are the other helper's where the meaning
// is the same, so that one configuration file serves both.
type options struct {
	cli.Common
	cli.Etcd

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

	gid int // resolved --socket-group, -1 when not given
}

const description = `Serves kube-apiserver's external JWT signer (ExternalJWTSigner v1) on
--socket: Sign with --signing-key; FetchKeys with every public key published
under --keys-prefix plus the signing key; Metadata with
--max-token-expiration. Start kube-apiserver with
--service-account-signing-endpoint=SOCKET instead of
--service-account-key-file and --service-account-signing-key-file.
SIGHUP re-reads --signing-key. See docs/signer.md.

` + cli.EtcdEnvHelp + ` The password is never logged.`

// newCommand is the signer's command line: a daemon with no subcommands.
// serve runs once the options are complete and valid.
func newCommand(p *cli.Program, o *options, serve func(*options) int) *cobra.Command {
	cmd := p.Root(&o.Common, progName, "kube-apiserver's external service-account token signer", description)
	cmd.Args = func(_ *cobra.Command, args []string) error {
		if len(args) > 0 {
			return cli.Usagef("unexpected argument %q", args[0])
		}
		return nil
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	o.Etcd.Register(fs)
	fs.StringVar(&o.socket, "socket", "/run/kube-apiserver-sa-signer/signer.sock", "Unix socket kube-apiserver's --service-account-signing-endpoint names (in a directory of its own)")
	fs.StringVar(&o.socketGroup, "socket-group", "", "group (name or ID) given the socket and its directory, for an apiserver not running as root")
	fs.StringVar(&o.signingKey, "signing-key", "/etc/kubernetes/pki/sa.key", "this host's service-account signing key (RSA or ECDSA private key PEM); re-read on SIGHUP")
	fs.StringVar(&o.keysPrefix, "keys-prefix", trust.DefaultKeysPrefix+"/", "etcd prefix under which every host publishes its service-account public keys (PREFIX/HOST)")
	fs.StringVar(&o.cacheFile, "cache-file", "/var/lib/kube-apiserver-sa-signer/keys.json", "the last good key set, served when etcd is unreachable at start (public keys only)")
	fs.DurationVar(&o.refreshHint, "refresh-hint", 10*time.Second, "how often the apiserver asks for the keys again (FetchKeys' refresh_hint_seconds; whole seconds)")
	fs.DurationVar(&o.maxTokenExpiration, "max-token-expiration", 8760*time.Hour, "longest token lifetime the apiserver may ask for (Metadata; at least 10m)")
	fs.StringVar(&o.trustPrefix, "trust-prefix", trust.DefaultPrefix+"/", "etcd prefix of the trust records (PREFIX/HOST)")
	fs.DurationVar(&o.trustTimeout, "trust-timeout", 15*time.Minute, "how long a new signing key may wait for every host's apiserver to fetch it")
	fs.StringVar(&o.host, "host", "", "this host's name in --keys-prefix and --trust-prefix (default: the output of hostname -f)")
	fs.StringArrayVar(&o.cmFlagsFiles, "controller-manager-flags-file", nil, "kube-controller-manager's flags file, EnvironmentFile or static-pod manifest (repeatable): the trust record names the key its --service-account-private-key-file holds, so that retire-keys does not retire a key it still signs with")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "HOST:PORT to serve Prometheus /metrics and /healthz on (off when empty)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := p.Resolve(cmd, &o.Common, &o.Etcd, nil); err != nil {
			return err
		}
		if err := validate(o); err != nil {
			return o.FromFile(err)
		}
		return cli.Exit(serve(o))
	}
	// --version is the root's (cli.Program.Root); `version` as
	// kube-apiserver-safe-restart has it.
	cmd.AddCommand(p.VersionCommand())
	return cmd
}

func validate(o *options) error {
	errs := o.Etcd.Validate()
	errs = append(errs, cli.UsageIf(!strings.HasPrefix(o.socket, "/"), "--socket %q: want an absolute path", o.socket)...)
	errs = append(errs, cli.UsageIf(o.signingKey == "", "--signing-key: required")...)
	errs = append(errs, cli.UsageIf(strings.TrimRight(o.keysPrefix, "/") == "", "--keys-prefix %q: want a non-root prefix", o.keysPrefix)...)
	errs = append(errs, cli.UsageIf(strings.TrimRight(o.trustPrefix, "/") == "", "--trust-prefix %q: want a non-root prefix", o.trustPrefix)...)
	errs = append(errs, cli.UsageIf(o.refreshHint < time.Second || o.refreshHint%time.Second != 0,
		"--refresh-hint %s: want whole seconds, at least 1s (FetchKeys carries seconds; the apiserver refuses 0)", o.refreshHint)...)
	// kube-apiserver exits when Metadata says less than 600 s.
	errs = append(errs, cli.UsageIf(o.maxTokenExpiration < 600*time.Second || o.maxTokenExpiration%time.Second != 0,
		"--max-token-expiration %s: want whole seconds, at least 10m0s (kube-apiserver refuses less)", o.maxTokenExpiration)...)
	errs = append(errs, cli.UsageIf(o.trustTimeout < 0, "--trust-timeout %s: must not be negative", o.trustTimeout)...)
	if o.socketGroup != "" {
		gid, err := lookupGroup(o.socketGroup)
		errs = append(errs, cli.UsageIf(err != nil, "--socket-group %q: %v", o.socketGroup, err)...)
		o.gid = gid
	}
	return cli.JoinUsage(errs)
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
