package rehearsal

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// `make install` puts both binaries under $(DESTDIR)$(PREFIX)/bin, every
// unit under $(DESTDIR)$(SYSTEMDDIR) and the example confdir and
// safe-restart.toml under $(DESTDIR)$(PREFIX)/share/keysync, every
// /usr/local/bin path in them pointed at PREFIX; it writes nothing to
// /etc/confd or /etc/kubernetes, and no installed file names /usr/local/bin.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	dest := t.TempDir()
	cmd := exec.Command("make", "install", "DESTDIR="+dest, "PREFIX=/usr")
	cmd.Dir = etcdtest.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, b := range []string{"confd", "kube-apiserver-safe-restart"} {
		fi, err := os.Stat(filepath.Join(dest, "usr/bin", b))
		if err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s not installed as an executable: %v", b, err)
		}
	}
	ex := filepath.Join(etcdtest.RepoRoot(), "examples")
	want := map[string]string{} // installed path -> example path
	for pattern, dir := range map[string]string{
		"systemd/*.*": "etc/systemd/system", "systemd/*.service.d/*.conf": "etc/systemd/system",
		"confd/confd.toml": "usr/share/keysync/confd", "confd/conf.d/*.toml": "usr/share/keysync/confd",
		"confd/templates/*.tmpl": "usr/share/keysync/confd", "safe-restart.toml": "usr/share/keysync",
	} {
		matches, _ := filepath.Glob(filepath.Join(ex, pattern))
		if len(matches) == 0 {
			t.Fatalf("no example matches %s", pattern)
		}
		for _, m := range matches {
			if fi, err := os.Stat(m); err != nil || fi.IsDir() {
				continue
			}
			rel, _ := filepath.Rel(ex, m)
			base := strings.SplitN(filepath.ToSlash(rel), "/", 2)
			inst := filepath.Join(dest, dir, rel)
			if base[0] == "systemd" || base[0] == "confd" {
				inst = filepath.Join(dest, dir, base[1])
			}
			want[inst] = m
		}
	}
	for inst, src := range want {
		got, err := os.ReadFile(inst)
		if err != nil {
			t.Errorf("%s not installed: %v", src, err)
			continue
		}
		orig, _ := os.ReadFile(src)
		if w := strings.ReplaceAll(string(orig), "/usr/local/bin/", "/usr/bin/"); string(got) != w {
			t.Errorf("%s installed as:\n%s\nwant:\n%s", inst, got, w)
		}
	}
	err := filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dest, p)
		if strings.HasPrefix(rel, "etc/confd") || strings.HasPrefix(rel, "etc/kubernetes") {
			t.Errorf("make install wrote %s: the site's configuration is never written", rel)
		}
		if strings.HasPrefix(rel, "usr/bin/") {
			return nil // the binaries
		}
		if data, _ := os.ReadFile(p); strings.Contains(string(data), "/usr/local/bin") {
			t.Errorf("installed %s still names /usr/local/bin", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Nothing in the examples needs etcdctl, and every command of
// kube-apiserver-safe-restart in them reads the one configuration file
// (the check_cmd, which needs no etcd and no setting, aside).
func TestExamplesUseTheConfigFile(t *testing.T) {
	cmd := regexp.MustCompile(`kube-apiserver-safe-restart( [a-z-]+)?`)
	for rel, text := range exampleFiles(t) {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") {
				continue
			}
			if strings.Contains(line, "etcdctl") || strings.Contains(line, "ETCDCTL_") {
				t.Errorf("%s still needs etcdctl or its environment: %s", rel, line)
			}
			if strings.HasPrefix(rel, "puppet/") || !strings.Contains(line, "/usr/local/bin/kube-apiserver-safe-restart") {
				continue
			}
			if m := cmd.FindStringSubmatch(line); m != nil && m[1] == " check" {
				continue
			}
			if !strings.Contains(line, "--config /etc/kubernetes/safe-restart.toml") {
				t.Errorf("%s: runs the helper without the configuration file: %s", rel, line)
			}
		}
	}
}

// The Puppet class writes the shipped safe-restart.toml with its own etcd
// settings: with the example's, the template gives the example byte for
// byte.
func TestPuppetConfigIsTheExample(t *testing.T) {
	files := exampleFiles(t)
	epp := files["puppet/safe-restart.toml.epp"]
	header, body, ok := strings.Cut(epp, "\n")
	if !ok || !strings.HasPrefix(header, "<%- |") {
		t.Fatalf("safe-restart.toml.epp has no parameter header")
	}
	body = strings.Replace(body, "# Managed by Puppet (sa_key_sync), from examples/safe-restart.toml.\n", "", 1)
	body = strings.NewReplacer(
		`<%= $nodes.map |$n| { "\"${n}\"" }.join(', ') %>`, `"https://127.0.0.1:2379"`,
		`<%= $ca %>`, "/etc/kubernetes/pki/etcd/ca.crt",
		`<%= $cert %>`, "/etc/kubernetes/pki/apiserver-etcd-client.crt",
		`<%= $key %>`, "/etc/kubernetes/pki/apiserver-etcd-client.key").Replace(body)
	if body != files["safe-restart.toml"] {
		t.Errorf("safe-restart.toml.epp with the example's etcd settings:\n%s\nwant examples/safe-restart.toml:\n%s", body, files["safe-restart.toml"])
	}
	if !strings.Contains(files["puppet/sa_key_sync.pp"], "'/etc/kubernetes/safe-restart.toml'") {
		t.Error("sa_key_sync.pp does not write /etc/kubernetes/safe-restart.toml")
	}
}

// The Puppet class ships every example file the rehearsal runs, installs
// both binaries, and enables confd and both publisher units.
func TestPuppetClassShipsAndEnablesEverything(t *testing.T) {
	files := exampleFiles(t)
	pp := files["puppet/sa_key_sync.pp"]
	names := func(dir string) []string {
		var out []string
		for rel := range files {
			if filepath.Dir(rel) == dir {
				out = append(out, filepath.Base(rel))
			}
		}
		sort.Strings(out)
		return out
	}
	for _, dir := range []string{"confd/conf.d", "confd/templates", "systemd", "systemd/kube-apiserver.service.d"} {
		for _, n := range names(dir) {
			if !strings.Contains(pp, "'"+n+"'") {
				t.Errorf("sa_key_sync.pp does not install %s/%s", dir, n)
			}
		}
	}
	for _, want := range []string{
		`"/usr/local/bin/${b}"`, `['confd', 'kube-apiserver-safe-restart']`,
	} {
		if !strings.Contains(pp, want) {
			t.Errorf("sa_key_sync.pp lacks %s", want)
		}
	}
	for _, svc := range []string{"confd", "sa-key-publish.path", "sa-key-publish.service", "sa-key-retire.timer"} {
		re := regexp.MustCompile(`service \{ '` + regexp.QuoteMeta(svc) + `':[^}]*enable\s*=>\s*true`)
		if !re.MatchString(pp) {
			t.Errorf("sa_key_sync.pp does not enable %s", svc)
		}
	}
	// Every unit Puppet enables can be enabled: it has an [Install] section.
	for _, u := range []string{"confd.service", "sa-key-publish.path", "sa-key-publish.service"} {
		if !strings.Contains(files["systemd/"+u], "[Install]\nWantedBy=multi-user.target") {
			t.Errorf("%s has no [Install] WantedBy=multi-user.target", u)
		}
	}
}
