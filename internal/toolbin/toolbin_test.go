package toolbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// helperEnv names the lookup TestHelperLookup makes in a child process.
const helperEnv = "TOOLBIN_TEST_LOOKUP"

// TestHelperLookup is the child process of TestMissing: one lookup, whose
// skip or failure is the outcome under test.
func TestHelperLookup(t *testing.T) {
	switch what := os.Getenv(helperEnv); what {
	case "":
		t.Skip("only run by TestMissing, in a child process")
	case "etcd", "etcdctl":
		t.Log("found", Etcd(t, what))
	case "etcd3.4":
		t.Log("found", EtcdVersion(t, "3.4"))
	case "promtool":
		t.Log("found", Promtool(t))
	default:
		t.Log("found", Kube(t, what))
	}
}

// A missing binary skips with one line naming the make target outside CI
// and fails with the same line under CI=true; etcd on $PATH is not used.
func TestMissing(t *testing.T) {
	empty := t.TempDir()
	onPath := t.TempDir()
	for _, name := range []string{"etcd", "etcdctl", "kube-apiserver", "kube-controller-manager", "promtool"} {
		writeExecutable(t, filepath.Join(onPath, name))
	}
	for _, tc := range []struct {
		lookup string
		env    []string
		want   string // the whole message
	}{
		{"etcd", []string{"ETCD_BIN_DIR=" + empty},
			"etcd not built: run `make etcd` (looked for " + empty + "/etcd from $ETCD_BIN_DIR)"},
		{"etcdctl", []string{"ETCD_BIN_DIR=" + empty},
			"etcdctl not built: run `make etcd` (looked for " + empty + "/etcdctl from $ETCD_BIN_DIR)"},
		{"etcd3.4", []string{"ETCD34_BIN=" + empty + "/etcd"},
			"etcd 3.4 not installed: apt-get install etcd-server, or set $ETCD34_BIN (looked for " + empty + "/etcd)"},
		{"kube-apiserver", []string{"KUBE_APISERVER_BIN=" + empty + "/kube-apiserver"},
			"kube-apiserver not built: run `make kube-apiserver` (looked for " + empty + "/kube-apiserver from $KUBE_APISERVER_BIN)"},
		{"kube-controller-manager", []string{"KUBE_CONTROLLER_MANAGER_BIN=" + empty + "/kube-controller-manager"},
			"kube-controller-manager not built: run `make kube-controller-manager` (looked for " + empty + "/kube-controller-manager from $KUBE_CONTROLLER_MANAGER_BIN)"},
		{"promtool", []string{"PROMTOOL=" + empty + "/promtool"},
			"promtool not installed: apt-get install prometheus, or set $PROMTOOL (looked for " + empty + "/promtool from $PROMTOOL)"},
	} {
		for _, ci := range []bool{false, true} {
			name := tc.lookup + "/CI-unset"
			if ci {
				name = tc.lookup + "/CI=true"
			}
			t.Run(name, func(t *testing.T) {
				env := slices.Concat(tc.env, []string{helperEnv + "=" + tc.lookup, "PATH=" + onPath + string(os.PathListSeparator) + os.Getenv("PATH")})
				if ci {
					env = append(env, "CI=true")
				}
				out, err := child(t, env)
				if ci {
					if err == nil || !strings.Contains(out, "--- FAIL: TestHelperLookup") {
						t.Fatalf("under CI=true the lookup did not fail (%v):\n%s", err, out)
					}
				} else if err != nil || !strings.Contains(out, "--- SKIP: TestHelperLookup") {
					t.Fatalf("outside CI the lookup did not skip (%v):\n%s", err, out)
				}
				if strings.Contains(out, "found") {
					t.Errorf("the lookup found a binary ($PATH holds one):\n%s", out)
				}
				// One line: the message, and straight after it the verdict.
				lines := strings.Split(out, "\n")
				n := 0
				for i, l := range lines {
					if !strings.HasSuffix(l, ": "+tc.want) {
						continue
					}
					n++
					if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "--- ") {
						t.Errorf("message is not one line:\n%s", out)
					}
				}
				if n != 1 {
					t.Errorf("want the line %q once, got it %d times in:\n%s", tc.want, n, out)
				}
			})
		}
	}
}

// child runs this test binary's TestHelperLookup with env added to a copy
// of this process's environment cleared of every variable the lookups read.
func child(t *testing.T, env []string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperLookup$", "-test.v", "-test.count=1")
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "CI", "PATH", helperEnv, "ETCD_BIN_DIR", "ETCD34_BIN", "KUBE_APISERVER_BIN", "KUBE_CONTROLLER_MANAGER_BIN", "PROMTOOL":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func writeExecutable(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// A binary where the variables point is used as is, under CI too; one that
// is not executable is missing.
func TestFound(t *testing.T) {
	t.Setenv("CI", "true")
	dir := t.TempDir()
	writeExecutable(t, filepath.Join(dir, "etcd"))
	writeExecutable(t, filepath.Join(dir, "kube-apiserver"))
	t.Setenv("ETCD_BIN_DIR", dir)
	t.Setenv("KUBE_APISERVER_BIN", filepath.Join(dir, "kube-apiserver"))
	if got := Etcd(t, "etcd"); got != filepath.Join(dir, "etcd") {
		t.Errorf("Etcd = %s, want %s/etcd", got, dir)
	}
	if got := Kube(t, "kube-apiserver"); got != filepath.Join(dir, "kube-apiserver") {
		t.Errorf("Kube = %s, want %s/kube-apiserver", got, dir)
	}
	writeExecutable(t, filepath.Join(dir, "promtool"))
	t.Setenv("PROMTOOL", filepath.Join(dir, "promtool"))
	if got := Promtool(t); got != filepath.Join(dir, "promtool") {
		t.Errorf("Promtool = %s, want %s/promtool", got, dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "etcdctl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if executable(filepath.Join(dir, "etcdctl")) {
		t.Error("a file without an execute bit counts as a binary")
	}
}

// Without $ETCD_BIN_DIR the default is `make etcd`'s directory for the
// Makefile's ETCD_DEFAULT, which must be EtcdDefault.
func TestDefaultAgreesWithMakefile(t *testing.T) {
	t.Setenv("ETCD_BIN_DIR", "")
	if dir, _ := EtcdDir(); dir != filepath.Join(RepoRoot(), ".tools", "etcd-"+EtcdDefault) {
		t.Errorf("EtcdDir without $ETCD_BIN_DIR = %s", dir)
	}
	mk, err := os.ReadFile(filepath.Join(RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ETCD_DEFAULT\s*\?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil || string(m[1]) != EtcdDefault {
		t.Errorf("the Makefile's ETCD_DEFAULT line is %q, want %s", m, EtcdDefault)
	}
	versions := regexp.MustCompile(`(?m)^ETCD_VERSIONS\s*\?=(.*)$`).FindSubmatch(mk)
	if versions == nil || !strings.Contains(" "+string(versions[1])+" ", " "+EtcdDefault+" ") {
		t.Errorf("the Makefile's ETCD_VERSIONS (%q) does not build %s", versions, EtcdDefault)
	}
}

// make dist packages with the nfpm the packaging test looks for.
func TestNfpmAgreesWithMakefile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(RepoRoot(), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^NFPM_VERSION\s*\?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil || string(m[1]) != NfpmVersion {
		t.Errorf("the Makefile's NFPM_VERSION line is %q, want %s", m, NfpmVersion)
	}
}

func TestPatchOrder(t *testing.T) {
	if patch("/x/etcd-3.6.9") >= patch("/x/etcd-3.6.16") {
		t.Error("3.6.9 sorts after 3.6.16")
	}
}
