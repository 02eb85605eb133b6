// Package atomicfile replaces files so that a crash leaves the old content
// or the new, never a part of either: the new content goes to a stage file
// beside the destination (so that rename is atomic), with its final owner
// and mode before a single byte is written, is fsynced, renamed over the
// destination, and the directory is fsynced. confd stages, checks, then
// replaces; safe-restart writes in one call. renameio (v2.0.2) was not
// taken: it neither fsyncs the directory after the rename nor sets an
// owner, and confd needs the stage file closed and checked by a command
// between staging and replacing.
package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
)

// NotDurableError says the destination already holds the new content, but
// making that durable (the directory's fsync) failed.
type NotDurableError struct{ Err error }

func (e *NotDurableError) Error() string { return e.Err.Error() }
func (e *NotDurableError) Unwrap() error { return e.Err }

// stageRandom is how many random bytes a stage file's name ends with, in
// hex: "." + base + "." + 2*stageRandom hex digits, as stageName matches.
const stageRandom = 6

var stageName = regexp.MustCompile(`(?s)^\.(.+)\.[0-9a-f]{12}$`)

// StageOf is the base name of the destination whose stage file name is,
// as Stage names them, or "".
func StageOf(name string) string {
	if m := stageName.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return ""
}

// Stage creates a stage file beside dest, gives it owner uid:gid (-1 keeps
// the process's) and mode before write writes its content, then fsyncs
// and closes it. It returns the stage file's path; on error none is left.
func Stage(dest string, mode os.FileMode, uid, gid int, write func(io.Writer) error) (string, error) {
	dir, base := filepath.Split(dest)
	if dir == "" {
		dir = "."
	}
	var f *os.File
	for try := 0; f == nil; try++ {
		var rnd [stageRandom]byte
		_, _ = rand.Read(rnd[:])
		// The umask can only narrow mode.Perm(), never widen it; SetOwnerMode sets it exactly.
		var err error
		f, err = os.OpenFile(filepath.Join(dir, "."+base+"."+hex.EncodeToString(rnd[:])), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
		if err != nil && (!errors.Is(err, fs.ErrExist) || try > 100) {
			return "", fmt.Errorf("create stage file in %s: %w", dir, err)
		}
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		_ = f.Close()
		_ = os.Remove(name)
		return "", err
	}
	if err := SetOwnerMode(f, mode, uid, gid); err != nil {
		return fail(fmt.Errorf("stage file %s: %w", name, err))
	}
	if err := write(f); err != nil {
		return fail(fmt.Errorf("write stage file %s: %w", name, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("fsync stage file %s: %w", name, err))
	}
	if err := f.Close(); err != nil {
		return fail(fmt.Errorf("close stage file %s: %w", name, err))
	}
	return name, nil
}

// SetOwnerMode sets owner, then mode: chown clears setuid/setgid bits, so
// the order matters.
func SetOwnerMode(f *os.File, mode os.FileMode, uid, gid int) error {
	if uid != -1 || gid != -1 {
		if err := f.Chown(uid, gid); err != nil {
			return fmt.Errorf("chown to %d:%d: %w", uid, gid, err)
		}
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %#o: %w", mode, err)
	}
	return nil
}

// Replace renames from over to and fsyncs to's directory. A
// *NotDurableError means to was replaced but only the fsync failed; any
// other error means to was not replaced.
func Replace(from, to string) error {
	if err := os.Rename(from, to); err != nil {
		return err
	}
	if err := SyncDir(filepath.Dir(to)); err != nil {
		return &NotDurableError{Err: err}
	}
	return nil
}

// WriteFile replaces path with data, mode mode, owned by the process.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	stage, err := Stage(path, mode, -1, -1, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := Replace(stage, path); err != nil {
		if _, nd := errors.AsType[*NotDurableError](err); !nd {
			_ = os.Remove(stage)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// SyncDir makes a rename, creation or removal in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s for fsync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
