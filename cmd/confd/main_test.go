package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/resource"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFlagSpellings(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		check func(*Config) bool
	}{
		{"single dash bool", []string{"-watch"}, func(c *Config) bool { return c.Watch }},
		{"double dash bool", []string{"--watch"}, func(c *Config) bool { return c.Watch }},
		{"bool =false", []string{"-onetime=false"}, func(c *Config) bool { return !c.OneTime }},
		{"bool =true", []string{"-onetime=true"}, func(c *Config) bool { return c.OneTime }},
		{"value after space", []string{"-node", "http://a:2379"}, func(c *Config) bool { return reflect.DeepEqual(c.Store.Nodes, []string{"http://a:2379"}) }},
		{"value after =", []string{"-node=http://a:2379", "--node", "http://b:2379"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Store.Nodes, []string{"http://a:2379", "http://b:2379"})
		}},
		{"interval", []string{"-interval", "5"}, func(c *Config) bool { return c.Interval == 5 }},
		{"repeated file", []string{"-backend", "file", "-file", "a.yaml", "-file=b,c.yaml"}, func(c *Config) bool {
			return reflect.DeepEqual(c.Store.YAMLFiles, []string{"a.yaml", "b,c.yaml"})
		}},
		{"defaults", nil, func(c *Config) bool {
			return c.Store.Backend == "etcd" && c.ConfDir == "/etc/confd" && c.Interval == 600 && c.Store.Filter == "*" && c.Store.Scheme == "http" && c.CheckCmdTimeout == time.Minute
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"-config-file", filepath.Join(t.TempDir(), "absent.toml")}, tc.args...)
			c, log, code := configure(args, &out, &errb, envOf(nil))
			if log == nil {
				// an explicitly named but absent config file is an error; use the default path instead
				c, log, code = configure(tc.args, &out, &errb, envOf(nil))
			}
			if log == nil {
				t.Fatalf("configure(%v) exit %d: %s", tc.args, code, errb.String())
			}
			if !tc.check(c) {
				t.Errorf("configure(%v) = %+v", tc.args, c)
			}
		})
	}
}

func TestBadFlagsNameTheFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-no-such-flag"}, "no-such-flag"},
		{[]string{"-interval", "soon"}, "interval"},
		{[]string{"-backend", "consul"}, `-backend "consul"`},
		{[]string{"-backend", "file"}, "-file"},
		{[]string{"-backend", "env", "-watch"}, "-watch"},
		{[]string{"-log-level", "loud"}, "-log-level"},
		{[]string{"-client-cert", "a.pem"}, "-client-key"},
		{[]string{"stray"}, `"stray"`},
		{[]string{"-config-file", "/nonexistent/confd.toml"}, "/nonexistent/confd.toml"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		_, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log != nil || code != 2 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("configure(%v): exit %d, stderr %q; want exit 2 naming %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// A misspelt confd.toml key stops confd (exit 2) with the file, the line
// and the key probably meant, every such key reported: as a warning it left
// confd running on a default nobody chose.
func TestConfigUnknownKeyIsError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "confd.toml")
	body := "backend = \"env\"\nintervall = 5\nclient-certs = \"/x\"\ncolour = \"blue\"\ntable = \"dynamo\"\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	_, log, code := configure([]string{"-config-file", file, "-onetime"}, &out, &errb, envOf(nil))
	if log != nil || code != 2 {
		t.Fatalf("exit %d, want 2:\n%s", code, errb.String())
	}
	for _, w := range []string{
		file + `:2: unknown key "intervall"; did you mean "interval"?`,
		file + `:3: unknown key "client-certs"; did you mean "client_cert"?`,
		file + `:4: unknown key "colour": not a confd.toml key`,
		// Another backend's key is no typo: still a warning.
		`key "table" is used by no backend`,
	} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, errb.String())
		}
	}
	if n := strings.Count(errb.String(), "ERROR"); n != 3 {
		t.Errorf("%d ERROR lines, want one per unknown key:\n%s", n, errb.String())
	}
}

func TestPrecedenceFlagEnvFileDefault(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "confd.toml")
	body := `backend = "etcdv3"
nodes = ["http://file-a:2379", "http://file-b:2379"]
prefix = "/file"
interval = 30
client_cert = "/file/cert.pem"
client_key = "/file/key.pem"
client_cakeys = "/file/ca.pem"
password = "file-secret"
log-level = "debug"
sync-only = true
table = "dynamo"
`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"CONFD_CLIENT_CERT": "/env/cert.pem", "CONFD_CLIENT_CAKEYS": "/env/ca.pem"})
	var out, errb bytes.Buffer
	c, log, code := configure([]string{"-config-file", file, "-prefix", "/flag", "-client-ca-keys", "/flag/ca.pem"}, &out, &errb, env)
	if log == nil {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := map[string][2]string{
		"prefix (flag over file)":   {c.Prefix, "/flag"},
		"ca (flag over env)":        {c.Store.ClientCAKeys, "/flag/ca.pem"},
		"cert (env over file)":      {c.Store.ClientCert, "/env/cert.pem"},
		"key (file over default)":   {c.Store.ClientKey, "/file/key.pem"},
		"backend (file)":            {c.Store.Backend, "etcdv3"},
		"log-level (dash spelling)": {c.LogLevel, "debug"},
		"confdir (default)":         {c.ConfDir, "/etc/confd"},
		"nodes (file list)":         {strings.Join(c.Store.Nodes, ","), "http://file-a:2379,http://file-b:2379"},
	}
	for name, gw := range want {
		if gw[0] != gw[1] {
			t.Errorf("%s = %q, want %q", name, gw[0], gw[1])
		}
	}
	if c.Interval != 30 || !c.SyncOnly || c.Store.Password != "file-secret" {
		t.Errorf("interval %d sync-only %v password set %v", c.Interval, c.SyncOnly, c.Store.Password != "")
	}
	for _, w := range []string{`key "table" is used by no backend`, file} {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("warnings lack %q:\n%s", w, errb.String())
		}
	}
	if strings.Contains(errb.String(), "file-secret") {
		t.Error("password appeared in the log")
	}
}

func TestConfigFileErrorsNameFileAndLine(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "confd.toml")
	if err := os.WriteFile(file, []byte("backend = \"etcd\"\ninterval = \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if _, log, code := configure([]string{"-config-file", file}, &out, &errb, envOf(nil)); log != nil || code != 2 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(errb.String(), file+":2") {
		t.Errorf("stderr %q lacks %s:2", errb.String(), file)
	}
	if err := os.WriteFile(file, []byte("interval = \"often\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if _, log, _ := configure([]string{"-config-file", file}, &out, &errb, envOf(nil)); log != nil || !strings.Contains(errb.String(), `key "interval"`) {
		t.Errorf("bad interval: %s", errb.String())
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if _, log, code := configure([]string{"--help"}, &out, &errb, envOf(nil)); log != nil || code != 0 {
		t.Fatalf("exit %d", code)
	}
	// On stdout, the output asked for, so that `confd --help | less` works.
	if errb.Len() != 0 || !strings.HasPrefix(out.String(), "Usage of confd:") {
		t.Errorf("--help: stdout %q..., stderr %q", out.String()[:min(40, out.Len())], errb.String())
	}
	for _, f := range []string{"backend", "node", "prefix", "confdir", "config-file", "interval", "watch", "onetime", "noop",
		"sync-only", "keep-stage-file", "log-level", "client-cert", "client-key", "client-ca-keys", "client-insecure",
		"basic-auth", "username", "password", "srv-domain", "srv-record", "scheme", "file", "filter", "version",
		"wait", "resync", "metrics-addr"} {
		if !strings.Contains(out.String(), "--"+f+" ") && !strings.Contains(out.String(), "--"+f+"[=true|false]") {
			t.Errorf("--help lacks --%s", f)
		}
	}
}

func TestUnknownFlagsNamedAsWritten(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-auth-token", "x"}, "confd: unknown flag: -auth-token (confd --help lists every flag)\n"},
		{[]string{"-auth-token=x"}, "confd: unknown flag: -auth-token (confd --help lists every flag)\n"},
		{[]string{"--auth-token", "x"}, "confd: unknown flag: --auth-token (confd --help lists every flag)\n"},
		{[]string{"-onetime", "-table", "t"}, "confd: unknown flag: -table (confd --help lists every flag)\n"},
		{[]string{"-a"}, "confd: unknown flag: -a (confd --help lists every flag)\n"},
		{[]string{"-onetim"}, "confd: unknown flag: -onetim; did you mean -onetime? (confd --help lists every flag)\n"},
		{[]string{"--conf-dir", "/x"}, "confd: unknown flag: --conf-dir; did you mean --confdir? (confd --help lists every flag)\n"},
		{[]string{"-client_cert=/c"}, "confd: unknown flag: -client_cert; did you mean -client-cert? (confd --help lists every flag)\n"},
		{[]string{"-onetime=maybe"}, "confd: invalid argument \"maybe\" for \"-onetime\" flag: must be true or false\n"},
	} {
		var out, errb bytes.Buffer
		_, log, code := configure(tc.args, &out, &errb, envOf(nil))
		if log != nil || code != 2 || errb.String() != tc.want {
			t.Errorf("configure(%v): exit %d, stderr %q; want %q", tc.args, code, errb.String(), tc.want)
		}
	}
	// A value that looks like a flag is still a value, as with Go's flag.
	var out, errb bytes.Buffer
	c, log, _ := configure([]string{"-config-file", filepath.Join(t.TempDir(), "none.toml"), "-prefix", "-odd", "-onetime"}, &out, &errb, envOf(nil))
	if log != nil || c != nil {
		// the named config file is absent: only the flag parsing is under test
		t.Logf("configured: %+v", c)
	}
	if strings.Contains(errb.String(), "unknown flag") {
		t.Errorf("value -odd read as a flag: %s", errb.String())
	}
}

func TestNoopShowSecretsAndKeyringFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "confd.toml")
	if err := os.WriteFile(file, []byte("noop_show_secrets = true\nsecret_keyring = \"/etc/confd/ring.asc\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-noop-show-secrets", "-secret-keyring", "/etc/confd/ring.asc"},
		{"--noop-show-secrets", "--secret-keyring=/etc/confd/ring.asc"},
		{"-config-file", file},
	} {
		var out, errb bytes.Buffer
		c, log, code := configure(args, &out, &errb, envOf(nil))
		if log == nil {
			t.Fatalf("configure(%v): exit %d: %s", args, code, errb.String())
		}
		if !c.NoopShowSecrets || c.SecretKeyring != "/etc/confd/ring.asc" || strings.Contains(errb.String(), "ignored") {
			t.Errorf("configure(%v) = %+v; stderr %s", args, c, errb.String())
		}
	}
}

func TestConfigParseErrorNeverQuotesAPassword(t *testing.T) {
	file := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(file, []byte("backend = \"etcdv3\"\npassword = hunter2pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	_, log, code := configure([]string{"-config-file", file}, &out, &errb, envOf(nil))
	if log != nil || code != 2 || strings.Contains(errb.String(), "hunter") || !strings.Contains(errb.String(), file+":2:") || !strings.Contains(errb.String(), `"password"`) {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

// TestWaitFromFlagAndFile: -wait and confd.toml's wait read MIN[:MAX];
// a bad value names the flag or the file's key.
func TestWaitFromFlagAndFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "confd.toml")
	if err := os.WriteFile(file, []byte("wait = \"2s:10s\"\nresync = \"0\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	c, log, _ := configure([]string{"-config-file", file}, &out, &errb, envOf(nil))
	if log == nil || c.Wait.Min != 2*time.Second || c.Wait.Max != 10*time.Second || c.Resync != 0 {
		t.Fatalf("from file: %+v (%s)", c, errb.String())
	}
	c, log, _ = configure([]string{"-config-file", file, "-wait", "1s"}, &out, &errb, envOf(nil))
	if log == nil || c.Wait.Min != time.Second || c.Wait.Max != 4*time.Second || c.Resync != 0 {
		t.Fatalf("flag over file: %+v (%s)", c, errb.String())
	}
	c, _, _ = configure([]string{"-config-file", filepath.Join(dir, "none.toml")}, &out, &errb, envOf(nil))
	if c != nil && c.Resync != 10*time.Minute {
		t.Errorf("default -resync = %s", c.Resync)
	}
	for _, args := range [][]string{{"-wait", "10s:1s"}, {"-wait", "soon"}, {"-resync", "-1s"}} {
		errb.Reset()
		if _, log, code := configure(args, &out, &errb, envOf(nil)); log != nil || code != 2 || !strings.Contains(errb.String(), args[0][1:]) {
			t.Errorf("configure(%v): exit %d, stderr %q", args, code, errb.String())
		}
	}
	if err := os.WriteFile(file, []byte("wait = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if _, log, _ := configure([]string{"-config-file", file}, &out, &errb, envOf(nil)); log != nil || !strings.Contains(errb.String(), file) || !strings.Contains(errb.String(), "wait") {
		t.Errorf("bad wait in file: %q", errb.String())
	}
}

// TestExamplesWaitAndOrder: the shipped resources wait 2s:10s and load in
// the order the daemon processes them, flags file first, then the bundle whose reload restarts kube-apiserver.
func TestExamplesWaitAndOrder(t *testing.T) {
	rs, errs := resource.LoadNamed(&resource.Settings{ConfDir: filepath.Join("..", "..", "examples", "confd")}, nil)
	if len(errs) != 0 || len(rs) != 2 {
		t.Fatalf("examples: %d resources, errors %v", len(rs), errs)
	}
	for i, want := range []string{"10-apiserver-sa-flags.toml", "20-sa-bundle.toml"} {
		if filepath.Base(rs[i].Name()) != want {
			t.Errorf("resource %d = %s, want %s", i, rs[i].Name(), want)
		}
		if w, ok := rs[i].Quiescence(); !ok || w.Min != 2*time.Second || w.Max != 10*time.Second {
			t.Errorf("%s: wait %v, %v; want 2s:10s", want, w, ok)
		}
	}
}

// The confd.toml files shipped in examples/ (the Puppet template rendered
// with placeholder values) have only keys confd reads: since an unknown key
// stops confd, an example with one would stop every host that copied it.
func TestShippedConfdTomlKeysKnown(t *testing.T) {
	epp, err := os.ReadFile("../../examples/puppet/confd.toml.epp")
	if err != nil {
		t.Fatal(err)
	}
	// The parameter line goes; each <%= ... %> becomes a string (it sits
	// inside quotes) or, for the node list, one quoted node.
	rendered := regexp.MustCompile(`(?m)^<%-.*-%>\n`).ReplaceAll(epp, nil)
	rendered = regexp.MustCompile(`\[<%=.*?%>\]`).ReplaceAll(rendered, []byte(`["https://127.0.0.1:2379"]`))
	rendered = regexp.MustCompile(`<%=.*?%>`).ReplaceAll(rendered, []byte(`/etc/x`))
	dir := t.TempDir()
	files := map[string][]byte{"puppet": rendered}
	if files["confd"], err = os.ReadFile("../../examples/confd/confd.toml"); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		path := filepath.Join(dir, name+".toml")
		if err := os.WriteFile(path, body, 0o600); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		if _, log, code := configure([]string{"-config-file", path, "-onetime"}, &out, &errb, envOf(nil)); log == nil {
			t.Errorf("%s: exit %d:\n%s\n%s", name, code, errb.String(), body)
		} else if errb.Len() > 0 {
			t.Errorf("%s: warnings:\n%s", name, errb.String())
		}
	}
}
