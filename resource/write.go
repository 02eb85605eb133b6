package resource

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
)

// RemoveStaleStageFiles removes stage files beside Dest that a killed
// confd left behind (named as writeStage names them) and returns their paths.
func (r *Resource) RemoveStaleStageFiles() ([]string, error) {
	dir, base := filepath.Split(r.Dest)
	if dir == "" {
		dir = "."
	}
	matches, err := filepath.Glob(filepath.Join(dir, "."+globQuote(base)+".*"))
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, m := range matches {
		suffix := strings.TrimPrefix(filepath.Base(m), "."+base+".")
		if len(suffix) != 12 || strings.Trim(suffix, "0123456789abcdef") != "" {
			continue
		}
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%s: remove stale stage file: %w", r.File, err))
			continue
		}
		removed = append(removed, m)
	}
	return removed, errors.Join(errs...)
}

func globQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`)
	return r.Replace(s)
}

// writeStage creates a stage file beside dest (so that rename is atomic),
// gives it its final owner and mode before a single byte is written, then
// writes and fsyncs it. It returns the stage file's path.
func writeStage(dest string, content []byte, mode os.FileMode, uid, gid int) (string, error) {
	dir, base := filepath.Split(dest)
	if dir == "" {
		dir = "."
	}
	var f *os.File
	for try := 0; ; try++ {
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		name := filepath.Join(dir, "."+base+"."+hex.EncodeToString(rnd[:]))
		// The umask can only narrow mode.Perm(), never widen it; fixFile sets it exactly.
		var err error
		f, err = os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode.Perm())
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || try > 100 {
			return "", fmt.Errorf("create stage file in %s: %w", dir, err)
		}
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		_ = f.Close()
		_ = os.Remove(name)
		return "", err
	}
	if err := fixFile(f, mode, uid, gid); err != nil {
		return fail(fmt.Errorf("stage file %s: %w", name, err))
	}
	if _, err := f.Write(content); err != nil {
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

// fixFile sets owner, then mode: chown clears setuid/setgid bits, so the
// order matters.
func fixFile(f *os.File, mode os.FileMode, uid, gid int) error {
	if err := f.Chown(uid, gid); err != nil {
		return fmt.Errorf("chown to %d:%d: %w", uid, gid, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %#o: %w", mode, err)
	}
	return nil
}

// replace moves the checked stage file over dest and makes the rename
// durable. A bind-mounted dest cannot be renamed over (EBUSY) and a stage
// file on another device cannot be renamed (EXDEV): then the content is
// written in place and fsynced, the only option left.
func replace(stage, dest string, content []byte, mode os.FileMode, uid, gid int, log logrus.FieldLogger) error {
	err := os.Rename(stage, dest)
	if err == nil {
		return syncDir(filepath.Dir(dest))
	}
	if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("rename %s to %s: %w", stage, dest, err)
	}
	log.Debugf("Rename failed (%v): %s is likely a mount point; writing in place", err, dest)
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode.Perm())
	if err != nil {
		return fmt.Errorf("write %s in place: %w", dest, err)
	}
	if err := fixFile(f, mode, uid, gid); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: %w", dest, err)
	}
	if _, err := f.Write(content); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: %w", dest, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fsync %s: %w", dest, err)
	}
	return f.Close()
}

func syncDir(dir string) error {
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
