// Package lockdir makes and vets the directories that hold confd's lock
// files (the destinations' locks, the commands' locks).
package lockdir

import (
	"fmt"
	"os"
	"syscall"
)

// Ensure creates dir (mode 0700, parents too) if it is missing, and refuses
// a directory that another user could hold our locks in: a symlink, a
// directory owned by another user, or one that group or others may write.
// A lock file there that someone else created (or a symlink they put in its
// place) would let them stall confd's passes or point its writes elsewhere.
func Ensure(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s: not a directory of ours that only we can write (mode %s, owner uid %d, we are uid %d)", dir, fi.Mode(), st.Uid, os.Geteuid())
	}
	return nil
}
