package etcdtest

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// Snapshot saves the store as Kubernetes' disaster-recovery procedure does
// (`etcdctl snapshot save`, here through the same client Snapshot API) into
// a file of the test's and returns its path; etcd keeps running.
func (s *Server) Snapshot(t testing.TB) string {
	t.Helper()
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		t.Fatalf("etcd snapshot of %s: %v", s.Endpoint, err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "snapshot.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatalf("etcd snapshot of %s: %v", s.Endpoint, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return path
}

// RestoreSnapshot stops etcd, restores a Snapshot into a new data
// directory with the restore tool of the etcd it runs (etcdutl from 3.5
// on; etcd 3.4 has only `etcdctl snapshot restore`), with the same member
// name and peer URL, and starts etcd on it on the same ports: what an
// operator does after losing etcd's data. A plain restore: the revision
// goes back to the snapshot's.
func (s *Server) RestoreSnapshot(t testing.TB, snapshot string) {
	t.Helper()
	dir := filepath.Dir(s.etcd)
	tool := filepath.Join(dir, "etcdutl")
	if _, err := os.Stat(tool); err != nil {
		tool = filepath.Join(dir, "etcdctl")
		// Only 3.4's etcdctl restores; from 3.6 it is etcdutl's job.
		if out, _ := exec.Command(tool, "version").Output(); !strings.Contains(string(out), "etcdctl version: 3.4") {
			toolbin.Missing(t, "etcdutl not built: run `make etcd` (looked for "+filepath.Join(dir, "etcdutl")+")")
		}
	}
	restored := filepath.Join(t.TempDir(), "restored")
	cmd := exec.Command(tool, "snapshot", "restore", snapshot, "--data-dir", restored,
		"--name", "t", "--initial-cluster", "t="+s.peerURL, "--initial-advertise-peer-urls", s.peerURL)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s snapshot restore %s: %v: %s", tool, snapshot, err, out)
	}
	s.Stop()
	s.dataDir = restored
	if err := s.start(); err != nil {
		t.Fatalf("etcd start on the restored data dir %s: %v", restored, err)
	}
}
