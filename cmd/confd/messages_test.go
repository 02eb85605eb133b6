package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/logfmt"
)

// -onetime with nothing to process exits 2, as -watch does, saying what is
// missing and what to do (confd 0.16: exit 0 with a warning, or nothing).
func TestOnetimeNothingToProcessExits2(t *testing.T) {
	for name, tc := range map[string]struct {
		mkdir bool
		want  string
	}{
		"missing conf.d": {false, "conf.d does not exist; create it and put template resources (*.toml) in it, or point -confdir"},
		"empty conf.d":   {true, "conf.d holds no template resource (*.toml); add one, or point -confdir"},
	} {
		dir := t.TempDir()
		if tc.mkdir {
			if err := os.Mkdir(filepath.Join(dir, "conf.d"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var out, errb bytes.Buffer
		cfg := filepath.Join(dir, "confd.toml")
		if err := os.WriteFile(cfg, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		code := run(make(chan os.Signal), []string{"-onetime", "-backend", "env", "-confdir", dir, "-config-file", cfg}, &out, &errb, envOf(nil))
		if code != exitUsage || !strings.Contains(errb.String(), "ERROR nothing to process: "+filepath.Join(dir, "conf.d")) || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%s: exit %d, want %d:\n%s", name, code, exitUsage, errb.String())
		}
	}
}

// SIGHUP with a confd.toml that no longer parses re-reads nothing, and
// says so, rather than "keeping the running one" and then re-reading.
func TestSighupBrokenConfigKeepsEverything(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "confd.toml")
	if err := os.WriteFile(cfg, []byte("backend = \"env\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logb, errb bytes.Buffer
	args := []string{"-config-file", cfg, "-confdir", dir}
	c, _, code := configure(args, &bytes.Buffer{}, &errb, envOf(nil))
	if c == nil {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	log, _ := logfmt.New(&logb, "", "text", false)
	l := &resourceLoader{log: log, args: args, stderr: &errb, getenv: envOf(nil), cfg: c}
	if err := os.WriteFile(cfg, []byte("backend = \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := l.reload(true)
	if !p.Keep || len(p.Procs) != 0 {
		t.Errorf("plan %+v, want Keep", p)
	}
	msg := logb.String()
	if !strings.Contains(msg, "SIGHUP: "+cfg+" is unusable (error above): nothing was re-read; confd goes on with the configuration and resources it had. Fix the file") ||
		strings.Contains(msg, "keeping the running one") {
		t.Errorf("log:\n%s", msg)
	}
}

// -onetime's stop message says what happens: the command gets SIGTERM now.
func TestStoppingMessage(t *testing.T) {
	once := stoppingMessage(&Config{OneTime: true, CommandGrace: 7 * time.Second}, syscall.SIGTERM)
	if !strings.Contains(once, "gets SIGTERM now and SIGKILL after -command-grace (7s)") || strings.Contains(once, "may finish") {
		t.Errorf("-onetime: %q", once)
	}
	daemon := stoppingMessage(&Config{}, syscall.SIGTERM)
	if !strings.Contains(daemon, "a running command may finish") {
		t.Errorf("daemon: %q", daemon)
	}
}

// An expired client certificate at start: confd exits, so the message
// must not promise a re-read "on the next connection".
func TestStartErrorExpiredCertificate(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	err := fmt.Errorf("etcd https://10.0.0.1:2379: %w", &etcdclient.ExpiredError{File: "/etc/confd/client.crt", NotAfter: at})
	msg := startError("etcdv3", err)
	if strings.Contains(msg, "next connection") ||
		msg != "backend etcdv3: cannot start: client certificate /etc/confd/client.crt expired at 2026-01-02T03:04:05Z, and etcd refuses it. Renew the certificate (and its key) on disk, then start confd again; a running confd picks up a renewed certificate by itself" {
		t.Errorf("message %q", msg)
	}
}

// One readable journal: a command learns the resource it runs for
// (CONFD_RESOURCE), and its printable output line is logged as it is, so
// that a helper's own log line is one plain line under confd's prefix; a
// line with control characters is still quoted. JSON stays valid JSON.
func TestChildOutputLoggedPlain(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		dir := t.TempDir()
		out := t.TempDir()
		for _, d := range []string{"conf.d", "templates"} {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		res := filepath.Join(dir, "conf.d", "app.toml")
		reload := `echo "for $CONFD_RESOURCE"; echo 'kube-apiserver-safe-restart[7]: INFO restart command started lock=x'; printf 'bell\a\n'`
		toml := fmt.Sprintf("[template]\nsrc = \"app.tmpl\"\ndest = %q\nkeys = [\"/path\"]\nreload_cmd = %q\n", filepath.Join(out, "app"), reload)
		if err := os.WriteFile(res, []byte(toml), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "templates", "app.tmpl"), []byte("{{getv \"/path\"}}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, "confd.toml")
		if err := os.WriteFile(cfg, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, errb bytes.Buffer
		code := run(make(chan os.Signal), []string{"-onetime", "-backend", "env", "-confdir", dir, "-config-file", cfg, "-log-format", format}, &stdout, &errb, envOf(nil))
		if code != 0 {
			t.Fatalf("%s: exit %d:\n%s", format, code, errb.String())
		}
		log := errb.String()
		switch format {
		case "text":
			for _, want := range []string{
				"INFO reload_cmd output: for " + res + " resource=" + res + "\n",
				"INFO reload_cmd output: kube-apiserver-safe-restart[7]: INFO restart command started lock=x resource=" + res + "\n",
				`INFO reload_cmd output: "bell\a" resource=`,
			} {
				if !strings.Contains(log, want) {
					t.Errorf("text log lacks %q:\n%s", want, log)
				}
			}
		case "json":
			for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(l), &rec); err != nil {
					t.Errorf("not JSON: %q", l)
				}
			}
			if !strings.Contains(log, `"msg":"reload_cmd output: kube-apiserver-safe-restart[7]: INFO restart command started lock=x"`) {
				t.Errorf("json log:\n%s", log)
			}
		}
	}
}

// Of several durations that are not positive, the error names the first in
// --help's order, at every run: a flag table kept in a map named a random one.
func TestBadDurationsNamedInHelpOrder(t *testing.T) {
	args := []string{"-backend", "env", "-watch-stall-timeout", "0s", "-request-timeout", "-1s", "-dial-timeout", "0s", "-reload-cmd-timeout", "0s"}
	for range 20 {
		var out, errb bytes.Buffer
		_, log, code := configure(args, &out, &errb, envOf(nil))
		if log != nil || code != 2 || !strings.Contains(errb.String(), "-dial-timeout must be positive") {
			t.Fatalf("configure(%v): exit %d, stderr %q, want exit 2 naming -dial-timeout", args, code, errb.String())
		}
	}
}
