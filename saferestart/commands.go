package saferestart

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/redact"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

// command describes one subcommand: its options (its own flags' values),
// whether it talks to etcd (then it takes the etcd flags and ETCDCTL_*).
type command struct {
	name, use, short, long string
	etcd                   bool
	opts                   options
}

// options is one command's: its own flags' values (cmdkit.Register),
// checked once complete with the shared settings (Validate), and the
// command itself (Run).
type options interface {
	Validate(s *cmdkit.Shared) []error
	Run(ctx context.Context, e *cmdkit.Env) int
}

// argsTaker is a command that takes arguments: Args takes them, once the
// flags are complete. Any other command takes none.
type argsTaker interface {
	Args(s *cmdkit.Shared, cmd *cobra.Command, args []string) error
}

// commands are the subcommands; restart is the default. Each gets its own
// options; config shows s too (the configuration file, logging and etcd
// flags).
func commands(s *cmdkit.Shared) []command {
	return []command{
		{name: cmdRestart, use: "restart [flags] [-- COMMAND ARGS...]", etcd: true,
			short: "restart kube-apiserver through the lock (the default: a command line naming no subcommand)",
			long:  restartHelp, opts: &restartcmd.Command{}},
		{name: cmdStatus, etcd: true, short: "show lock holder, waiters (FIFO), hold, each host's rotation and keys; exit 4 while a hold is active",
			opts: &statusCmd{}},
		{name: cmdHold, use: "hold --reason TEXT", etcd: true, short: "stop every host from restarting", opts: &holdCmd{}},
		{name: cmdUnhold, etcd: true, short: "allow restarts again", opts: &unholdCmd{}},
		// check talks to etcd only with --require-signing-keys; it takes the
		// etcd flags so that it reads them from --config as every other
		// command does.
		{name: cmdCheck, use: "check [flags] [FILE...]", etcd: true,
			short: "validate PEM files or an apiserver flags file (confd's check_cmd); etcd only with --require-signing-keys",
			long:  checkHelp, opts: &checkCmd{}},
		{name: cmdVersion, short: "print the version", opts: &versionCmd{}},
		{name: cmdTrust, etcd: true, short: "hosts × service-account key IDs: signing, trusted, stale hosts", opts: &keycmd.Trust{}},
		{name: cmdWaitTrusted, use: "wait-trusted --public-key FILE", etcd: true,
			short: "exit 0 once every publishing host trusts FILE's key; 5 on timeout", opts: &keycmd.WaitTrusted{}},
		{name: cmdRotateKey, use: "rotate-key [flags] [-- COMMAND ARGS...]", etcd: true,
			short: "rotate this host's service-account key (resumable; --dry-run shows the steps)", opts: &keycmd.RotateKey{}},
		{name: cmdRetireKeys, etcd: true, short: "retire every host's superseded public keys once their grace is over, from any master (for a systemd timer)",
			opts: &keycmd.RetireKeys{}},
		{name: cmdPublishKey, etcd: true, short: "publish this host's public key(s) (--public-key, or --signing-key's public half) when they changed; --watch: keep them published",
			long: publishKeyHelp, opts: &keycmd.PublishKey{}},
		{name: cmdForgetHost, use: "forget-host HOST", etcd: true, long: forgetHelp,
			short: "remove a master for good: its keys superseded (retired after --grace), its trust and rotation records gone; --dry-run shows what",
			opts:  &keycmd.ForgetHost{}},
		// config shows what every command would read: it takes all flags.
		{name: cmdConfig, etcd: true, short: "print the effective configuration and where each value came from", opts: &configCmd{Shared: s}},
	}
}

// The options of each command: its flags in the order its --help lists
// them (cmdkit.Register).

type statusCmd struct {
	cmdkit.Lock
	RotationPrefix string `flag:"rotation-prefix"`
	KeysPrefix     string `flag:"keys-prefix"`
	cmdkit.OutputFlag
}

func (o *statusCmd) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
	errs = append(errs, cmdkit.ValidatePrefixes(&o.KeysPrefix, nil, &o.RotationPrefix)...)
	return append(errs, o.OutputFlag.Validate()...)
}

type holdCmd struct {
	cmdkit.Lock
	cmdkit.Host
	Reason string `flag:"reason"`
}

func (o *holdCmd) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
	errs = append(errs, o.Host.Validate()...)
	errs = append(errs, cli.UsageIf(strings.TrimSpace(o.Reason) == "", "hold needs --reason TEXT")...)
	// The reason is stored in etcd, readable by every host, and printed by
	// hold and status: key material must not get there, masked or not.
	return append(errs, cli.UsageIf(redact.HasKey(o.Reason), "--reason holds private key material (not shown, nothing stored); describe the problem in words and name the key's file instead")...)
}

type unholdCmd struct {
	cmdkit.Lock
}

func (o *unholdCmd) Validate(s *cmdkit.Shared) []error {
	return cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
}

type checkCmd struct {
	Argv []string // the FILEs
	cmdkit.Preflight
	SigningKey string `flag:"signing-key"`
	cmdkit.CheckFlags
	KeysPrefix  string `flag:"keys-prefix"`
	TrustPrefix string `flag:"trust-prefix"`
}

// validate: check needs etcd settings only to read the trust records.
func (o *checkCmd) Validate(s *cmdkit.Shared) []error {
	if !o.RequireSigningKeys {
		return nil
	}
	return append(s.Etcd.Validate(), cmdkit.ValidatePrefixes(&o.KeysPrefix, &o.TrustPrefix, nil)...)
}

type versionCmd struct{}

func (versionCmd) Validate(*cmdkit.Shared) []error { return nil }

func (versionCmd) Run(_ context.Context, e *cmdkit.Env) int {
	fmt.Fprint(e.Stdout, version.Text(cmdkit.ProgName))
	return cmdkit.ExitOK
}

// configCmd shows what every command would read: it has every command's
// flags.
type configCmd struct {
	Shared *cmdkit.Shared
	fs     *pflag.FlagSet // the flags shown
	cmdkit.Restarting
	cmdkit.OutputFlag
	Reason string `flag:"reason"`
	cmdkit.CheckFlags
	PublicKey string        `flag:"public-key"`
	Timeout   time.Duration `flag:"timeout"`
	cmdkit.WaitTrustedFlags
	Grace time.Duration `flag:"grace"`
	cmdkit.RotateKeyFlags
	Certificate string `flag:"certificate"`
	cmdkit.PublishWatchFlags
	cmdkit.RetireKeysFlags
	APIServerMetricsURL string `flag:"apiserver-metrics-url"`
	cmdkit.TokenProbe
}

func (o *configCmd) Validate(s *cmdkit.Shared) []error {
	errs := cmdkit.ValidateEtcd(s, &o.Lock, nil, nil)
	errs = append(errs, o.Prefixes.Validate()...)
	errs = append(errs, o.Host.Validate()...)
	errs = append(errs, cli.UsageIf(o.TrustTimeout < 0, "--trust-timeout %s: must not be negative", o.TrustTimeout)...)
	errs = append(errs, o.PublishWatchFlags.Validate()...)
	errs = append(errs, o.TokenProbe.Validate(true)...)
	errs = append(errs, cmdkit.ValidateFleetFlags(&o.Restarting)...)
	errs = append(errs, o.ControllerManager.Validate()...)
	return append(errs, o.OutputFlag.Validate()...)
}

// Args: config takes no arguments, and shows its flags.
func (o *configCmd) Args(_ *cmdkit.Shared, cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return cli.Usagef("%s takes no arguments, got %q", cmdConfig, args)
	}
	o.fs = cmd.Flags()
	return nil
}

// newRoot is the command tree; act runs a command whose options are
// complete and valid, and returns its exit code.
func newRoot(p *cli.Program, s *cmdkit.Shared, act func(name string, o options) int) *cobra.Command {
	root := p.Root(&s.Common, cmdkit.ProgName, "restart kube-apiserver on one control-plane host at a time", rootHelp())
	for _, c := range commands(s) {
		long := c.short
		if c.long != "" {
			long += "\n\n" + c.long
		}
		if c.etcd {
			long += "\n\n" + etcdHelp
		}
		cmd := &cobra.Command{Use: cmp.Or(c.use, c.name), Short: c.short, Long: long, Args: cobra.ArbitraryArgs}
		fs := cmd.Flags()
		fs.SortFlags = false
		if c.etcd {
			s.Etcd.Register(fs)
		}
		cmdkit.Register(fs, c.opts)
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			// check reads etcdctl's environment only when it talks to etcd
			// (--require-signing-keys): a plain file check must not fail on an
			// unrelated ETCDCTL_* (fileUse keeps that flag off the file).
			var e *cli.Etcd
			if chk, ok := c.opts.(*checkCmd); c.etcd && (!ok || chk.RequireSigningKeys) {
				e = &s.Etcd
			}
			taker, takes := c.opts.(argsTaker)
			if !takes && len(args) > 0 {
				return cli.Usagef("%s takes no arguments, got %q", c.name, args)
			}
			var use func(string) bool
			if chk, ok := c.opts.(*checkCmd); ok {
				use = chk.fileUse(cmd, args)
			}
			if err := p.Resolve(cmd, &s.Common, e, use); err != nil {
				return err
			}
			if takes {
				if err := taker.Args(s, cmd, args); err != nil {
					return s.FromFile(err)
				}
			}
			if err := s.FromFile(cli.JoinUsage(c.opts.Validate(s))); err != nil {
				return err
			}
			return cli.Exit(act(c.name, c.opts))
		}
		root.AddCommand(cmd)
	}
	return root
}

// fileUse says which of the file's keys check reads: all it has flags
// for, but the restart's preflight inputs only when its command line
// names nothing to check (then it checks what the restart would
// preflight), and never require-signing-keys: the check_cmd that wants
// etcd says so itself, and a file shared by every command must not make
// each plain file check depend on etcd.
func (o *checkCmd) fileUse(cmd *cobra.Command, args []string) func(string) bool {
	fs := cmd.Flags()
	given := len(args) > 0 || fs.Changed("preflight-file") || fs.Changed("preflight-flags-file")
	return func(name string) bool {
		if name == "require-signing-keys" {
			return false
		}
		return !given || (name != "preflight-file" && name != "preflight-flags-file")
	}
}

// Args: check's FILEs, before or after --.
func (o *checkCmd) Args(_ *cmdkit.Shared, _ *cobra.Command, args []string) error {
	o.Argv = args
	if len(o.Argv)+len(o.PreflightFiles)+len(o.PreflightFlagsFiles) == 0 {
		return cli.Usagef("check needs at least one FILE, --preflight-file or --preflight-flags-file")
	}
	if len(o.RequireKeys) > 0 && len(o.Argv) == 0 {
		return cli.Usagef("--require-key applies to bundle FILEs, and none was given")
	}
	if o.RequireSigningKeys && len(o.Argv) == 0 {
		return cli.Usagef("--require-signing-keys applies to bundle FILEs, and none was given")
	}
	return nil
}

const checkHelp = `Exit 0 when every FILE is valid, 3 otherwise, one line per problem on stderr.
--require-signing-keys also reads every host's trust record from etcd and
refuses a FILE that lacks a key a host's apiserver, kube-apiserver-sa-signer
or kube-controller-manager signs with (naming the host and the key ID), and
refuses when etcd does not answer (exit 1): as confd's check_cmd, no bundle
goes live that would make the apiservers refuse live tokens. The etcd
settings come from the flags, ETCDCTL_* and --config as for every command;
--require-signing-keys itself only from the command line. Without it, check
reads no etcd and ignores ETCDCTL_*.`

const forgetHelp = `HOST's published keys become superseded now, retired by retire-keys after
--grace (the tokens it signed keep verifying until then; its value goes with
its last key); its key record (--rotation-prefix/HOST/kept) stays, marked
forgotten, until then. Its trust record (--trust-prefix/HOST), rotation
state and waiting record (--rotation-prefix/HOST/state, /waiting) and its
restart intent (under --hold-key) are deleted: no trust wait, fleet check
or signer barrier waits for it any more. publish-key under the same name
later is a new host of that name. A renamed master is a new host plus
forget-host of its old name.

Refused (exit 3, nothing done) while --rotation-prefix/HOST/alive exists
(HOST's key publisher runs) or HOST's restart intent is live (its lock
lease alive: it restarts now), with --kubeconfig while HOST's apiserver's
identity Lease was renewed in the last 30s, for this host itself (--host),
and for a HOST etcd knows nothing of. Exit 5 while a rotate-key or
retire-keys of HOST runs. --dry-run prints what it would do.`

// etcdHelp is the help of every command that talks to etcd.
const etcdHelp = cli.EtcdEnvHelp + ` The password is never logged, and
ETCDCTL_USER/ETCDCTL_PASSWORD are removed from the restart command's environment.`

const restartHelp = `Preflight the files the new apiserver will read; refuse if a hold is
active; take the etcd lock (interoperable with ` + "`etcdctl lock NAME`" + `; the command
gets ETCD_LOCK_KEY and ETCD_LOCK_REV); check the hold again; run the command in
its own process group; hold the lock until the health URL reports ready; on
failure write a hold that stops every host until ` + "`unhold`."

// rootHelp is the overview: the command lines, the configuration file and
// the exit codes.
func rootHelp() string {
	var b strings.Builder
	fmt.Fprintf(&b, `Restarts kube-apiserver on one control-plane host at a time: checks the files
the new apiserver will read, takes an etcd lock shared with `+"`etcdctl lock`"+`,
restarts, holds the lock until the apiserver is ready, and stops every host
from restarting (a "hold" in etcd) when a restart fails.

  %[1]s [flags] [-- COMMAND ARGS...]   restart (default command: %[2]s)
  %[1]s status [--output json]         show lock holder, waiters (FIFO), hold and rotations (exit 4: hold active)
  %[1]s hold --reason TEXT             stop every host from restarting
  %[1]s unhold                         allow restarts again
  %[1]s forget-host HOST [--dry-run]    remove a master for good (keys retired after --grace)
  %[1]s check [--public-only] [--keys-only] [--require-key K] [--require-signing-keys] [FILE...] [--preflight-flags-file F [--signing-key K]]
  %[1]s COMMAND --help                 the flags of COMMAND (--lock-name, --health-url, --preflight-file: restart --help)

Flags may come before the command (--endpoints X status).

Configuration: every flag's long name is a key of the TOML file --config
(default %[3]s, read when present): e.g. endpoints = ["https://..."],
health-url = "...", preflight-flags-file = [...]. A flag beats ETCDCTL_*,
which beats the file; a list on the command line replaces the file's; a
command ignores the keys it has no flag for.

%[4]s

Exit codes:
`, cmdkit.ProgName, strings.Join(restartcmd.DefaultCommand, " "), config.DefaultPath, etcdHelp)
	for _, c := range exitCodeDocs {
		fmt.Fprintf(&b, "  %d  %s\n", c.code, c.text)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

const publishKeyHelp = `Without --watch: publish once and exit (0 published or unchanged, 3
refused: a private key, a key check refuses, only retired keys; nothing
written). Every key of the host's value the source lacks stays published as
superseded until retire-keys after --grace.

With --watch (sa-key-publish.service, Type=notify): keep running and keep
etcd equal to the key files. Reconcile at start, when the key files change
(read every 2s), when this host's value or any host's key record changes in
etcd, after an etcd restore is noticed (a revision gone back, a compaction
not seen, another cluster ID) and at least every --reconcile-interval: a
deleted or edited value, or a lost superseded key, is published again; a
tombstone this master has seen (kept in --state-dir) that a record lost is
written back and its key removed from the value. Each repair is logged
(what, why) and counted (--publisher-metrics-addr, which also serves the
fleet's state read from etcd at each scrape: keys, trust, hold, lock and
rotation phase of every host under --keys-prefix, --trust-prefix,
--rotation-prefix, --lock-name and --hold-key). While it runs,
ROTATION-PREFIX/HOST/alive (on a --ttl lease) says so. Exit 3 when the key
files are refused at start (nothing written); etcd not answering is retried.`
