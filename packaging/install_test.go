package packaging

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/toolbin"
)

// The units each kind of master runs from systemd's unit path, as paths
// under examples/: the publisher, the retirement timer and the signer are
// both kinds'; the rest belong to one kind, and the other must not run
// them.
var (
	sharedUnits = []string{
		"systemd/sa-key-publish.service",
		"systemd/sa-key-retire.service", "systemd/sa-key-retire.timer",
		"systemd/kube-apiserver-sa-signer.service",
	}
	kindUnits = map[string][]string{
		"binary":  {"systemd/confd.service", "systemd/kube-apiserver-safe-restart.service"},
		"kubeadm": {"kubeadm/systemd/confd.service", "kubeadm/systemd/sa-signing-key.service"},
	}
	binaries = []string{"confd", "kube-apiserver-safe-restart", "kube-apiserver-sa-signer"}
)

// systemd's unit path (systemd.unit(5)), relative to /: a drop-in or an
// enable link anywhere under one arms a unit.
var unitPaths = []string{
	"etc/systemd/system", "run/systemd/system", "usr/local/lib/systemd/system",
	"usr/lib/systemd/system", "lib/systemd/system",
}

// fakeBin is a directory of stand-ins for the three binaries: install.sh
// copies whatever it is given, and building the real ones is make dist's
// test.
func fakeBin(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(dir, b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// makeInstall runs `make install-files` (make install without its build)
// with the given variables.
func makeInstall(t *testing.T, vars ...string) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	cmd := exec.Command("make", append([]string{"-s", "install-files"}, vars...)...)
	cmd.Dir = toolbin.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install-files %s: %v\n%s", strings.Join(vars, " "), err, out)
	}
}

func example(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(toolbin.RepoRoot(), "examples", rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// exampleFiles lists every file under examples/ that is installed: all but
// the Puppet module's source.
func exampleFiles(t *testing.T) []string {
	t.Helper()
	root := filepath.Join(toolbin.RepoRoot(), "examples")
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if !strings.HasPrefix(rel, "puppet/") {
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// `make install KIND=...` into a DESTDIR, for each kind of master: the
// binaries, the kind's units on the unit path and nothing of the other
// kind's, every example (drop-ins and the other kind's units included)
// under the documentation directory, every /usr/local/bin/ pointed at
// PREFIX/bin/, and nothing armed.
func TestInstallPerKind(t *testing.T) {
	bin := fakeBin(t)
	for kind, own := range kindUnits {
		t.Run(kind, func(t *testing.T) {
			dest := t.TempDir()
			makeInstall(t, "KIND="+kind, "BIN="+bin, "DESTDIR="+dest, "PREFIX=/usr")
			rewrite := func(s string) string { return strings.ReplaceAll(s, "/usr/local/bin/", "/usr/bin/") }
			for _, b := range binaries {
				if fi, err := os.Stat(filepath.Join(dest, "usr/bin", b)); err != nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("usr/bin/%s: %v, want mode 0755", b, err)
				}
			}
			// The kind's units, on SYSTEMDDIR (/etc/systemd/system by default).
			want := map[string]string{}
			for _, u := range append(append([]string{}, sharedUnits...), own...) {
				want[filepath.Base(u)] = rewrite(example(t, u))
			}
			unitDir := filepath.Join(dest, "etc/systemd/system")
			entries, err := os.ReadDir(unitDir)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, e := range entries {
				got[e.Name()] = true
				w, ok := want[e.Name()]
				if !ok {
					t.Errorf("etc/systemd/system/%s installed: not a unit a %s master runs", e.Name(), kind)
					continue
				}
				data, err := os.ReadFile(filepath.Join(unitDir, e.Name()))
				if err != nil || string(data) != w {
					t.Errorf("etc/systemd/system/%s (%v):\n%s\nwant:\n%s", e.Name(), err, data, w)
				}
			}
			for name := range want {
				if !got[name] {
					t.Errorf("%s not installed to etc/systemd/system on a %s master", name, kind)
				}
			}
			checkNothingArmed(t, dest, kind)
			// Every example under the documentation directory, to copy from.
			doc := filepath.Join(dest, "usr/share/doc/keysync")
			for _, rel := range exampleFiles(t) {
				data, err := os.ReadFile(filepath.Join(doc, "examples", rel))
				if err != nil || string(data) != rewrite(example(t, rel)) {
					t.Errorf("examples/%s not installed as usr/share/doc/keysync/examples/%s with /usr/bin: %v", rel, rel, err)
				}
			}
			for _, f := range []string{"README.md", "LICENSE", "docs/operations.md", "docs/kubeadm.md"} {
				if _, err := os.Stat(filepath.Join(doc, f)); err != nil {
					t.Errorf("%s not in the documentation directory: %v", f, err)
				}
			}
			checkModes(t, dest)
		})
	}
}

// checkNothingArmed fails the test for anything under root that systemd or
// confd would act on without the operator: a link (an enabled unit), a
// directory on the unit path (a drop-in, a .wants), a unit of the other
// kind on the unit path, or a file under /etc other than a unit (the
// site's /etc/confd and /etc/kubernetes).
func checkNothingArmed(t *testing.T, root, kind string) {
	t.Helper()
	mine := map[string]string{}
	for _, u := range append(append([]string{}, sharedUnits...), kindUnits[kind]...) {
		mine[filepath.Base(u)] = u
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		if d.Type()&fs.ModeSymlink != 0 {
			t.Errorf("%s is a link: an enabled unit?", rel)
			return nil
		}
		onUnitPath := false
		for _, up := range unitPaths {
			if strings.HasPrefix(rel, up+"/") {
				onUnitPath = true
			}
		}
		switch {
		case onUnitPath && d.IsDir():
			t.Errorf("%s/ on systemd's unit path: a drop-in or enable directory applies at the next daemon-reload", rel)
		case onUnitPath:
			name := filepath.Base(rel)
			ex, ok := mine[name]
			if !ok {
				t.Errorf("%s on systemd's unit path: not a unit of a %s master", rel, kind)
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, pfx := range []string{"/usr/bin/", "/usr/local/bin/"} {
				if string(data) == strings.ReplaceAll(example(t, ex), "/usr/local/bin/", pfx) {
					return nil
				}
			}
			t.Errorf("%s on systemd's unit path is not examples/%s, a %s master's", rel, ex, kind)
		case strings.HasPrefix(rel, "etc/") && !d.IsDir():
			t.Errorf("%s installed: the site's configuration is never written", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkModes: binaries 0755, every other file 0644, every directory 0755,
// whatever the caller's umask; and no installed unit or example still
// names /usr/local/bin/ (the docs describe the repository's examples).
func checkModes(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o644)
		if d.IsDir() || strings.Contains(rel, "/bin/") {
			want = 0o755
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %o, want %o", rel, fi.Mode().Perm(), want)
		}
		if !d.IsDir() && !strings.Contains(rel, "/bin/") && (strings.Contains(rel, "/examples/") || strings.Contains(rel, "/systemd/system/")) {
			if data, _ := os.ReadFile(p); strings.Contains(string(data), "/usr/local/bin/") {
				t.Errorf("%s still names /usr/local/bin/", rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// examples/kubeadm/confd is copied whole to a kubeadm master's /etc/confd,
// so it holds its own confd.toml and bundle template: they must stay
// examples/confd's, which the rehearsal runs.
func TestKubeadmConfdirCopiesAreTheExamples(t *testing.T) {
	for _, rel := range []string{"confd.toml", "templates/sa-bundle.pem.tmpl"} {
		if got, want := example(t, "kubeadm/confd/"+rel), example(t, "confd/"+rel); got != want {
			t.Errorf("examples/kubeadm/confd/%s differs from examples/confd/%s: copy it", rel, rel)
		}
	}
}

// A KIND that is neither is refused, naming both.
func TestInstallUnknownKind(t *testing.T) {
	cmd := exec.Command("make", "-s", "install-files", "KIND=static-pod", "BIN="+fakeBin(t), "DESTDIR="+t.TempDir())
	cmd.Dir = toolbin.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "KIND=binary") || !strings.Contains(string(out), "KIND=kubeadm") {
		t.Errorf("KIND=static-pod: %v\n%s", err, out)
	}
}
