package saferestart

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/etcdflags"
)

// command describes one subcommand: its flags, its arguments, whether it
// talks to etcd (then it takes the etcd flags and ETCDCTL_*).
type command struct {
	name, use, short, long string
	etcd                   bool
	flags                  []func(*options, *pflag.FlagSet)
	args                   func(o *options, cmd *cobra.Command, args []string) error
}

// commands are the subcommands; restart is the default.
func (o *options) commands() []command {
	restarting := []func(*options, *pflag.FlagSet){lockFlags, restartFlags, preflightFlags, dryRunFlag, keysPrefixFlag,
		trustPrefixFlag, rotationPrefixFlag, hostFlag, signingKeyFlag, kubeconfigFlag, cmFlags, metricsTextfileFlag}
	return []command{
		{name: cmdRestart, use: "restart [flags] [-- COMMAND ARGS...]", etcd: true, args: restartArgs,
			short: "restart kube-apiserver through the lock (the default: a command line naming no subcommand)",
			long:  restartHelp, flags: append(restarting, outputFlag)},
		{name: cmdStatus, etcd: true, short: "show lock holder, waiters (FIFO), hold, each host's rotation and keys; exit 4 while a hold is active",
			flags: []func(*options, *pflag.FlagSet){lockFlags, rotationPrefixFlag, keysPrefixFlag, outputFlag}},
		{name: cmdHold, use: "hold --reason TEXT", etcd: true, short: "stop every host from restarting",
			flags: []func(*options, *pflag.FlagSet){lockFlags, hostFlag, holdFlags}},
		{name: cmdUnhold, etcd: true, short: "allow restarts again", flags: []func(*options, *pflag.FlagSet){lockFlags}},
		// check talks to etcd only with --require-signing-keys; it takes the
		// etcd flags so that it reads them from --config as every other
		// command does.
		{name: cmdCheck, use: "check [flags] [FILE...]", args: checkArgs, etcd: true,
			short: "validate PEM files or an apiserver flags file (confd's check_cmd); etcd only with --require-signing-keys",
			long:  checkHelp,
			flags: []func(*options, *pflag.FlagSet){preflightFlags, signingKeyFlag, checkFlags, keysPrefixFlag, trustPrefixFlag}},
		{name: cmdVersion, short: "print the version"},
		{name: cmdTrust, etcd: true, short: "hosts × service-account key IDs: signing, trusted, stale hosts",
			flags: []func(*options, *pflag.FlagSet){lockFlags, keysPrefixFlag, trustPrefixFlag, rotationPrefixFlag, outputFlag}},
		{name: cmdWaitTrusted, use: "wait-trusted --public-key FILE", etcd: true,
			short: "exit 0 once every publishing host trusts FILE's key; 5 on timeout",
			flags: []func(*options, *pflag.FlagSet){lockFlags, keysPrefixFlag, trustPrefixFlag, hostFlag, publicKeyFlag, timeoutFlag, waitTrustedFlags, preflightFlags,
				rotationPrefixFlag, ttlFlag}},
		{name: cmdRotateKey, use: "rotate-key [flags] [-- COMMAND ARGS...]", etcd: true, args: restartArgs,
			short: "rotate this host's service-account key (resumable; --dry-run shows the steps)",
			flags: append(restarting, publicKeyFlag, timeoutFlag, graceFlag, rotateKeyFlags)},
		{name: cmdRetireKeys, etcd: true, short: "retire every host's superseded public keys once their grace is over, from any master (for a systemd timer)",
			flags: []func(*options, *pflag.FlagSet){lockFlags, dryRunFlag, keysPrefixFlag, trustPrefixFlag, hostFlag, publicKeyFlag,
				signingKeyFlag, rotationPrefixFlag, kubeconfigFlag, cmFlags, retireKeysFlags}},
		{name: cmdPublishKey, etcd: true, short: "publish this host's public key(s) (--public-key, or --signing-key's public half) when they changed; --watch: keep them published",
			long: publishKeyHelp,
			flags: []func(*options, *pflag.FlagSet){lockFlags, keysPrefixFlag, trustPrefixFlag, hostFlag, publicKeyFlag, signingKeyFlag,
				rotationPrefixFlag, graceFlag, publishKeyFlags, publishWatchFlags, ttlFlag, staleTokenFlags, healthCredFlags, tokenProbeFlags}},
		{name: cmdForgetHost, use: "forget-host HOST", etcd: true, args: forgetArgs, long: forgetHelp,
			short: "remove a master for good: its keys superseded (retired after --grace), its trust and rotation records gone; --dry-run shows what",
			flags: []func(*options, *pflag.FlagSet){lockFlags, dryRunFlag, keysPrefixFlag, trustPrefixFlag, rotationPrefixFlag, hostFlag, graceFlag, kubeconfigFlag}},
		// config shows what every command would read: it takes all flags.
		{name: cmdConfig, etcd: true, short: "print the effective configuration and where each value came from",
			flags: append(restarting, outputFlag, holdFlags, checkFlags, publicKeyFlag, timeoutFlag, waitTrustedFlags,
				graceFlag, rotateKeyFlags, publishKeyFlags, publishWatchFlags, retireKeysFlags, staleTokenFlags, tokenProbeFlags)},
	}
}

// newRoot is the command tree; act runs a command whose options are
// complete and valid, and returns its exit code.
func newRoot(p *cli.Program, o *options, act func(*options) int) *cobra.Command {
	root := p.Root(&o.Common, progName, "restart kube-apiserver on one control-plane host at a time", rootHelp())
	for _, c := range o.commands() {
		use := c.use
		if use == "" {
			use = c.name
		}
		long := c.short
		if c.long != "" {
			long += "\n\n" + c.long
		}
		if c.etcd {
			long += "\n\n" + etcdHelp
		}
		cmd := &cobra.Command{Use: use, Short: c.short, Long: long, Args: cobra.ArbitraryArgs}
		fs := cmd.Flags()
		fs.SortFlags = false
		if c.etcd {
			o.Etcd.Register(fs)
		}
		for _, register := range c.flags {
			register(o, fs)
		}
		c := c
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			o.sub, o.flags = c.name, cmd.Flags()
			// check reads etcdctl's environment only when it talks to
			// etcd: a plain file check must not fail on an unrelated
			// ETCDCTL_* (fileUse keeps --require-signing-keys off the file).
			var e *cli.Etcd
			if c.etcd && (c.name != cmdCheck || o.requireSigningKeys) {
				e = &o.Etcd
			}
			if c.args == nil && len(args) > 0 {
				return usagef("%s takes no arguments, got %q", c.name, args)
			}
			if err := p.Resolve(cmd, &o.Common, e, o.fileUse(cmd, args)); err != nil {
				return err
			}
			if c.args != nil {
				if err := c.args(o, cmd, args); err != nil {
					return o.FromFile(err)
				}
			}
			if err := o.FromFile(validate(o)); err != nil {
				return err
			}
			return cli.Exit(act(o))
		}
		root.AddCommand(cmd)
	}
	return root
}

// fileUse says which of the file's keys a command reads: all it has flags
// for, but check reads the restart's preflight inputs only when its
// command line names nothing to check (then it checks what the restart
// would preflight), and never require-signing-keys: the check_cmd that
// wants etcd says so itself, and a file shared by every command must not
// make each plain file check depend on etcd.
func (o *options) fileUse(cmd *cobra.Command, args []string) func(string) bool {
	if o.sub != cmdCheck {
		return nil
	}
	fs := cmd.Flags()
	given := len(args) > 0 || fs.Changed("preflight-file") || fs.Changed("preflight-flags-file")
	return func(name string) bool {
		if name == "require-signing-keys" {
			return false
		}
		return !given || (name != "preflight-file" && name != "preflight-flags-file")
	}
}

// restartArgs: restart and rotate-key take their command after --, and
// nothing before it.
func restartArgs(o *options, cmd *cobra.Command, args []string) error {
	dash := cmd.ArgsLenAtDash()
	before := args
	if dash >= 0 {
		before = args[:dash]
	}
	if len(before) > 0 {
		return usagef("unexpected argument %q: put the restart command after --", before[0])
	}
	if err := applyRestartMode(o); err != nil {
		return err
	}
	o.argv = modeCommand(o)
	if dash >= 0 {
		if len(args) == dash {
			return usagef("no command after --")
		}
		o.argv = args[dash:]
	}
	return nil
}

// checkArgs: check's FILEs, before or after --.
func checkArgs(o *options, _ *cobra.Command, args []string) error {
	o.argv = args
	if len(o.argv)+len(o.preflightFiles)+len(o.preflightFlagsFiles) == 0 {
		return usagef("check needs at least one FILE, --preflight-file or --preflight-flags-file")
	}
	if len(o.requireKeys) > 0 && len(o.argv) == 0 {
		return usagef("--require-key applies to bundle FILEs, and none was given")
	}
	if o.requireSigningKeys && len(o.argv) == 0 {
		return usagef("--require-signing-keys applies to bundle FILEs, and none was given")
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
const etcdHelp = etcdflags.EnvHelp + ` The password is never logged, and
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
`, progName, strings.Join(defaultCommand, " "), config.DefaultPath, etcdHelp)
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
