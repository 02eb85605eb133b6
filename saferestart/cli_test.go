package saferestart

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/version"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
	"github.com/keysync/confd/saferestart/internal/restartcmd"
)

func env(m map[string]string) lookupEnv {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseSubcommandsAndCommand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		sub  string
		argv []string
	}{
		{nil, cmdRestart, restartcmd.DefaultCommand},
		{[]string{"restart"}, cmdRestart, restartcmd.DefaultCommand},
		{[]string{"--ttl", "3", "--", "sh", "-c", "echo hi"}, cmdRestart, []string{"sh", "-c", "echo hi"}},
		{[]string{"restart", "--", "true", "--flag"}, cmdRestart, []string{"true", "--flag"}},
		// confd's reload_cmd: the command may name a subcommand, and flags.
		{[]string{"--config", "", "--", "systemctl", "restart", "kube-apiserver.service"}, cmdRestart, []string{"systemctl", "restart", "kube-apiserver.service"}},
		{[]string{"--", "status", "--help"}, cmdRestart, []string{"status", "--help"}},
		{[]string{"--ignore-hold", "--", "status"}, cmdRestart, []string{"status"}},
		{[]string{"--ignore-hold", "rotate-key", "--", "status"}, cmdRotateKey, []string{"status"}},
		{[]string{"--lock-name", "x", "status"}, cmdStatus, nil},
		{[]string{"status", "-o", "json"}, cmdStatus, nil},
		{[]string{"hold", "--reason", "bad bundle"}, cmdHold, nil},
		{[]string{"unhold"}, cmdUnhold, nil},
		{[]string{"check", "--public-only", "a.pem", "b.pem"}, cmdCheck, []string{"a.pem", "b.pem"}},
		{[]string{"check", "a.pem", "--", "-odd.pem"}, cmdCheck, []string{"a.pem", "-odd.pem"}},
		{[]string{"version"}, cmdVersion, nil},
	} {
		o, _, err := parseArgs(tc.args, env(nil))
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if o.sub != tc.sub || !reflect.DeepEqual(o.argv(), tc.argv) {
			t.Errorf("%q: sub %q argv %q, want %q %q", tc.args, o.sub, o.argv(), tc.sub, tc.argv)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"systemctl", "restart", "x"},        // command without --
		{"restart", "extra"},                 // stray argument
		{"--"},                               // no command after --
		{"frobnicate"},                       // unknown subcommand
		{"hold"},                             // no reason
		{"status", "--reason", "x"},          // flag of another subcommand
		{"check"},                            // no files
		{"check", "--require-signing-keys"},  // no bundle to hold the keys
		{"--ttl", "0"},                       // bad values
		{"--attempts", "0"},                  //
		{"--lock-timeout", "0s"},             //
		{"--health-cert", "c"},               // without key
		{"--cert", "c"},                      // without key
		{"--output", "yaml", "status"},       //
		{"--lock-name", "a/", "status"},      //
		{"--no-such-flag"},                   //
		{"status", "--dial-timeout", "soon"}, //
		{"--health-settle", "3m"},            // settle = timeout: can never pass
		{"--health-settle", "2m", "--health-timeout", "1m"},
		{"--hold-key", "kube-apiserver-restart/h"}, // inside the lock's prefix
		{"--lock-name", "l", "--hold-key", "l/x", "status"},
		// The restart intents, under --hold-key/intent/, would be in the
		// lock's prefix, or its info prefix.
		{"--lock-name", "l", "--hold-key", "l", "status"},
		{"--lock-name", "l", "--hold-key", "l-info", "status"},
	} {
		_, _, err := parseArgs(args, env(nil))
		var ue *cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
		var out, errb bytes.Buffer
		if code := run(context.Background(), nil, args, &out, &errb); code != cmdkit.ExitUsage {
			t.Errorf("%q: run exit %d, want %d; stderr %s", args, code, cmdkit.ExitUsage, errb.String())
		}
	}
}

func TestEnvFallbackAndFlagPrecedence(t *testing.T) {
	e := env(map[string]string{
		"ETCDCTL_ENDPOINTS": "https://a:2379,https://b:2379", "ETCDCTL_CACERT": "/env/ca", "ETCDCTL_CERT": "/env/c",
		"ETCDCTL_KEY": "/env/k", "ETCDCTL_DIAL_TIMEOUT": "7s", "ETCDCTL_COMMAND_TIMEOUT": "9s",
	})
	o, _, err := parseArgs([]string{"status"}, e)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Endpoints, []string{"https://a:2379", "https://b:2379"}) || o.CACert != "/env/ca" ||
		o.Cert != "/env/c" || o.Key != "/env/k" || o.DialTimeout != 7*time.Second || o.CommandTimeout != 9*time.Second {
		t.Fatalf("env not applied: %+v", o)
	}
	o, _, err = parseArgs([]string{"status", "--endpoints", "x:1", "--endpoints", "y:2,z:3", "--cacert", "/f/ca",
		"--cert", "/f/c", "--key", "/f/k", "--dial-timeout", "1s", "--command-timeout", "2s"}, e)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(o.Endpoints, []string{"x:1", "y:2", "z:3"}) || o.CACert != "/f/ca" || o.Cert != "/f/c" ||
		o.Key != "/f/k" || o.DialTimeout != time.Second || o.CommandTimeout != 2*time.Second {
		t.Fatalf("flags must beat env: %+v", o)
	}
	o, _, _ = parseArgs([]string{"status"}, env(nil))
	if !reflect.DeepEqual(o.Endpoints, []string{"127.0.0.1:2379"}) {
		t.Fatalf("default endpoints %q", o.Endpoints)
	}
}

func TestDefaults(t *testing.T) {
	p, _, err := parseArgs(nil, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	o := restartOf(t, p)
	if o.LockName != "kube-apiserver-restart" || o.TTL != 10 || o.HoldKeyOrDefault() != "kube-apiserver-restart-hold" ||
		o.HealthURL != "https://127.0.0.1:6443/readyz" {
		t.Fatalf("defaults %+v", o)
	}
	p, _, _ = parseArgs([]string{"--health-url", "", "--hold-key", "/h"}, env(nil))
	if o = restartOf(t, p); o.HealthURL != "" || o.HoldKeyOrDefault() != "/h" {
		t.Fatalf("overrides %+v", o)
	}
}

func TestExitCodesDistinctAndDocumented(t *testing.T) {
	var help bytes.Buffer
	if code := run(context.Background(), nil, []string{"--help"}, &help, &bytes.Buffer{}); code != cmdkit.ExitOK {
		t.Fatalf("--help exit %d", code)
	}
	seen := map[int]bool{}
	for _, c := range exitCodeDocs {
		if seen[c.code] {
			t.Fatalf("exit code %d documented twice", c.code)
		}
		seen[c.code] = true
		if !strings.Contains(help.String(), fmt.Sprintf("  %d  %s", c.code, c.text)) {
			t.Errorf("exit code %d missing from --help", c.code)
		}
	}
	for _, c := range []int{cmdkit.ExitOK, cmdkit.ExitError, cmdkit.ExitUsage, cmdkit.ExitPreflight, cmdkit.ExitHold, cmdkit.ExitLockTimeout, cmdkit.ExitRestart, cmdkit.ExitHealth, cmdkit.ExitLeaseLost, cmdkit.ExitInterrupted, cmdkit.ExitStale} {
		if !seen[c] {
			t.Errorf("exit code %d not documented", c)
		}
	}
	if len(seen) != 11 {
		t.Errorf("%d documented codes, want 11", len(seen))
	}
	for _, word := range []string{"status", "hold --reason", "unhold", "check", "ETCDCTL_ENDPOINTS", "--lock-name", "--health-url", "--preflight-file"} {
		if !strings.Contains(help.String(), word) {
			t.Errorf("--help does not mention %s", word)
		}
	}
}

// version and --version (wherever it is before --, whatever else the line
// says) print the version, the commit and its date.
func TestVersion(t *testing.T) {
	want := cmdkit.ProgName + " " + version.Version + "\ncommit: " + version.Commit + "\ndate: " + version.Date + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"--endpoints", "x", "status", "--version"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), nil, args, &out, &errb); code != cmdkit.ExitOK || out.String() != want {
			t.Errorf("%q: %d %q %q, want %q", args, code, out.String(), errb.String(), want)
		}
	}
}

func TestKeySubcommandArgs(t *testing.T) {
	p, _, err := parseArgs([]string{"rotate-key", "--grace", "1h", "--ttl", "3", "--", "sh", "-c", "x"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	o := opts[*keycmd.RotateKey](t, p)
	if p.sub != cmdRotateKey || !reflect.DeepEqual(o.Argv, []string{"sh", "-c", "x"}) || o.SigningKey != cmdkit.DefaultSigningKey ||
		o.PublicKey != cmdkit.DefaultPublicKey || o.Algorithm != "rsa-2048" || o.Grace != time.Hour || o.TTL != 3 {
		t.Fatalf("rotate-key options: %+v", o)
	}
	p, _, err = parseArgs([]string{"rotate-key"}, env(nil))
	if err != nil || !reflect.DeepEqual(opts[*keycmd.RotateKey](t, p).Argv, restartcmd.DefaultCommand) || opts[*keycmd.RotateKey](t, p).Grace != 24*time.Hour {
		t.Fatalf("rotate-key defaults: %+v %v", p, err)
	}
	p, _, err = parseArgs([]string{"wait-trusted", "--public-key", "f", "--exclude-host", "a", "--exclude-host", "b"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if w := opts[*keycmd.WaitTrusted](t, p); w.Timeout != 15*time.Minute || !reflect.DeepEqual(w.ExcludeHosts, []string{"a", "b"}) {
		t.Fatalf("wait-trusted: %+v %v", w, err)
	}
	for _, args := range [][]string{
		{"wait-trusted"}, // no --public-key
		{"wait-trusted", "--public-key", "f", "--timeout", "0s"},
		{"rotate-key", "--algorithm", "dsa"},
		{"rotate-key", "--grace", "-1h"},
		{"trust", "--grace", "1h"}, // flag of another subcommand
		{"retire-keys", "--", "x"}, // no command
		{"trust", "--keys-prefix", "/a", "--trust-prefix", "/a/"},
		{"status", "--public-key", "f"},
		{"restart", "--host", "a/b"},
	} {
		_, _, err := parseArgs(args, env(nil))
		var ue *cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
}

// ETCDCTL_USER is name:password, or a name with ETCDCTL_PASSWORD, as etcdctl
// takes it; --user/--password beat them.
func TestUserAndPassword(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		args     []string
		user, pw string
		usage    bool
	}{
		{env: map[string]string{"ETCDCTL_USER": "root:p:w"}, user: "root", pw: "p:w"},
		{env: map[string]string{"ETCDCTL_USER": "root", "ETCDCTL_PASSWORD": "pw"}, user: "root", pw: "pw"},
		{env: map[string]string{"ETCDCTL_USER": "a:b"}, args: []string{"--user", "op", "--password", "x"}, user: "op", pw: "x"},
		{args: []string{"--user", "op:x"}, user: "op", pw: "x"},
		{env: map[string]string{"ETCDCTL_USER": "root"}, usage: true},
		{env: map[string]string{"ETCDCTL_PASSWORD": "pw"}, usage: true},
		{},
	} {
		o, _, err := parseArgs(append([]string{"status"}, tc.args...), env(tc.env))
		if tc.usage {
			var ue *cli.UsageError
			if !errors.As(err, &ue) || strings.Contains(err.Error(), "pw") {
				t.Errorf("%v %q: err = %v, want a usage error without the password", tc.env, tc.args, err)
			}
			continue
		}
		if err != nil || o.User != tc.user || o.Password != tc.pw {
			t.Errorf("%v %q: %v user %q password %q", tc.env, tc.args, err, o.User, o.Password)
		}
	}
}

// TestHoldReasonWithKeyIsRefused: `hold --reason "$(cat k.key)"` stores
// nothing (it is a usage error, before etcd is dialled) and prints no key.
func TestHoldReasonWithKeyIsRefused(t *testing.T) {
	keyPEM := string(keytest.SEC1PEM(t, keytest.EC(t)))
	b, _ := pem.Decode([]byte(keyPEM))
	body := base64.StdEncoding.EncodeToString(b.Bytes)
	for _, reason := range []string{keyPEM, "bad key: " + body, base64.StdEncoding.EncodeToString([]byte("#\n" + keyPEM))} {
		var out, errb bytes.Buffer
		code := run(context.Background(), nil, []string{"hold", "--reason", reason, "--endpoints", "http://127.0.0.1:1"}, &out, &errb)
		if code != cmdkit.ExitUsage {
			t.Errorf("exit %d, want %d; stderr %s", code, cmdkit.ExitUsage, errb.String())
		}
		if strings.Contains(out.String()+errb.String(), body[10:30]) || !strings.Contains(errb.String(), "--reason holds private key material") {
			t.Errorf("output: %s / %s", out.String(), errb.String())
		}
	}
}
