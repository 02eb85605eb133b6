package saferestart

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

type lookupEnv func(string) (string, bool)

// parsed is a command line up to the command's start.
type parsed struct {
	sub  string
	opts options
	*cmdkit.Shared
}

// parseArgs is the command line up to the command's start: its complete
// options, its flags, or the usage error.
func parseArgs(args []string, env lookupEnv) (*parsed, *pflag.FlagSet, error) {
	var out strings.Builder
	p := &cli.Program{Name: cmdkit.ProgName, Stdout: &out, Stderr: &out, LookupEnv: env, DefaultConfig: defaultConfig}
	s := &cmdkit.Shared{}
	var res *parsed
	var fs *pflag.FlagSet
	root := newRoot(p, s, func(name string, o options) int { res = &parsed{sub: name, opts: o, Shared: s}; return cmdkit.ExitOK })
	args, err := cli.Dispatch(root, args, cmdRestart)
	if err != nil {
		return nil, nil, err
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(context.Background())
	if cmd != nil {
		fs = cmd.Flags()
	}
	if err != nil {
		return nil, fs, err
	}
	if res == nil {
		return nil, nil, errors.New("not run: " + out.String())
	}
	return res, fs, nil
}

// env is the environment the command runs in, its output to w.
func (p *parsed) env(w io.Writer, log *logrus.Logger) *cmdkit.Env {
	return newEnv(p.Shared, p.opts, w, w, log)
}

// argv is the command's arguments: the restart command, check's FILEs.
func (p *parsed) argv() []string {
	switch o := p.opts.(type) {
	case *restartcmd.Command:
		return o.Argv
	case *keycmd.RotateKey:
		return o.Argv
	case *checkCmd:
		return o.Argv
	}
	return nil
}

// The options of the command parsed, as type T; the test fails when it is
// another command's.
func opts[T options](t *testing.T, p *parsed) T {
	t.Helper()
	o, ok := p.opts.(T)
	if !ok {
		t.Fatalf("%s: options %T", p.sub, p.opts)
	}
	return o
}

// restartParsed is a restart command line's options.
type restartParsed struct {
	*cmdkit.Restarting
	*cmdkit.Shared
}

// parseRestart parses a restart or rotate-key command line.
func parseRestart(t *testing.T, args []string) (restartParsed, *pflag.FlagSet, error) {
	t.Helper()
	p, fs, err := parseArgs(args, env(nil))
	if err != nil {
		return restartParsed{}, fs, err
	}
	return restartParsed{restartOf(t, p), p.Shared}, fs, nil
}

// restartOf is the restart options of restart or rotate-key.
func restartOf(t *testing.T, p *parsed) *cmdkit.Restarting {
	t.Helper()
	switch o := p.opts.(type) {
	case *restartcmd.Command:
		return &o.Restarting
	case *keycmd.RotateKey:
		return &o.Restarting
	}
	t.Fatalf("%s: not a restarting command", p.sub)
	return nil
}

// oldFlagScope is the scope table the single flag set kept before the
// commands had their own flags (commit bee6c5e), frozen: which
// subcommands a flag applied to; a flag not listed applied to all but
// check and version.
var oldFlagScope = map[string][]string{
	"ttl": oldRestarting, "lock-timeout": oldRestarting, "ignore-hold": oldRestarting,
	"restart-timeout": oldRestarting, "attempts": oldRestarting, "retry-delay": oldRestarting, "dry-run": {cmdRestart, cmdRotateKey, cmdRetireKeys},
	"health-url": oldRestarting, "health-cacert": oldRestarting, "health-cert": oldRestarting, "health-key": oldRestarting,
	"health-token-file": oldRestarting, "health-settle": oldRestarting, "health-timeout": oldRestarting,
	"health-interval": oldRestarting, "jwks-key-file": oldRestarting,
	"preflight-file": {cmdRestart, cmdRotateKey, cmdCheck, cmdWaitTrusted}, "preflight-flags-file": {cmdRestart, cmdRotateKey, cmdCheck, cmdWaitTrusted},
	"keys-prefix":   {cmdRestart, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"trust-prefix":  {cmdRestart, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys},
	"host":          {cmdRestart, cmdHold, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"trust-timeout": oldRestarting,
	"public-key":    {cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"signing-key":   {cmdRotateKey, cmdRetireKeys, cmdPublishKey, cmdRestart, cmdCheck},
	"certificate":   {cmdPublishKey},
	"config":        allSubcommands,
	"timeout":       {cmdWaitTrusted, cmdRotateKey},
	"exclude-host":  {cmdWaitTrusted}, "skip-unrecorded": {cmdWaitTrusted}, "if-new-key": {cmdWaitTrusted},
	"algorithm": {cmdRotateKey}, "grace": {cmdRotateKey, cmdPublishKey}, "abort": {cmdRotateKey}, "rollback": {cmdRotateKey},
	"rotation-prefix": {cmdRotateKey, cmdRetireKeys, cmdPublishKey},
	"signer":          {cmdRotateKey},
	"reason":          {cmdHold},
	"public-only":     {cmdCheck},
	"require-key":     {cmdCheck},
	"keys-only":       {cmdCheck},
	// New since the table was frozen (issue 31).
	"require-signing-keys": {cmdCheck},
	"output":               {cmdStatus, cmdRestart, cmdTrust},
	"log-level":            allSubcommands, "log-format": allSubcommands, "help": allSubcommands,
	"restart-mode": oldRestarting, "cri-endpoint": oldRestarting, "static-pod-stop-timeout": oldRestarting,
	// Stale-token evidence (issue 31): retire-keys weighs it; the
	// sampler's URL is the long-running publisher's, shown by config.
	"stale-token-window": {cmdRetireKeys}, "ignore-stale-tokens": {cmdRetireKeys}, "apiserver-metrics-url": {},
	"kubeconfig": {cmdRestart, cmdRotateKey, cmdRetireKeys}, "ignore-legacy-tokens": {cmdRetireKeys}, "fleet-lease-age": oldRestarting, "min-live-apiservers": oldRestarting, "fleet-timeout": oldRestarting,
	// publish-key --watch (issue 31.2).
	"watch": {cmdPublishKey}, "reconcile-interval": {cmdPublishKey}, "state-dir": {cmdPublishKey}, "publisher-metrics-addr": {cmdPublishKey},
	// publish-key --watch's token probe (issue 33.5).
	"token-probe-kubeconfig": {cmdPublishKey}, "token-probe-service-account": {cmdPublishKey}, "token-probe-interval": {cmdPublishKey}, "token-probe-apiservers": {cmdPublishKey},
}

var oldRestarting = []string{cmdRestart, cmdRotateKey}

var allSubcommands = []string{cmdRestart, cmdStatus, cmdHold, cmdUnhold, cmdCheck, cmdVersion, cmdTrust, cmdWaitTrusted, cmdRotateKey, cmdRetireKeys, cmdPublishKey, cmdConfig, cmdForgetHost}

// narrowed are the flags that applied to every etcd command but were read
// by a few: kube-controller-manager's, now flags of those few.
var narrowed = map[string][]string{
	"controller-manager-flags-file":    {cmdRestart, cmdRotateKey, cmdRetireKeys, cmdConfig},
	"controller-manager-restart-mode":  {cmdRestart, cmdRotateKey, cmdRetireKeys, cmdConfig},
	"controller-manager-health-url":    {cmdRestart, cmdRotateKey, cmdRetireKeys, cmdConfig},
	"controller-manager-health-cacert": {cmdRestart, cmdRotateKey, cmdRetireKeys, cmdConfig},
	// New: the node_exporter textfile of the runs that restart.
	"metrics-textfile": {cmdRestart, cmdRotateKey, cmdConfig},
}

// widened are the flags a command takes beyond the old table: check reads
// the trust records with --require-signing-keys (issue 31), so it takes the
// etcd flags and the prefixes; --rotation-prefix by every command that
// reads the rotation records (wait-trusted writes its waiting record
// there); --ttl by wait-trusted and publish-key (--watch) for their
// records' leases; --keys-prefix by status, which shows each host's keys;
// forget-host (issue 31), new, takes the etcd and lock flags as every etcd
// command did, and these.
var widened = map[string][]string{
	"dry-run": {cmdForgetHost}, "keys-prefix": {cmdCheck, cmdStatus, cmdForgetHost}, "trust-prefix": {cmdCheck, cmdForgetHost, cmdPublishKey},
	"rotation-prefix": {cmdWaitTrusted, cmdRestart, cmdStatus, cmdTrust, cmdForgetHost}, "host": {cmdForgetHost},
	"grace": {cmdForgetHost}, "kubeconfig": {cmdForgetHost},
	"endpoints": {cmdCheck}, "cacert": {cmdCheck}, "cert": {cmdCheck}, "key": {cmdCheck}, "user": {cmdCheck},
	"password": {cmdCheck}, "dial-timeout": {cmdCheck}, "command-timeout": {cmdCheck},
	"ttl": {cmdWaitTrusted, cmdPublishKey},
	// publish-key --watch runs the stale-token sampler: its URL and the
	// health gate's credentials, with which it reads /metrics.
	"apiserver-metrics-url": {cmdPublishKey}, "health-cacert": {cmdPublishKey}, "health-cert": {cmdPublishKey},
	"health-key": {cmdPublishKey}, "health-token-file": {cmdPublishKey},
	// publish-key --watch's fleet gauges read the trust records too; the
	// widening is in trust-prefix's entry above.
}

// Each command takes exactly the flags the old scope table gave it (but
// the controller-manager's, narrowed to the commands that read them, and
// the widened ones): no command line that worked stops working, and no
// flag name changed.
func TestFlagsPerCommandAsBefore(t *testing.T) {
	all := map[string]bool{}
	perCommand := map[string]map[string]bool{}
	for _, sub := range allSubcommands {
		perCommand[sub] = map[string]bool{}
		for _, f := range commandFlags(t, sub) {
			perCommand[sub][f] = true
			all[f] = true
		}
	}
	// 58 flags (--help among them, which cobra adds to each command at
	// its run) and the 8 etcd flags, as before, and --require-signing-keys,
	// --stale-token-window, --ignore-stale-tokens, --apiserver-metrics-url,
	// publish-key --watch's 4, --metrics-textfile and the token probe's 4.
	if len(all) != 58-1+8+1+3+4+1+4 {
		t.Errorf("%d flags in all, want 78", len(all))
	}
	for flag := range all {
		for _, sub := range allSubcommands {
			want := sub == cmdConfig
			if scope, ok := oldFlagScope[flag]; ok {
				want = want || slices.Contains(scope, sub)
			} else {
				want = want || sub != cmdCheck && sub != cmdVersion
			}
			if n, ok := narrowed[flag]; ok {
				want = slices.Contains(n, sub)
			}
			want = want || slices.Contains(widened[flag], sub)
			if got := perCommand[sub][flag]; got != want {
				t.Errorf("%s --%s: taken %v, want %v", sub, flag, got, want)
			}
		}
	}
}

// A command's --help lists its own flags and the shared ones, not the
// others'; the root's lists the commands and the exit codes.
func TestHelpPerCommand(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		has, hasNot []string
	}{
		{[]string{"status", "--help"}, []string{"--lock-name", "--output", "--endpoints", "--config", "--log-format", "ETCDCTL_ENDPOINTS"}, []string{"--health-url", "--reason", "--grace"}},
		{[]string{"check", "-h"}, []string{"--public-only", "--preflight-flags-file", "--signing-key", "--config", "--require-signing-keys", "--endpoints", "--trust-prefix"}, []string{"--lock-name"}},
		{[]string{"--endpoints", "x", "rotate-key", "--help"}, []string{"--grace", "--health-url", "--ttl", "--abort"}, []string{"--reason", "--exclude-host"}},
		{[]string{"help", "hold"}, []string{"--reason", "--host"}, []string{"--ttl"}},
		{[]string{"--help"}, []string{"rotate-key", "wait-trusted", "completion", "Exit codes:"}, []string{"--health-url string"}},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), nil, tc.args, &out, &errb)
		if code != cmdkit.ExitOK || errb.Len() != 0 {
			t.Errorf("%q: exit %d, stderr %q", tc.args, code, errb.String())
		}
		for _, s := range tc.has {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%q: help lacks %s", tc.args, s)
			}
		}
		for _, s := range tc.hasNot {
			if strings.Contains(out.String(), s) {
				t.Errorf("%q: help shows %s", tc.args, s)
			}
		}
	}
}

// Shell completion comes with cobra: a script per shell, and flag and
// command completion through the hidden __complete command.
func TestCompletion(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, []string{"completion", "bash"}, &out, &errb); code != cmdkit.ExitOK || !strings.Contains(out.String(), "__start_"+cmdkit.ProgName) {
		t.Fatalf("completion bash: exit %d, %d bytes, stderr %q", code, out.Len(), errb.String())
	}
	out.Reset()
	if code := run(context.Background(), nil, []string{"__complete", "wait-trusted", "--if"}, &out, &errb); code != cmdkit.ExitOK || !strings.Contains(out.String(), "--if-new-key") {
		t.Fatalf("__complete: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), nil, []string{"__complete", "rot"}, &out, &errb); code != cmdkit.ExitOK || !strings.Contains(out.String(), "rotate-key") {
		t.Fatalf("__complete: exit %d, %q", code, out.String())
	}
}
