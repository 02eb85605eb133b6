// Package toolbin finds the third-party binaries tests run (etcd, etcdctl,
// kube-apiserver, kube-controller-manager, nfpm) where `make etcd`,
// `make kube-apiserver`, `make kube-controller-manager` and `make nfpm`
// put them, and the two that come from Debian's packages instead (etcd
// 3.4, promtool) where apt-get puts them.
//
// It never builds them (a test that compiled etcd or Kubernetes would turn
// a unit-test run into minutes of building) and never takes them from
// $PATH (a test must not silently run on whatever release a machine has).
// A missing binary skips the test with one line naming the make target,
// except when $CI is "true", where it fails the test: CI must never pass
// by running less.
package toolbin

import (
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// EtcdDefault is the etcd release tests run on unless told otherwise. The
// Makefile's ETCD_DEFAULT must be the same (a test checks it), so that
// `go test` alone and `make test` run on the same server.
const EtcdDefault = "3.6.16"

// RepoRoot is the module root, found from this source file's location, so
// that any package's test finds .tools.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CI reports whether the run is CI's, where a missing binary fails.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing ends the test for want of something a make target provides:
// skipped with msg (one line), or failed with it under CI.
func Missing(t testing.TB, msg string) {
	t.Helper()
	if CI() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// EtcdDir is the directory holding the default etcd and etcdctl:
// $ETCD_BIN_DIR when set (the Makefile sets it; `make rehearsal
// ETCD_BIN_DIR=/usr/bin` picks another server), else what `make etcd`
// built for EtcdDefault. from is " from $ETCD_BIN_DIR" in the first case,
// for messages.
func EtcdDir() (dir, from string) {
	if d := os.Getenv("ETCD_BIN_DIR"); d != "" {
		return d, " from $ETCD_BIN_DIR"
	}
	return filepath.Join(RepoRoot(), ".tools", "etcd-"+EtcdDefault), ""
}

// Etcd returns the path of the default etcd tool, "etcd" or "etcdctl"
// (see EtcdDir), or ends the test as Missing says.
func Etcd(t testing.TB, name string) string {
	t.Helper()
	dir, from := EtcdDir()
	p := filepath.Join(dir, name)
	if !executable(p) {
		Missing(t, name+" not built: run `make etcd` (looked for "+p+from+")")
	}
	return p
}

// EtcdVersion returns the directory holding etcd and etcdctl of release v
// ("3.4" … "3.7"), or ends the test as Missing says. 3.5 and later are the
// ones `make etcd` built (.tools/etcd-v.PATCH/, the highest patch release
// if there are several); 3.4 is Debian's /usr/bin/etcd or $ETCD34_BIN, as
// its module has no /v3 path and cannot be built from the Go module proxy.
func EtcdVersion(t testing.TB, v string) string {
	t.Helper()
	if v == "3.4" {
		bin := os.Getenv("ETCD34_BIN")
		if bin == "" {
			bin = "/usr/bin/etcd"
		}
		if !executable(bin) {
			Missing(t, "etcd 3.4 not installed: apt-get install etcd-server, or set $ETCD34_BIN (looked for "+bin+")")
		}
		return filepath.Dir(bin)
	}
	pattern := filepath.Join(RepoRoot(), ".tools", "etcd-"+v+".*")
	dirs, _ := filepath.Glob(pattern)
	sort.Slice(dirs, func(i, j int) bool { return patch(dirs[i]) < patch(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if executable(filepath.Join(dirs[i], "etcd")) {
			return dirs[i]
		}
	}
	Missing(t, "etcd "+v+" not built: run `make etcd` (looked for "+filepath.Join(pattern, "etcd")+")")
	return ""
}

// patch is the patch number of an .tools/etcd-X.Y.PATCH directory, so that
// 3.6.16 sorts after 3.6.9.
func patch(dir string) int {
	full := strings.TrimPrefix(filepath.Base(dir), "etcd-")
	n := 0
	for _, c := range full[strings.LastIndexByte(full, '.')+1:] {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// kube maps each Kubernetes binary to the variable that overrides its
// path and the make target that builds it into .tools/bin.
var kube = map[string]struct{ env, target string }{
	"kube-apiserver":          {"KUBE_APISERVER_BIN", "make kube-apiserver"},
	"kube-controller-manager": {"KUBE_CONTROLLER_MANAGER_BIN", "make kube-controller-manager"},
}

// Kube returns the path of "kube-apiserver" or "kube-controller-manager":
// its variable ($KUBE_APISERVER_BIN, $KUBE_CONTROLLER_MANAGER_BIN) when
// set, else .tools/bin/NAME; or ends the test as Missing says.
func Kube(t testing.TB, name string) string {
	t.Helper()
	k, ok := kube[name]
	if !ok {
		t.Fatalf("toolbin.Kube: unknown binary %q", name)
	}
	p, from := os.Getenv(k.env), " from $"+k.env
	if p == "" {
		p, from = filepath.Join(RepoRoot(), ".tools", "bin", name), ""
	}
	if !executable(p) {
		Missing(t, name+" not built: run `"+k.target+"` (looked for "+p+from+")")
	}
	return p
}

// NfpmVersion is the nfpm release `make dist` packages with; the
// Makefile's NFPM_VERSION must be the same (a test checks it), so that the
// packaging test runs the tool make dist runs.
const NfpmVersion = "v2.48.0"

// Nfpm returns the path of the nfpm `make nfpm` built
// (.tools/bin/nfpm@NfpmVersion), or ends the test as Missing says.
func Nfpm(t testing.TB) string {
	t.Helper()
	p := filepath.Join(RepoRoot(), ".tools", "bin", "nfpm@"+NfpmVersion)
	if !executable(p) {
		Missing(t, "nfpm not built: run `make nfpm` (looked for "+p+")")
	}
	return p
}

// Promtool returns the path of Prometheus' promtool, which checks and
// unit-tests alert rules: $PROMTOOL when set, else Debian's
// /usr/bin/promtool (package prometheus, which .ci/run installs); or ends
// the test as Missing says. Like etcd 3.4 it is not built here: its module
// would bring all of Prometheus into the build cache for one check.
func Promtool(t testing.TB) string {
	t.Helper()
	p, from := os.Getenv("PROMTOOL"), " from $PROMTOOL"
	if p == "" {
		p, from = "/usr/bin/promtool", ""
	}
	if !executable(p) {
		Missing(t, "promtool not installed: apt-get install prometheus, or set $PROMTOOL (looked for "+p+from+")")
	}
	return p
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}
