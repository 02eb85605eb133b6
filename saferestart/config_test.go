package saferestart

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/config"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
)

// Tests never read the real configuration file.
func init() { defaultConfig = "" }

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "safe-restart.toml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const sampleConfig = `# as examples/safe-restart.toml
endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
cacert = "/file/ca.crt"
cert = "/file/c.crt"
key = "/file/c.key"
password = "s3cret-from-file"
user = "root"
health-url = "https://127.0.0.1:6443/readyz"
jwks-key-file = ["/file/bundle.pem"]
preflight-flags-file = ["/file/apiserver-sa.env"]
ttl = 20
lock-timeout = "7m"
grace = "2h"
socket = "/run/kube-apiserver-sa-signer/signer.sock"
restart-mode = "systemd"
`

// flag > ETCDCTL_* > file > default, a list on the command line replacing
// the file's; keys of other subcommands and binaries are ignored.
func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, sampleConfig)
	p, fs, err := parseArgs([]string{"--config", path, "--jwks-key-file", "/cmd/a.pem", "--ttl", "3"},
		env(map[string]string{"ETCDCTL_CACERT": "/env/ca.crt"}))
	if err != nil {
		t.Fatal(err)
	}
	o := struct {
		*parsed
		*cmdkit.Restarting
	}{p, restartOf(t, p)}
	want := map[string]struct {
		got    any
		want   any
		origin string
	}{
		"endpoints":            {o.Endpoints, []string{"https://10.0.0.1:2379", "https://10.0.0.2:2379"}, path + ":2"},
		"cacert":               {o.CACert, "/env/ca.crt", "env ETCDCTL_CACERT"},
		"cert":                 {o.Cert, "/file/c.crt", path + ":4"},
		"jwks-key-file":        {o.JWKSKeyFiles, []string{"/cmd/a.pem"}, "flag"},
		"preflight-flags-file": {o.PreflightFlagsFiles, []string{"/file/apiserver-sa.env"}, path + ":10"},
		"ttl":                  {o.TTL, 3, "flag"},
		"lock-timeout":         {o.LockTimeout, 7 * time.Minute, path + ":12"},
		"password":             {o.Password, "s3cret-from-file", path + ":6"},
		"restart-timeout":      {o.RestartTimeout, 3 * time.Minute, "default"},
	}
	for name, w := range want {
		if !reflect.DeepEqual(w.got, w.want) || o.Origin[name] != w.origin {
			t.Errorf("%s = %v from %q, want %v from %q", name, w.got, o.Origin[name], w.want, w.origin)
		}
	}
	// grace is rotate-key's: restart ignores it; status ignores the
	// restart's keys (no "does not apply" error for a file).
	if fs.Lookup("grace") != nil || p.Origin["grace"] != "" {
		t.Errorf("restart took rotate-key's grace from the file: %s", p.Origin["grace"])
	}
	if _, fs, err = parseArgs([]string{"status", "--config", path}, env(nil)); err != nil || fs.Lookup("lock-timeout") != nil {
		t.Fatalf("status with the file: %v, lock-timeout %v", err, fs.Lookup("lock-timeout"))
	}
	if p, _, err = parseArgs([]string{"rotate-key", "--config", path}, env(nil)); err != nil || opts[*keycmd.RotateKey](t, p).Grace != 2*time.Hour || opts[*keycmd.RotateKey](t, p).TTL != 20 {
		t.Fatalf("rotate-key with the file: %v", err)
	}
}

// The default path is read only when present; --config ” reads none; a
// named file that is missing is an error.
func TestConfigDefaultPath(t *testing.T) {
	path := writeConfig(t, "ttl = 42\n")
	defer func(d string) { defaultConfig = d }(defaultConfig)
	defaultConfig = path
	o, _, err := parseArgs(nil, env(nil))
	if err != nil || restartOf(t, o).TTL != 42 || o.File == nil {
		t.Fatalf("default present: %v", err)
	}
	if o, _, err = parseArgs([]string{"--config", ""}, env(nil)); err != nil || restartOf(t, o).TTL != 10 || o.File != nil {
		t.Fatalf("--config '': %v", err)
	}
	defaultConfig = filepath.Join(t.TempDir(), "absent.toml")
	if o, _, err = parseArgs(nil, env(nil)); err != nil || restartOf(t, o).TTL != 10 {
		t.Fatalf("default absent: %v", err)
	}
	_, _, err = parseArgs([]string{"--config", defaultConfig}, env(nil))
	var ue *cli.UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "absent.toml") {
		t.Fatalf("named file missing: %v", err)
	}
}

// Bad files are usage errors (exit 2) naming file and line; a bad value
// from the file is named with its place.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		text, want string
	}{
		{"endpoint = [\"x\"]\n", `:1: unknown key "endpoint"; did you mean "endpoints"?`},
		{"\nhealth-timeot = \"1m\"\n", `:2: unknown key "health-timeot"; did you mean "health-timeout"?`},
		{"ttl = 0\n", "--ttl (FILE:1) 0: must be at least 1 second"},
		{"ttl = \"5\"\n", ":1: ttl: want an integer"},
		{"health-settle = \"5m\"\n", "--health-settle (FILE:1) 5m0s must be shorter"},
	} {
		path := writeConfig(t, tc.text)
		var out, errb bytes.Buffer
		code := run(context.Background(), nil, []string{"--config", path, "--dry-run"}, &out, &errb)
		want := strings.ReplaceAll(tc.want, "FILE", path)
		if code != cmdkit.ExitUsage || !strings.Contains(errb.String(), want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", tc.text, code, errb.String(), want)
		}
	}
}

// check reads the restart's preflight inputs from the file only when its
// command line names nothing to check.
func TestConfigCheckInputs(t *testing.T) {
	path := writeConfig(t, "preflight-flags-file = [\"/file/sa.env\"]\npublic-only = true\nendpoints = [\"x\"]\n")
	p, _, err := parseArgs([]string{"check", "--config", path, "bundle.pem"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o := opts[*checkCmd](t, p); o.PreflightFlagsFiles != nil || !o.PublicOnly || !reflect.DeepEqual(o.Argv, []string{"bundle.pem"}) {
		t.Fatalf("check FILE: %+v", o)
	}
	p, _, err = parseArgs([]string{"check", "--config", path}, env(nil))
	if err != nil || !reflect.DeepEqual(opts[*checkCmd](t, p).PreflightFlagsFiles, []string{"/file/sa.env"}) {
		t.Fatalf("check alone: %v %+v", err, p)
	}
}

// `config` prints every setting with its origin, the password masked, as
// a file the package reads back.
func TestConfigSubcommand(t *testing.T) {
	path := writeConfig(t, sampleConfig)
	t.Setenv("ETCDCTL_DIAL_TIMEOUT", "4s")
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, []string{"config", "--config", path, "--attempts", "5"}, &out, &errb); code != cmdkit.ExitOK {
		t.Fatalf("config: exit %d %s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{
		"# configuration file: " + path,
		`endpoints = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]  # ` + path + ":2",
		`password = "****"  # ` + path + ":6",
		`attempts = 5  # flag`,
		`dial-timeout = "4s"  # env ETCDCTL_DIAL_TIMEOUT`,
		`restart-timeout = "3m0s"  # default`,
		`# socket = "/run/kube-apiserver-sa-signer/signer.sock"  # ` + path + ":14",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("config output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "s3cret") {
		t.Errorf("config output shows the password:\n%s", text)
	}
	if _, err := config.Parse("config-output", out.Bytes()); err != nil {
		t.Errorf("config output does not read back: %v\n%s", err, text)
	}
}

// Every flag is a key of the shared list (or a command-line choice), with
// the kind its flag parses: a new flag must be added there.
func TestEveryFlagIsAKey(t *testing.T) {
	_, fs, err := parseArgs([]string{"config"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]config.Kind{"string": config.String, "stringSlice": config.List, "stringArray": config.List,
		"duration": config.Duration, "int": config.Int, "bool": config.Bool}
	fs.VisitAll(func(f *pflag.Flag) {
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

// The signer's keys in the shared file are skipped, not refused:
// metrics-addr once made every safe-restart command exit 2 with "unknown
// key" on a signer host, whose one file carries it. The publisher's
// metrics take a key of their own (publisher-metrics-addr), so that the
// signer's stays the signer's.
func TestConfigSignerKeysSkipped(t *testing.T) {
	path := writeConfig(t, "metrics-addr = \"127.0.0.1:9731\"\nsocket = \"/run/x/signer.sock\"\nlock-name = \"/l\"\npublisher-metrics-addr = \"127.0.0.1:9732\"\n")
	for _, args := range [][]string{{"restart"}, {"status"}, {"config"}, {"publish-key", "--watch"}} {
		sub := args[0]
		_, fs, err := parseArgs(append(args, "--config="+path), env(nil))
		if err != nil {
			t.Fatalf("%s: %v", sub, err)
		}
		// The command's own values, whatever its options' type.
		value := func(name string) string {
			if f := fs.Lookup(name); f != nil {
				return f.Value.String()
			}
			return ""
		}
		if value("lock-name") != "/l" || fs.Lookup("metrics-addr") != nil {
			t.Errorf("%s: lock-name %q, --metrics-addr %v", sub, value("lock-name"), fs.Lookup("metrics-addr"))
		}
		if want := sub == "publish-key" || sub == "config"; (value("publisher-metrics-addr") == "127.0.0.1:9732") != want {
			t.Errorf("%s: --publisher-metrics-addr %q", sub, value("publisher-metrics-addr"))
		}
	}
}

// An unknown flag gets what was probably meant; --help goes to stdout,
// exit 0, nothing on stderr.
func TestUnknownFlagAndHelp(t *testing.T) {
	for args, want := range map[string]string{
		"--health-ur x":           "unknown flag: --health-ur; did you mean --health-url?",
		"status --endpoint x":     "unknown flag: --endpoint; did you mean --endpoints?",
		"--preflight-flag-file f": "did you mean --preflight-flags-file?",
		"rotate-keys":             `unknown subcommand "rotate-keys"; did you mean rotate-key?`,
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), nil, strings.Fields(args), &out, &errb); code != cmdkit.ExitUsage || !strings.Contains(errb.String(), want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", args, code, errb.String(), want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"rotate-key", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), nil, args, &out, &errb); code != cmdkit.ExitOK || errb.Len() != 0 || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("%q: exit %d, stdout %d bytes, stderr %q", args, code, out.Len(), errb.String())
		}
	}
}
