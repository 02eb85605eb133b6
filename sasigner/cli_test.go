package sasigner

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/internal/version"
)

// parseArgs is the command line without the daemon, for tests.
func parseArgs(args []string, env lookupEnv) (*options, *cobra.Command, error) {
	o := &options{gid: -1}
	var out strings.Builder
	p := &cli.Program{Name: progName, Stdout: &out, Stderr: &out, LookupEnv: env, DefaultConfig: defaultConfig}
	done := false
	cmd := newCommand(p, o, func(*options) int { done = true; return cli.ExitOK })
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		return nil, cmd, err
	}
	if !done {
		return nil, cmd, fmt.Errorf("not run: %s", out.String())
	}
	return o, cmd, nil
}

type lookupEnv func(string) (string, bool)

func envOf(m map[string]string) lookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestFlagsAndEnvironment pins the defaults the issue names and etcdctl's
// environment with a flag beating it, as kube-apiserver-safe-restart does.
func TestFlagsAndEnvironment(t *testing.T) {
	o, _, err := parseArgs(nil, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.socket != "/run/kube-apiserver-sa-signer/signer.sock" || o.keysPrefix != "/kubernetes/service-account-keys/" ||
		o.trustPrefix != "/kubernetes/service-account-keys-trust/" || o.refreshHint != 10*time.Second ||
		o.maxTokenExpiration != 8760*time.Hour || o.signingKey != "/etc/kubernetes/pki/sa.key" || o.gid != -1 {
		t.Errorf("defaults: %+v", o)
	}

	env := envOf(map[string]string{"ETCDCTL_ENDPOINTS": "https://a:2379, https://b:2379", "ETCDCTL_USER": "root:pw",
		"ETCDCTL_CACERT": "/ca", "ETCDCTL_DIAL_TIMEOUT": "7s"})
	o, _, err = parseArgs([]string{"--cacert=/flag-ca"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Endpoints, []string{"https://a:2379", "https://b:2379"}) || o.User != "root" || o.Password != "pw" ||
		o.CACert != "/flag-ca" || o.DialTimeout != 7*time.Second {
		t.Errorf("environment: %+v", o)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-token-expiration=9m"}, "--max-token-expiration"},
		{[]string{"--refresh-hint=1500ms"}, "--refresh-hint"},
		{[]string{"--keys-prefix=/"}, "--keys-prefix"},
		{[]string{"--cert=/c"}, "--cert and --key"},
		{[]string{"--socket-group=no-such-group-here"}, "--socket-group"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		if _, _, err := parseArgs(tc.args, envOf(nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

func init() { defaultConfig = "" }

// TestConfigFile: the shared TOML file sets the signer's flags; a flag
// beats it; another binary's key is skipped; an unknown key is an error
// naming the file and line.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/safe-restart.toml"
	data := `endpoints = ["https://10.0.0.1:2379"]
socket = "/run/x/signer.sock"
refresh-hint = "20s"
health-url = "https://127.0.0.1:6443/readyz"
trust-timeout = "5m"
controller-manager-flags-file = ["/etc/kubernetes/manifests/kube-controller-manager.yaml"]
metrics-addr = "127.0.0.1:9731"
`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	o, _, err := parseArgs([]string{"--config=" + path, "--trust-timeout=1m"}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.Endpoints, []string{"https://10.0.0.1:2379"}) || o.socket != "/run/x/signer.sock" ||
		o.refreshHint != 20*time.Second || o.trustTimeout != time.Minute ||
		!slices.Equal(o.cmFlagsFiles, []string{"/etc/kubernetes/manifests/kube-controller-manager.yaml"}) ||
		o.metricsAddr != "127.0.0.1:9731" {
		t.Errorf("from the file: %+v", o)
	}
	if err := os.WriteFile(path, []byte("sockett = \"/x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseArgs([]string{"--config=" + path}, envOf(nil)); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("unknown key: %v, want an error naming %s", err, path)
	}
}

// Every long flag is a key of the shared file (or a command-line choice),
// of the kind its flag parses, as kube-apiserver-safe-restart's are: the
// unit and the file then say each setting once.
func TestEveryFlagIsAKey(t *testing.T) {
	_, cmd, err := parseArgs(nil, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]config.Kind{"string": config.String, "stringSlice": config.List, "stringArray": config.List,
		"duration": config.Duration, "int": config.Int, "bool": config.Bool}
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if slices.Contains(config.CommandLineOnly, f.Name) {
			return
		}
		k, ok := config.Lookup(f.Name)
		if !ok {
			t.Errorf("--%s is not in config.Keys", f.Name)
			return
		}
		if kinds[f.Value.Type()] != k.Kind {
			t.Errorf("--%s is a %s flag, config.Keys says %s", f.Name, f.Value.Type(), k.Kind)
		}
	})
}

// The command line's outcomes, through the shared scaffolding: help and
// version on stdout with exit 0, a mistyped flag exit 2 with the flag it
// probably meant, no subcommands (a word is an unexpected argument).
func TestRunUsage(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		code      int
		out, errs string
	}{
		{[]string{"--help"}, cli.ExitOK, "--signing-key", ""},
		{[]string{"-h"}, cli.ExitOK, "Usage:", ""},
		{[]string{"--version"}, cli.ExitOK, version.Text(progName), ""},
		{[]string{"version"}, cli.ExitOK, version.Text(progName), ""},
		{[]string{"--socket", "relative", "--version"}, cli.ExitOK, version.Text(progName), ""},
		{[]string{"version", "x"}, cli.ExitUsage, "", `unknown command "x" for "` + progName + ` version"`},
		{[]string{"--sockett", "/x"}, cli.ExitUsage, "", "unknown flag: --sockett; did you mean --socket?\nRun '" + progName + " --help' for usage."},
		{[]string{"serve"}, cli.ExitUsage, "", `unexpected argument "serve"`},
	} {
		var out, errb strings.Builder
		code := run(context.Background(), tc.args, envOf(nil), nil, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.errs) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", tc.args, code, out.String(), errb.String())
		}
	}
}
