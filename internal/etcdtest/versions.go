package etcdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Versions are the etcd releases tests run against: "3.6" (.tools/bin, or
// $ETCD_BIN_DIR) and "3.4" (Debian's /usr/bin/etcd, or $ETCD34_BIN).
var Versions = []string{"3.4", "3.6"}

// WithVersion runs etcd 3.4 or 3.6 (see Versions); Tool then returns that
// version's etcdctl too. A missing 3.4 binary fails the test: CI must not
// pass by running nothing.
func WithVersion(v string) Option {
	return func(s *Server) {
		if v != "3.4" {
			return
		}
		bin := os.Getenv("ETCD34_BIN")
		if bin == "" {
			bin = "/usr/bin/etcd"
		}
		if _, err := os.Stat(bin); err != nil {
			s.t.Fatalf("etcd 3.4 not found at %s (set $ETCD34_BIN): %v", bin, err)
		}
		s.binDir = filepath.Dir(bin)
	}
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
