package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestParseValuesAndLines(t *testing.T) {
	src := `# a comment
endpoints = [
  "https://a:2379",  # [not a table]
  "https://b:2379",
]
"health-url" = "https://127.0.0.1:6443/readyz"
ttl = 15
ignore-hold = true
lock-timeout = "2m"
preflight-file = "/one.pem"
socket = "/run/s/signer.sock"
`
	f, err := Parse("/etc/x.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		line  int
		items []string
	}{
		"endpoints":      {2, []string{"https://a:2379", "https://b:2379"}},
		"health-url":     {6, []string{"https://127.0.0.1:6443/readyz"}},
		"ttl":            {7, []string{"15"}},
		"ignore-hold":    {8, []string{"true"}},
		"lock-timeout":   {9, []string{"2m"}},
		"preflight-file": {10, []string{"/one.pem"}},
		"socket":         {11, []string{"/run/s/signer.sock"}},
	} {
		v := f.Values[name]
		if v.Line != want.line || !reflect.DeepEqual(v.Items, want.items) {
			t.Errorf("%s = line %d %q, want line %d %q", name, v.Line, v.Items, want.line, want.items)
		}
	}
	if got := f.Where("ttl"); got != "/etc/x.toml:7" {
		t.Errorf("Where(ttl) = %q", got)
	}
	if got := f.Where("cacert"); got != "" {
		t.Errorf("Where(cacert), not set = %q", got)
	}
}

// Every problem is reported, each with file and line; unknown keys get a
// suggestion; no value is quoted for a secret's type error.
func TestParseErrors(t *testing.T) {
	src := `endpoint = ["x"]
health_url = "u"
ttl = "10"
lock-timeout = "soon"
endpoints = [1]
dry-run = true
frobnicate = 1
password = 12345

[etcd]
cacert = "x"
`
	_, err := Parse("/etc/s.toml", []byte(src))
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	for _, want := range []string{
		`/etc/s.toml:1: unknown key "endpoint"; did you mean "endpoints"?`,
		`/etc/s.toml:2: unknown key "health_url"; did you mean "health-url"?`,
		`/etc/s.toml:3: ttl: want an integer, got a TOML string`,
		`/etc/s.toml:4: lock-timeout: "soon" is not a duration`,
		`/etc/s.toml:5: endpoints: element 1: want a string, got a TOML integer`,
		`/etc/s.toml:6: unknown key "dry-run" (a command-line choice`,
		`/etc/s.toml:7: unknown key "frobnicate"`,
		`/etc/s.toml:8: password: want a string, got a TOML integer`,
		`/etc/s.toml:10: unknown key "etcd" (the file is flat`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "12345") {
		t.Errorf("error quotes the password:\n%s", msg)
	}
	if _, err := Parse("/etc/s.toml", []byte("ttl = \n")); err == nil || !strings.Contains(err.Error(), "/etc/s.toml:1:") {
		t.Errorf("syntax error = %v, want file:line", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.toml")); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Errorf("missing file: %v", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

// The command line beats the file, lists included (replaced, not
// appended); flags the binary lacks and keys the subcommand does not use
// are left alone; what the file sets is not "changed".
func TestApply(t *testing.T) {
	f, err := Parse("/c.toml", []byte(`endpoints = ["https://a:1", "https://b:2"]
jwks-key-file = ["/f1", "/f2"]
preflight-file = ["/p1"]
ttl = 30
lock-timeout = "1m"
socket = "/run/x.sock"
`))
	if err != nil {
		t.Fatal(err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	eps := fs.StringSlice("endpoints", []string{"127.0.0.1:2379"}, "")
	jwks := fs.StringArray("jwks-key-file", nil, "")
	pre := fs.StringArray("preflight-file", nil, "")
	ttl := fs.Int("ttl", 10, "")
	lt := fs.Duration("lock-timeout", time.Minute*10, "")
	if err := fs.Parse([]string{"--jwks-key-file", "/cmd"}); err != nil {
		t.Fatal(err)
	}
	set, err := f.Apply(fs, func(name string) bool { return name != "preflight-file" })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*eps, []string{"https://a:1", "https://b:2"}) || !reflect.DeepEqual(*jwks, []string{"/cmd"}) ||
		*pre != nil || *ttl != 30 || *lt != time.Minute {
		t.Fatalf("applied: endpoints %q jwks %q preflight %q ttl %d lock-timeout %s", *eps, *jwks, *pre, *ttl, *lt)
	}
	if want := []string{"endpoints", "ttl", "lock-timeout"}; !reflect.DeepEqual(set, want) {
		t.Errorf("set %q, want %q", set, want)
	}
	if fs.Changed("endpoints") || fs.Changed("ttl") {
		t.Error("file values must not count as given on the command line")
	}
}

func TestMask(t *testing.T) {
	pw, _ := Lookup("password")
	user, _ := Lookup("user")
	ca, _ := Lookup("cacert")
	for _, tc := range []struct {
		k    Key
		in   string
		want string
	}{
		{pw, "s3cret", "****"}, {pw, "", ""}, {user, "root:s3cret", "root:****"}, {user, "root", "root"}, {ca, "/ca.crt", "/ca.crt"},
	} {
		if got := Mask(tc.k, tc.in); got != tc.want {
			t.Errorf("Mask(%s, %q) = %q, want %q", tc.k.Name, tc.in, got, tc.want)
		}
	}
}

func TestKeysUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range Keys {
		if seen[k.Name] {
			t.Errorf("key %s listed twice", k.Name)
		}
		seen[k.Name] = true
	}
	for _, n := range CommandLineOnly {
		if seen[n] {
			t.Errorf("%s is both a key and command-line only", n)
		}
	}
}
