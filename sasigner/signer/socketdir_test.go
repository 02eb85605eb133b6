package signer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// nobody is a uid and gid other than the test's (root here): "another user"
// and the --socket-group of the tests.
const nobody = 65534

// socketBase is a short temporary directory (Unix socket paths are limited
// to ~108 bytes) at mode, for the socket-location tests. They need root:
// they chown to another user.
func socketBase(t *testing.T, mode os.FileMode) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (chown to another user)")
	}
	d, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	if err := os.Chmod(d, mode); err != nil {
		t.Fatal(err)
	}
	return d
}

// mkdir creates path at exactly mode (not the umask's), owned by uid.
func mkdir(t *testing.T, path string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

func statT(t *testing.T, path string) (os.FileMode, uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (os.ModePerm | os.ModeSticky | os.ModeSetgid), fi.Sys().(*syscall.Stat_t).Gid
}

// listenErr is Listen's error ("" when it listened; the listener is closed).
func listenErr(t *testing.T, path string, gid int) string {
	t.Helper()
	l, err := Listen(context.Background(), path, gid)
	if err != nil {
		return err.Error()
	}
	_ = l.Close()
	return ""
}

// The locations an unprivileged user could take the socket's path in, or
// redirect it through, are refused before anything is created or changed.
func TestListenRefusesUnsafeLocation(t *testing.T) {
	base := socketBase(t, 0o755)
	mkdir(t, filepath.Join(base, "real"), 0o750, 0)
	if err := os.Symlink(filepath.Join(base, "real"), filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(base, "theirs"), 0o750, nobody)
	mkdir(t, filepath.Join(base, "theirs", "d"), 0o750, 0)
	mkdir(t, filepath.Join(base, "w777"), 0o777, 0)
	mkdir(t, filepath.Join(base, "w770"), 0o770, 0)
	mkdir(t, filepath.Join(base, "w1777"), os.ModeSticky|0o777, 0)
	mkdir(t, filepath.Join(base, "open"), 0o777, 0)
	mkdir(t, filepath.Join(base, "open", "d"), 0o750, 0)

	for _, tc := range []struct{ sock, want string }{
		// The socket's directory a symlink: whoever changes it redirects
		// the socket and --socket-group's chgrp.
		{"link/s.sock", "link is a symlink"},
		{"link/sub/s.sock", "link is a symlink"},
		// Owned by another user, or below a directory that is.
		{"theirs/s.sock", "owned by uid 65534"},
		{"theirs/d/s.sock", "owned by uid 65534"},
		// Writable by others, sticky or not (/tmp itself): they bind first.
		{"w777/s.sock", "writable by group or others"},
		{"w770/s.sock", "writable by group or others"},
		{"w1777/s.sock", "writable by group or others"},
		// Below a directory others can rename entries of.
		{"open/d/s.sock", "ancestor " + filepath.Join(base, "open")},
	} {
		got := listenErr(t, filepath.Join(base, tc.sock), nobody)
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: err = %q, want %q", tc.sock, got, tc.want)
		}
	}
	// Not with the group: a regression would chgrp /.
	if got := listenErr(t, "/s.sock", -1); !strings.Contains(got, "a directory of its own") {
		t.Errorf("/s.sock: err = %q, want / refused", got)
	}
	if _, gid := statT(t, filepath.Join(base, "real")); gid != 0 {
		t.Errorf("symlink's target chgrp'd to %d", gid)
	}
	if _, err := os.Lstat(filepath.Join(base, "real", "sub")); err == nil {
		t.Error("a directory was created through the symlink")
	}
}

// A directory of its own below a sticky world-writable one (as /tmp) is
// accepted: others cannot remove or rename it.
func TestListenAcceptsOwnDirBelowSticky(t *testing.T) {
	base := socketBase(t, 0o755)
	tmp := filepath.Join(base, "tmp")
	mkdir(t, tmp, os.ModeSticky|0o777, 0)
	if got := listenErr(t, filepath.Join(tmp, "signer", "s.sock"), nobody); got != "" {
		t.Fatal(got)
	}
}

// A pre-existing 0700 directory is given --socket-group's group and g+rx
// (the kernel would refuse the group's connect without a word).
func TestListenFixesDirForGroup(t *testing.T) {
	base := socketBase(t, 0o755)
	dir := filepath.Join(base, "run")
	mkdir(t, dir, 0o700, 0)
	sock := filepath.Join(dir, "s.sock")
	if got := listenErr(t, sock, nobody); got != "" {
		t.Fatal(got)
	}
	if mode, gid := statT(t, dir); mode != 0o750 || gid != nobody {
		t.Errorf("directory: mode %v group %d, want 0750 group %d", mode, gid, nobody)
	}
}

// Whatever the umask, what is created has the documented modes. Not
// parallel: the umask is the process's (restored before the test ends).
func TestListenIgnoresUmask(t *testing.T) {
	base := socketBase(t, 0o755)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, gid := range []int{nobody, -1} {
		top := filepath.Join(base, fmt.Sprintf("g%d", gid))
		dir := filepath.Join(top, "run")
		sock := filepath.Join(dir, "s.sock")
		l, err := Listen(context.Background(), sock, gid)
		if err != nil {
			t.Fatal(err)
		}
		sm, sg := statT(t, sock)
		_ = l.Close()
		if mode, _ := statT(t, top); mode != 0o755 {
			t.Errorf("gid %d: created ancestor mode %v, want 0755", gid, mode)
		}
		mode, g := statT(t, dir)
		if mode != 0o750 {
			t.Errorf("gid %d: directory mode %v, want 0750", gid, mode)
		}
		if gid >= 0 && (g != uint32(gid) || sg != uint32(gid) || sm&0o777 != 0o660) {
			t.Errorf("gid %d: directory group %d, socket %v group %d; want the group and 0660", gid, g, sm, sg)
		}
	}
}

// --socket-group members must be able to reach the socket: a directory on
// the way that denies them search is named at start.
func TestListenChecksGroupReach(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		gid  int
		want string
	}{
		{0o700, 0, "gives others no search (x) permission"},
		{0o750, 0, "gives others no search (x) permission"},
		{0o701, nobody, "gives its group no search (x) permission"},
		{0o711, 0, ""},
		{0o710, nobody, ""},
	} {
		base := socketBase(t, tc.mode)
		if err := os.Chown(base, -1, tc.gid); err != nil {
			t.Fatal(err)
		}
		got := listenErr(t, filepath.Join(base, "run", "s.sock"), nobody)
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) || tc.want != "" && !strings.Contains(got, base) {
			t.Errorf("ancestor %v group %d: err = %q, want %q naming %s", tc.mode, tc.gid, got, tc.want, base)
		}
		if tc.want != "" {
			if _, err := os.Lstat(filepath.Join(base, "run", "s.sock")); err == nil {
				t.Errorf("ancestor %v group %d: socket bound though refused", tc.mode, tc.gid)
			}
		}
	}
	// Without --socket-group nothing is asked of the path.
	base := socketBase(t, 0o700)
	if got := listenErr(t, filepath.Join(base, "run", "s.sock"), -1); got != "" {
		t.Error(got)
	}
}
