package signer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// socketDirMode is the mode the socket's directory is given (docs/signer.md:
// the socket is 0660, its directory 0750): --socket-group members search it,
// nobody but its owner adds or removes an entry.
const socketDirMode = 0o750

// dirInfo is one directory on the way to the socket, as fstat saw it.
type dirInfo struct {
	path     string
	uid, gid uint32
	mode     uint32 // permission and sticky/setgid bits
}

func (d dirInfo) String() string {
	return fmt.Sprintf("%s (owner %d:%d, mode %04o)", d.path, d.uid, d.gid, d.mode)
}

// prepareSocketDir makes sock's directory (dir) safe to hold it and checks
// that --socket-group reaches it (checkGroupReach): whoever can add an
// entry to dir, or rename an ancestor, can bind the socket's path first and
// answer the apiserver. So no component is a symlink (each opened
// O_NOFOLLOW from its parent's fd), each is owned by root or the signer's
// euid, no ancestor is writable by group or others unless sticky (as
// /tmp), and dir by nobody else at all.
// Missing components are created (ancestors 0755, dir 0750); dir's mode
// and group are set through its fd, group r-x for --socket-group (gid ≥ 0)
// whatever the umask or its mode before.
func prepareSocketDir(sock string, gid int) error {
	dir := filepath.Dir(sock)
	if !filepath.IsAbs(dir) || dir == "/" {
		// "/" would be chmod'ed and chgrp'ed as the socket's own.
		return fmt.Errorf("socket directory %s: want an absolute path below / (a directory of its own)", dir)
	}
	euid := uint32(os.Geteuid())
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket directory: /: %w", err)
	}
	defer func() { _ = unix.Close(fd) }()
	names := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	cur := "/"
	var chain []dirInfo
	for i := 0; ; i++ {
		last := i == len(names)
		d, err := fstatDir(fd, cur)
		if err != nil {
			return err
		}
		if d.uid != 0 && d.uid != euid {
			return fmt.Errorf("socket directory: %s is owned by uid %d, not root or the signer (uid %d): anyone it belongs to can swap the socket; use a directory owned by root", d, d.uid, euid)
		}
		if last {
			if d.mode&0o022 != 0 {
				return fmt.Errorf("socket directory %s is writable by group or others: another user can bind the socket's path first and answer the apiserver; use a directory of its own (e.g. /run/kube-apiserver-sa-signer), or chmod go-w it", d)
			}
			if d, err = fixSocketDir(fd, d, gid); err != nil {
				return err
			}
			return checkGroupReach(append(chain, d), sock, gid)
		}
		if d.mode&0o022 != 0 && d.mode&unix.S_ISVTX == 0 {
			return fmt.Errorf("socket directory: ancestor %s is writable by group or others and not sticky: another user can rename the socket's directory and put theirs in its place; chmod go-w it or choose another directory", d)
		}
		chain = append(chain, d)

		name := names[i]
		next := filepath.Join(cur, name)
		final := i == len(names)-1
		nfd, err := openDir(fd, name, next, final)
		if errors.Is(err, unix.ENOENT) {
			// Created 0700 and widened below through the fd, so that the
			// umask does not decide the mode.
			mode := uint32(0o755)
			if final {
				mode = socketDirMode
			}
			// Created meanwhile by someone else (EEXIST): checked as
			// found (next turn), not chmod'ed.
			mkErr := unix.Mkdirat(fd, name, 0o700)
			if mkErr != nil && !errors.Is(mkErr, unix.EEXIST) {
				return fmt.Errorf("socket directory: create %s: %w", next, mkErr)
			}
			// Opened O_RDONLY whatever final is: fchmod needs it.
			if nfd, err = openDir(fd, name, next, true); err == nil && mkErr == nil {
				if err := unix.Fchmod(nfd, mode); err != nil {
					_ = unix.Close(nfd)
					return fmt.Errorf("socket directory: chmod %s: %w", next, err)
				}
			}
		}
		if err != nil {
			return err
		}
		_ = unix.Close(fd)
		fd, cur = nfd, next
	}
}

// openDir opens name in the directory fd without following a symlink:
// O_RDONLY when rw (fchmod and fchown need a real descriptor), else O_PATH
// (an ancestor may grant the signer search but not read).
func openDir(fd int, name, path string, rw bool) (int, error) {
	flags := unix.O_PATH
	if rw {
		flags = unix.O_RDONLY
	}
	nfd, err := unix.Openat(fd, name, flags|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		return nfd, nil
	}
	if errors.Is(err, unix.ENOENT) {
		return -1, err
	}
	var st unix.Stat_t
	if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target, _ := os.Readlink(path)
		return -1, fmt.Errorf("socket directory: %s is a symlink (to %s): it is not followed, since whoever can change it redirects the socket (and --socket-group's chgrp); give --socket the path without symlinks", path, target)
	}
	return -1, fmt.Errorf("socket directory: %s: %w", path, err)
}

func fstatDir(fd int, path string) (dirInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return dirInfo{}, fmt.Errorf("socket directory: %s: %w", path, err)
	}
	return dirInfo{path: path, uid: st.Uid, gid: st.Gid, mode: st.Mode & 0o7777}, nil
}

// fixSocketDir gives the socket's directory (fd) owner rwx and, for
// --socket-group, that group and group r-x; other bits are kept (a
// directory at 0755 stays so: the socket itself is 0660).
func fixSocketDir(fd int, d dirInfo, gid int) (dirInfo, error) {
	if gid >= 0 && d.gid != uint32(gid) {
		if err := unix.Fchown(fd, -1, gid); err != nil {
			return d, fmt.Errorf("socket directory %s: group %d: %w", d.path, gid, err)
		}
	}
	want := d.mode | 0o700
	if gid >= 0 {
		want |= 0o050
	}
	if want != d.mode {
		if err := unix.Fchmod(fd, want); err != nil {
			return d, fmt.Errorf("socket directory %s: chmod %04o: %w", d.path, want, err)
		}
	}
	return fstatDir(fd, d.path)
}

// checkGroupReach names the first directory on the way to sock that denies
// members of group gid search (their connect fails with a bare EACCES):
// the group class where the entry is the group's, the others class
// otherwise, which holds for any member whatever its other groups.
func checkGroupReach(chain []dirInfo, sock string, gid int) error {
	if gid < 0 {
		return nil
	}
	for _, d := range chain {
		bit, class, fix := uint32(0o001), "others", "o+x"
		if d.gid == uint32(gid) {
			bit, class, fix = 0o010, "its group", "g+x"
		}
		if d.mode&bit == 0 {
			return fmt.Errorf("socket %s: --socket-group %d members cannot reach it: %s gives %s no search (x) permission; chmod %s it or choose a socket directory they can reach", sock, gid, d, class, fix)
		}
	}
	return nil
}

// checkSocketGroup checks the socket Listen bound and chmod'ed: a failed
// chmod or chown is an error already, so this guards the code, not the host.
func checkSocketGroup(sock string, gid int) error {
	var st unix.Stat_t
	if err := unix.Lstat(sock, &st); err != nil {
		return fmt.Errorf("socket %s: %w", sock, err)
	}
	if st.Gid != uint32(gid) || st.Mode&0o060 != 0o060 {
		return fmt.Errorf("socket %s (owner %d:%d, mode %04o): --socket-group %d members cannot connect: want group %d, mode g+rw", sock, st.Uid, st.Gid, st.Mode&0o7777, gid, gid)
	}
	return nil
}
