package packaging

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/toolbin"
)

// `make dist` for amd64 (about 20 s warm; arm64 differs only in GOARCH):
// static binaries stamped with make's version, a .deb and an .rpm holding
// what `make install KIND=binary PREFIX=/usr` stages with its modes, the
// maintainer scripts of packaging/scripts and a changelog, nothing armed,
// and a SHA256SUMS of every artifact. Read with Go; dpkg-deb and rpm check
// the same where the machine has them.
func TestDist(t *testing.T) {
	toolbin.Nfpm(t) // make dist builds it when missing; here that needs `make nfpm`
	root := toolbin.RepoRoot()
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	version := strings.SplitN(run("make", "-s", "print-version"), "\n", 2)[0]
	dist := t.TempDir()
	run("make", "-s", "dist", "DIST="+dist, "DIST_ARCHES=amd64")

	// SHA256SUMS: every artifact, each sum right.
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		data, err := os.ReadFile(filepath.Join(dist, name))
		if got := sha256.Sum256(data); !ok || err != nil || hex.EncodeToString(got[:]) != sum {
			t.Errorf("SHA256SUMS line %q does not match %s (%v)", line, name, err)
		}
		listed[name] = true
	}
	entries, _ := os.ReadDir(dist)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		if e.Name() != "SHA256SUMS" && !listed[e.Name()] {
			t.Errorf("%s not in SHA256SUMS", e.Name())
		}
	}
	deb := "keysync_" + version + "_amd64.deb"
	rpm := "keysync-" + version + "-1.x86_64.rpm"
	want := []string{"SHA256SUMS", deb, rpm}
	for _, b := range binaries {
		want = append(want, b+"-linux-amd64")
	}
	sort.Strings(want)
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("dist holds %q, want %q", names, want)
	}

	// Static binaries, stamped.
	for _, b := range binaries {
		p := filepath.Join(dist, b+"-linux-amd64")
		f, err := elf.Open(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", b)
			}
		}
		_ = f.Close()
		if runtime.GOOS == "linux" && runtime.GOARCH == "amd64" {
			out := run(p, "--version")
			first, _, _ := strings.Cut(out, "\n")
			if first != b+" "+version && !strings.HasPrefix(first, b+" "+version+" ") || !strings.Contains(out, "\ncommit: ") {
				t.Errorf("%s --version: %q, want %s %s, then its commit and date", b, out, b, version)
			}
		}
	}

	// What the packages must hold: make install's staging for a package.
	stage := t.TempDir()
	makeInstall(t, "KIND=binary", "BIN="+fakeBin(t), "DESTDIR="+stage, "PREFIX=/usr",
		"SYSTEMDDIR=/usr/lib/systemd/system", "DOCDIR=/usr/share/doc/keysync")
	staged := map[string]fs.FileMode{}
	err = filepath.WalkDir(stage, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		staged[strings.TrimPrefix(p, stage)] = fi.Mode().Perm()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range append(append([]string{}, sharedUnits...), kindUnits["binary"]...) {
		if _, ok := staged["/usr/lib/systemd/system/"+filepath.Base(u)]; !ok {
			t.Errorf("the package's staging lacks the unit %s", u)
		}
	}
	for _, f := range []string{
		"/usr/share/doc/keysync/examples/systemd/kube-apiserver.service.d/20-sa-keys.conf",
		"/usr/share/doc/keysync/examples/kubeadm/systemd/confd.service",
		"/usr/share/doc/keysync/examples/kubeadm/systemd/sa-signing-key.service",
	} {
		if _, ok := staged[f]; !ok {
			t.Errorf("the package's staging lacks %s", f)
		}
	}

	scripts := map[string]string{}
	for _, s := range []string{"postinstall", "preremove", "postremove"} {
		data, err := os.ReadFile(filepath.Join(root, "packaging", "scripts", s+".sh"))
		if err != nil {
			t.Fatal(err)
		}
		scripts[s] = string(data)
	}
	for _, c := range []struct {
		file, arch string
		read       func(string) (*pkgInfo, error)
		extra      []string // files the packager adds
	}{
		{deb, "amd64", readDeb, []string{"/usr/share/doc/keysync/changelog.Debian.gz"}},
		{rpm, "x86_64", readRPM, nil},
	} {
		t.Run(filepath.Ext(c.file)[1:], func(t *testing.T) {
			p, err := c.read(filepath.Join(dist, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if p.version != version || p.arch != c.arch {
				t.Errorf("version %q arch %q, want %q %q", p.version, p.arch, version, c.arch)
			}
			if p.fields["Conflicts"] != "confd" {
				t.Errorf("Conflicts %q, want confd (another confd package's /usr/bin/confd)", p.fields["Conflicts"])
			}
			if !strings.Contains(p.changes, "First packaged release") {
				t.Errorf("no changelog: %q", p.changes)
			}
			checkPackageFiles(t, p, staged, c.extra)
			for s, text := range scripts {
				if got := p.scripts[s]; strings.TrimSpace(got) != strings.TrimSpace(text) {
					t.Errorf("%s script:\n%s\nwant packaging/scripts/%s.sh:\n%s", s, got, s, text)
				}
			}
			if len(p.scripts) != len(scripts) {
				t.Errorf("scripts %v, want only %v", mapKeys(p.scripts), mapKeys(scripts))
			}
		})
	}
	checkScriptsArmNothing(t, scripts)
	crossCheck(t, filepath.Join(dist, deb), filepath.Join(dist, rpm), version)
}

// checkPackageFiles: the package's files are the staged ones (plus what
// the packager adds) with their modes, directories are 0755, the
// directories the filesystem package owns are not claimed, and nothing is
// on the unit path but units.
func checkPackageFiles(t *testing.T, p *pkgInfo, staged map[string]fs.FileMode, extra []string) {
	t.Helper()
	for f, mode := range staged {
		got, ok := p.files[f]
		if !ok {
			t.Errorf("%s not in the package", f)
		} else if got.mode != mode {
			t.Errorf("%s: mode %v, want %v", f, got.mode, mode)
		}
	}
	isExtra := map[string]bool{}
	for _, f := range extra {
		isExtra[f] = true
		if _, ok := p.files[f]; !ok {
			t.Errorf("%s not in the package", f)
		}
	}
	for f, pf := range p.files {
		switch {
		case pf.mode.IsDir():
			if pf.mode.Perm() != 0o755 {
				t.Errorf("directory %s: mode %v", f, pf.mode)
			}
			if _, isDeb := p.fields["Package"]; !isDeb && (f == "/usr/bin" || f == "/usr/lib/systemd/system" || f == "/usr/share/doc") {
				// rpm would report a conflict with the filesystem
				// package, which owns them with modes of its own.
				t.Errorf("the rpm owns %s, another package's directory", f)
			}
			if strings.HasPrefix(f, "/usr/lib/systemd/system/") {
				t.Errorf("%s/ on systemd's unit path: a drop-in or enable directory applies at the next daemon-reload", f)
			}
		case strings.HasPrefix(f, "/etc/"):
			t.Errorf("%s in the package: the site's configuration is never written", f)
		default:
			if _, ok := staged[f]; !ok && !isExtra[f] {
				t.Errorf("%s in the package, not in make install's staging", f)
			}
		}
	}
}

// The maintainer scripts reload systemd's view of the units and, on
// removal only, stop and disable what the site enabled: none enables,
// starts or restarts a unit.
func checkScriptsArmNothing(t *testing.T, scripts map[string]string) {
	t.Helper()
	for s, text := range scripts {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "#") || !strings.Contains(line, "systemctl") {
				continue
			}
			ok := strings.Contains(line, "systemctl daemon-reload") ||
				(s == "preremove" && strings.Contains(line, "systemctl --no-reload disable --now"))
			if !ok {
				t.Errorf("%s runs %q: a package arms nothing", s, line)
			}
		}
	}
	if !strings.Contains(scripts["preremove"], "remove | 0)") {
		t.Error("preremove does not limit itself to removal (deb: remove; rpm: $1 = 0): an upgrade would stop the units")
	}
}

// crossCheck reads the packages with dpkg-deb and rpm where the machine
// has them: the same version and file list as the Go readers.
func crossCheck(t *testing.T, deb, rpm, version string) {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err == nil {
		out, err := exec.Command("dpkg-deb", "-f", deb, "Version").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != version {
			t.Errorf("dpkg-deb -f Version: %q %v, want %s", out, err, version)
		}
		out, err = exec.Command("dpkg-deb", "-c", deb).CombinedOutput()
		if err != nil {
			t.Errorf("dpkg-deb -c: %v\n%s", err, out)
		}
		p, _ := readDeb(deb)
		if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; p == nil || n != len(p.files) {
			t.Errorf("dpkg-deb -c lists %d paths, the Go reader %d", n, len(p.files))
		}
	} else {
		t.Log("no dpkg-deb on this machine: the .deb is checked with the Go reader only")
	}
	if _, err := exec.LookPath("rpm"); err == nil {
		out, err := exec.Command("rpm", "-qp", "--qf", "%{VERSION}", rpm).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != version {
			t.Errorf("rpm -qp VERSION: %q %v, want %s", out, err, version)
		}
		out, err = exec.Command("rpm", "-qlp", rpm).CombinedOutput()
		p, _ := readRPM(rpm)
		if n := strings.Count(strings.TrimSpace(string(out)), "\n") + 1; err != nil || p == nil || n != len(p.files) {
			t.Errorf("rpm -qlp lists %d paths (%v), the Go reader %d", n, err, len(p.files))
		}
	} else {
		t.Log("no rpm on this machine: the .rpm is checked with the Go reader only")
	}
}

func mapKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
