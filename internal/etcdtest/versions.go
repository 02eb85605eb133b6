package etcdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/keysync/confd/internal/toolbin"
)

// Versions are the etcd releases that version-looping tests run against:
// 3.5, 3.6 and 3.7 as `make etcd` builds them (.tools/etcd-VERSION/), and
// 3.4 from Debian's /usr/bin/etcd or $ETCD34_BIN (toolbin.EtcdVersion).
var Versions = []string{"3.4", "3.5", "3.6", "3.7"}

// WithVersion runs etcd of release v ("3.4" … "3.7"; see Versions); Tool
// then returns that version's etcdctl too. A version that is not there
// skips the test with one line, except under CI (CI=true), where it fails:
// CI installs every version and must not pass by running less.
func WithVersion(v string) Option {
	return func(s *Server) {
		s.t.Helper()
		s.binDir = toolbin.EtcdVersion(s.t, v)
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
