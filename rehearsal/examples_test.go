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

// `make install` puts both binaries under $(DESTDIR)$(PREFIX)/bin and every
// unit under $(DESTDIR)$(SYSTEMDDIR), with the units' binary paths pointed
// at PREFIX.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	dest := t.TempDir()
	cmd := exec.Command("make", "install", "DESTDIR="+dest, "PREFIX=/opt/keysync", "SYSTEMDDIR=/lib/systemd/system")
	cmd.Dir = etcdtest.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	for _, b := range []string{"confd", "kube-apiserver-safe-restart"} {
		fi, err := os.Stat(filepath.Join(dest, "opt/keysync/bin", b))
		if err != nil || fi.Mode()&0o111 == 0 {
			t.Errorf("%s not installed as an executable: %v", b, err)
		}
	}
	units, _ := filepath.Glob(filepath.Join(etcdtest.RepoRoot(), "examples/systemd/*.*"))
	dropIns, _ := filepath.Glob(filepath.Join(etcdtest.RepoRoot(), "examples/systemd/*.service.d/*.conf"))
	if len(units) == 0 || len(dropIns) == 0 {
		t.Fatal("no example units or drop-ins")
	}
	for _, u := range append(units, dropIns...) {
		if fi, err := os.Stat(u); err != nil || fi.IsDir() {
			continue
		}
		rel, _ := filepath.Rel(filepath.Join(etcdtest.RepoRoot(), "examples/systemd"), u)
		got, err := os.ReadFile(filepath.Join(dest, "lib/systemd/system", rel))
		if err != nil {
			t.Errorf("unit not installed: %v", err)
			continue
		}
		orig, _ := os.ReadFile(u)
		if want := strings.ReplaceAll(string(orig), "/usr/local/bin/", "/opt/keysync/bin/"); string(got) != want {
			t.Errorf("%s installed as:\n%s\nwant:\n%s", filepath.Base(u), got, want)
		}
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
