package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	kvstore "github.com/keysync/confd/store"

	"github.com/keysync/confd/template"
)

// deadStore is a TCP listener on 127.0.0.1 that counts connections: given
// as -node, it shows whether a mode contacted the store at all.
func deadStore(t *testing.T) (url string, contacts *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	contacts = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			contacts.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return "http://" + ln.Addr().String(), contacts
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// mixedConfdir has one good resource, one in a sub-directory and one
// broken, with confd.toml pointing at a store.
func mixedConfdir(t *testing.T, node string) (dir, out string) {
	t.Helper()
	dir, out = t.TempDir(), t.TempDir()
	writeFiles(t, dir, map[string]string{
		"confd.toml":          "backend = \"etcdv3\"\nnodes = [\"" + node + "\"]\nwatch = true\n",
		"conf.d/good.toml":    "[template]\nsrc = \"v.tmpl\"\ndest = \"" + filepath.Join(out, "good") + "\"\nkeys = [\"/v\"]\n",
		"conf.d/sub/two.toml": "[template]\nsrc = \"v.tmpl\"\ndest = \"" + filepath.Join(out, "two") + "\"\nkeys = [\"/v\"]\n",
		"conf.d/broken.toml":  "[template]\nsrc = \"nope.tmpl\"\ndest = \"/x\"\n",
		"templates/v.tmpl":    "v={{getv \"/v\"}}\n",
		"mock.yaml":           "v: one\n",
	})
	return dir, out
}

func runConfd(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(nil, args, &out, &errb, envOf(nil))
	return code, out.String(), errb.String()
}

func TestCheckConfigContactsNoStore(t *testing.T) {
	node, contacts := deadStore(t)
	dir, _ := mixedConfdir(t, node)
	cfg := filepath.Join(dir, "confd.toml")
	for _, spelling := range []string{"-check-config", "--check-config"} {
		code, out, errs := runConfd(spelling, "-config-file", cfg, "-confdir", dir, "-dial-timeout", "100ms")
		if code != 1 || !strings.Contains(out, filepath.Join(dir, "conf.d/broken.toml")+":2: template.src") {
			t.Errorf("%s: exit %d:\n%s%s", spelling, code, out, errs)
		}
		code, out, errs = runConfd(spelling, "-config-file", cfg, "-confdir", dir, "-resource", "good", "--resource=sub/two.toml")
		if code != 0 || !strings.Contains(out, "OK: 2 resource(s), 1 template(s)") {
			t.Errorf("%s -resource: exit %d:\n%s%s", spelling, code, out, errs)
		}
	}
	// confd.toml's own problems are reported with their lines.
	writeFiles(t, dir, map[string]string{"confd.toml": "backend = \"etcdv3\"\ncolour = \"blue\"\ninterval = \"often\"\nauth_token = \"x\"\n"})
	code, out, errs := runConfd("-check-config", "-config-file", cfg, "-confdir", dir, "-resource", "good")
	for _, w := range []string{cfg + `:2: unknown key "colour": not a confd.toml key`, cfg + `:3: key "interval"`, cfg + `:4: key "auth_token" is used by no backend`} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s%s", w, out, errs)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if n := contacts.Load(); n != 0 {
		t.Errorf("-check-config connected to the store %d times", n)
	}
}

// A kubeadm master's confdir is examples/kubeadm/confd alone, copied whole
// to /etc/confd (docs/kubeadm.md): its confd.toml, resource and template
// pass -check-config with nothing from examples/confd.
func TestCheckConfigKubeadmExample(t *testing.T) {
	dir := filepath.Join("..", "..", "examples", "kubeadm", "confd")
	code, out, errs := runConfd("-check-config", "-confdir", dir, "-config-file", filepath.Join(dir, "confd.toml"))
	if code != 0 || !strings.Contains(out, "OK: 1 resource(s), 1 template(s)") {
		t.Errorf("confd -check-config -confdir examples/kubeadm/confd: exit %d:\n%s%s", code, out, errs)
	}
}

func TestValidateFromMockData(t *testing.T) {
	node, contacts := deadStore(t)
	dir, out := mixedConfdir(t, node)
	mock := filepath.Join(dir, "mock.yaml")
	code, stdout, errs := runConfd("--validate", "--mock-data", mock, "-config-file", filepath.Join(dir, "confd.toml"), "-confdir", dir, "-resource", "good")
	if code != 0 || stdout != "==> "+filepath.Join(out, "good")+" (good.toml) <==\nv=one\n" {
		t.Errorf("exit %d, stdout %q\n%s", code, stdout, errs)
	}
	// Without -resource the broken resource fails the run, the others still render.
	code, stdout, _ = runConfd("-validate", "-mock-data="+mock, "-config-file", filepath.Join(dir, "confd.toml"), "-confdir", dir)
	if code != 1 || strings.Count(stdout, "v=one") != 2 {
		t.Errorf("mixed: exit %d, stdout %q", code, stdout)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("-validate wrote %d files", len(entries))
	}
	if n := contacts.Load(); n != 0 {
		t.Errorf("-validate connected to the store %d times", n)
	}
	for _, args := range [][]string{{"-validate"}, {"-mock-data", mock}, {"-validate", "-check-config", "-mock-data", mock}} {
		if code, _, errs := runConfd(append(args, "-config-file", filepath.Join(dir, "confd.toml"), "-confdir", dir)...); code != 2 || errs == "" {
			t.Errorf("%v: exit %d, want 2 with a reason", args, code)
		}
	}
}

// -resource limits -onetime too: the broken neighbour is not even read.
func TestResourceLimitsOnetime(t *testing.T) {
	dir, out := mixedConfdir(t, "http://127.0.0.1:1")
	common := []string{"-onetime", "-backend", "file", "-file", filepath.Join(dir, "mock.yaml"), "-confdir", dir}
	code, _, errs := runConfd(append(common, "-resource", "good")...)
	if code != 0 {
		t.Fatalf("-resource good: exit %d\n%s", code, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "good")); string(b) != "v=one\n" {
		t.Errorf("good = %q", b)
	}
	if _, err := os.Stat(filepath.Join(out, "two")); !os.IsNotExist(err) {
		t.Errorf("a resource not named was processed")
	}
	if code, _, errs := runConfd(append(common, "-resource", "missing")...); code != 1 || !strings.Contains(errs, "-resource missing") {
		t.Errorf("-resource missing: exit %d\n%s", code, errs)
	}
	if code, _, _ := runConfd(common...); code != 1 {
		t.Errorf("all resources, one broken: exit %d, want 1", code)
	}
}

func TestHelpDocumentsAuthoringFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if _, log, code := configure([]string{"--help"}, &out, &errb, envOf(nil)); log != nil || code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"--check-config", "--validate", "--mock-data string", "--resource stringArray"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

// The template author's page lists every template function with a line.
func TestTemplateAuthorsPageListsEveryFunction(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "template-authors.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for name := range template.FuncMap(kvstore.New(nil)) {
		if !regexp.MustCompile("\\| `(" + `[a-zA-Z0-9 ,` + "`" + `]*\b)?` + regexp.QuoteMeta(name) + "\\b").MatchString(page) {
			t.Errorf("the template author's page has no table row for %s", name)
		}
	}
	for _, flag := range []string{"-check-config", "-validate -mock-data FILE", "-resource NAME"} {
		if !strings.Contains(page, "`"+flag+"`") {
			t.Errorf("the template author's page lacks %s", flag)
		}
	}
}

// The template author's page shows -check-config on a copy of
// examples/confd with three typos, and the run that stops at confd.toml's:
// the page must say what confd prints (issue 33 found it did not).
func TestTemplateAuthorsPageSampleOutput(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "docs", "template-authors.md"))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "broken")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join("..", "..", "examples", "confd"))); err != nil {
		t.Fatal(err)
	}
	edit := func(name, old, new string) {
		p := filepath.Join(dir, name)
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(old)) {
			t.Fatalf("%s lacks %q (%v): update the page's sample with the example", name, old, err)
		}
		if err := os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFiles(t, dir, map[string]string{"confd.toml": "backend = \"etcdv3\"\nwatchh = true\n"})
	edit("conf.d/20-sa-bundle.toml", "\ncheck_cmd_timeout", "\ncheck_cmd_tmeout")
	edit("templates/apiserver-sa.env.tmpl", "{{join ", "{{joinn ")
	cfg := filepath.Join(dir, "confd.toml")
	asOnPage := func(s string) string { return strings.ReplaceAll(s, dir+string(filepath.Separator), "broken/") }
	code, out, errs := runConfd("-check-config", "-confdir", dir, "-config-file", cfg)
	if code != 1 {
		t.Errorf("-check-config: exit %d, want 1:\n%s%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(asOnPage(out)), "\n")
	if len(lines) != 4 {
		t.Errorf("-check-config printed %d lines, want 3 problems and the count:\n%s", len(lines), out)
	}
	for _, l := range lines {
		if !bytes.Contains(page, []byte("\n"+l+"\n")) {
			t.Errorf("the page lacks the line confd prints:\n%s", l)
		}
	}
	code, _, errs = runConfd("-onetime", "-confdir", dir, "-config-file", cfg)
	_, msg, _ := strings.Cut(strings.TrimSpace(asOnPage(errs)), "ERROR ")
	if code != 2 || msg == "" || strings.Contains(msg, "\n") || !bytes.Contains(page, []byte(": ERROR "+msg+"\n")) {
		t.Errorf("-onetime: exit %d (want 2), the page lacks the one error confd logs:\n%s", code, errs)
	}
}
