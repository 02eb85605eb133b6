package etcdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// Versions are the etcd releases that version-looping tests run against:
// 3.5, 3.6 and 3.7 as `make etcd` builds them (.tools/etcd-VERSION/), and
// 3.4 from Debian's /usr/bin/etcd or $ETCD34_BIN (it cannot be built from
// the Go module proxy: its module has no /v3 path).
var Versions = []string{"3.4", "3.5", "3.6", "3.7"}

// WithVersion runs etcd of release v ("3.4" … "3.7"; see Versions); Tool
// then returns that version's etcdctl too. A version that is not there
// skips the test with one loud line, except under CI ($CI set), where it
// fails: CI installs every version and must not pass by running less.
func WithVersion(v string) Option {
	return func(s *Server) {
		s.t.Helper()
		dir, where := versionDir(v)
		if dir == "" {
			msg := "etcd " + v + " not found (" + where + ")"
			if os.Getenv("CI") != "" {
				s.t.Fatalf("%s: CI must test every supported etcd", msg)
			}
			s.t.Skipf("!! SKIPPED on etcd %s: %s", v, msg)
		}
		s.binDir = dir
	}
}

var (
	builtOnce sync.Once
	built     map[string]string // "3.6" → .tools/etcd-3.6.16
)

// versionDir finds the directory holding etcd of release v, or "" and
// where it looked.
func versionDir(v string) (dir, where string) {
	if v == "3.4" {
		bin := os.Getenv("ETCD34_BIN")
		if bin == "" {
			bin = "/usr/bin/etcd"
		}
		if fi, err := os.Stat(bin); err == nil && !fi.IsDir() {
			return filepath.Dir(bin), bin
		}
		return "", bin + "; apt-get install etcd-server, or set $ETCD34_BIN"
	}
	builtOnce.Do(func() {
		built = map[string]string{}
		dirs, _ := filepath.Glob(filepath.Join(RepoRoot(), ".tools", "etcd-3.*"))
		sort.Strings(dirs) // several patch releases: the last one listed wins
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, "etcd")); err != nil {
				continue
			}
			full := strings.TrimPrefix(filepath.Base(d), "etcd-")
			if i := strings.LastIndexByte(full, '.'); i > 0 {
				built[full[:i]] = d
			}
		}
	})
	if d, ok := built[v]; ok {
		return d, d
	}
	return "", filepath.Join(RepoRoot(), ".tools", "etcd-"+v+".*") + "; run `make etcd`"
}

// WithArgs adds etcd flags, e.g. "--auth-token-ttl=2".
func WithArgs(args ...string) Option {
	return func(s *Server) { s.extra = append(s.extra, args...) }
}

// Backup stops etcd, copies its data directory (a consistent copy of the
// store at its current revision) and starts it again. RestoreBackup puts
// such a copy back, as restoring an older snapshot does: the revision goes
// back.
func (s *Server) Backup(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "backup")
	s.Stop()
	if out, err := exec.Command("cp", "-a", s.dataDir, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy data dir: %v: %s", err, out)
	}
	if err := s.start(); err != nil {
		t.Fatalf("etcd restart after backup: %v", err)
	}
	return dir
}

// RestoreBackup replaces the data with a Backup and restarts etcd.
func (s *Server) RestoreBackup(t testing.TB, backup string) {
	t.Helper()
	s.Stop()
	if err := os.RemoveAll(s.dataDir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", backup, s.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("restore data dir: %v: %s", err, out)
	}
	if err := s.start(); err != nil {
		t.Fatalf("etcd start after restore: %v", err)
	}
}
