package resource

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/template"
)

// Writer is the file system side of Apply. FileWriter is the real one;
// tests inject faults through their own.
type Writer interface {
	// Stage writes content to a new file beside dest and returns its path.
	Stage(dest string, content template.Text, mode os.FileMode, uid, gid int) (string, error)
	// Replace puts the checked stage file's content at dest. A
	// *NotDurableError means dest was replaced but the change may not
	// survive a crash; any other error means dest was not replaced.
	Replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int) error
	// MarkOwed durably records that a reload is owed for each of contents
	// once it is live at dest; ClearOwed removes the record.
	MarkOwed(dest string, contents ...template.Text) error
	ClearOwed(dest string) error
}

// NotDurableError says dest already holds the new content, but making that
// durable failed.
type NotDurableError struct{ Err error }

func (e *NotDurableError) Error() string { return e.Err.Error() }
func (e *NotDurableError) Unwrap() error { return e.Err }

// FileWriter writes to the local file systems.
type FileWriter struct {
	Log logrus.FieldLogger
}

// Stage implements Writer.
func (w FileWriter) Stage(dest string, content template.Text, mode os.FileMode, uid, gid int) (string, error) {
	return writeStage(dest, content, mode, uid, gid)
}

// Replace implements Writer.
func (w FileWriter) Replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int) error {
	log := w.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	return replace(stage, dest, content, mode, uid, gid, log)
}

// MarkOwed implements Writer.
func (FileWriter) MarkOwed(dest string, contents ...template.Text) error {
	return markOwed(dest, contents...)
}

// ClearOwed implements Writer.
func (FileWriter) ClearOwed(dest string) error { return clearOwed(dest) }

// StaleStageFile is a stage file that a killed confd left beside the
// destination of Resource.
type StaleStageFile struct {
	Resource *Resource
	Path     string
}

// RemoveStaleStageFiles removes the stage files that a killed confd left
// beside the destinations of rs (named as writeStage names them) and returns
// those it removed, and one error per problem (as LoadNamed). Each directory
// is listed once, whatever the number of resources writing into it: one
// listing per resource made a start-up with 1,000 files in one directory
// read a million entries.
func RemoveStaleStageFiles(rs []*Resource) ([]StaleStageFile, []error) {
	byDir := map[string]map[string]*Resource{} // directory, then dest's base name
	var dirs []string
	for _, r := range rs {
		dir, base := filepath.Split(r.Dest)
		if dir == "" {
			dir = "."
		}
		if byDir[dir] == nil {
			byDir[dir] = map[string]*Resource{}
			dirs = append(dirs, dir)
		}
		if _, ok := byDir[dir][base]; !ok { // the first in file-name order names it
			byDir[dir][base] = r
		}
	}
	var removed []StaleStageFile
	var errs []error
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			// A missing directory has no stage files; writing will say
			// what else is wrong with it.
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("look for stale stage files: %w", err))
			}
			continue
		}
		for _, e := range entries {
			r, ok := byDir[dir][stageOf(e.Name())]
			if !ok {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("%s: remove stale stage file: %w", r.File, err))
				continue
			}
			removed = append(removed, StaleStageFile{Resource: r, Path: p})
		}
	}
	return removed, errs
}

// stageRandom is how many random bytes a stage file's name ends with, in
// hex: "." + base + "." + 2*stageRandom hex digits.
const stageRandom = 6

// stageOf is the base name of the destination whose stage file name is, as
// writeStage names them, or "".
func stageOf(name string) string {
	const suffix = 1 + 2*stageRandom
	if len(name) < 1+1+suffix || name[0] != '.' || name[len(name)-suffix] != '.' {
		return ""
	}
	if strings.Trim(name[len(name)-2*stageRandom:], "0123456789abcdef") != "" {
		return ""
	}
	return name[1 : len(name)-suffix]
}

// writeStage creates a stage file beside dest (so that rename is atomic),
// gives it its final owner and mode before a single byte is written, then
// writes and fsyncs it. It returns the stage file's path.
func writeStage(dest string, content template.Text, mode os.FileMode, uid, gid int) (string, error) {
	dir, base := filepath.Split(dest)
	if dir == "" {
		dir = "."
	}
	var f *os.File
	for try := 0; ; try++ {
		var rnd [stageRandom]byte
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
	if _, err := content.WriteTo(f); err != nil {
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

// keptStagePath is where a refused stage file is kept: one fixed name per
// destination, so that retries replace it rather than pile up copies.
func keptStagePath(dest string) string {
	return filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".confd-rejected")
}

// keepStage moves a refused stage file to keptStagePath. It may hold a
// private key the check refused to publish, so it never stays readable by
// others, whatever the resource's mode.
func keepStage(stage, dest string, mode os.FileMode) (string, error) {
	kept := keptStagePath(dest)
	if err := os.Chmod(stage, mode.Perm()&^0o007); err != nil {
		return "", fmt.Errorf("keep stage file: %w", err)
	}
	if err := os.Rename(stage, kept); err != nil {
		return "", fmt.Errorf("keep stage file: %w", err)
	}
	return kept, nil
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
// written in place, the only option left.
func replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int, log logrus.FieldLogger) error {
	err := os.Rename(stage, dest)
	if err == nil {
		if err := syncDir(filepath.Dir(dest)); err != nil {
			return &NotDurableError{Err: err}
		}
		return nil
	}
	if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("rename %s to %s: %w", stage, dest, err)
	}
	log.Debugf("Rename failed (%v): %s is likely a mount point; writing in place", err, dest)
	return writeInPlace(dest, content, mode, uid, gid)
}

// writeInPlace overwrites dest without ever leaving it truncated for want
// of space: the blocks for the new content are reserved first, and until
// that succeeded nothing about dest (content, mode, owner) has changed.
func writeInPlace(dest string, content template.Text, mode os.FileMode, uid, gid int) error {
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE, mode.Perm())
	if err != nil {
		return fmt.Errorf("write %s in place: %w; %s left unchanged", dest, err, dest)
	}
	if err := reserve(f, int64(content.Len())); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: cannot reserve %d bytes: %w; %s left unchanged", dest, content.Len(), err, dest)
	}
	if err := fixFile(f, mode, uid, gid); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: %w; its content is unchanged", dest, err)
	}
	if _, err := content.WriteTo(io.NewOffsetWriter(f, 0)); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: %w; the file may now be partly written", dest, err)
	}
	if err := f.Truncate(int64(content.Len())); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s in place: truncate: %w; the file may hold old bytes after the new content", dest, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return &NotDurableError{Err: fmt.Errorf("fsync %s: %w", dest, err)}
	}
	if err := f.Close(); err != nil {
		return &NotDurableError{Err: fmt.Errorf("close %s: %w", dest, err)}
	}
	return nil
}

// reserve allocates the blocks for the first n bytes of f without changing
// its size or content, so that the overwrite that follows cannot run out
// of space half way. File systems without fallocate get a free-space check
// instead, which narrows the window but cannot close it.
func reserve(f *os.File, n int64) error {
	if n == 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, n)
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("fallocate unsupported and statfs failed: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if need := n - fi.Size(); need > 0 && int64(st.Bavail)*st.Bsize < need {
		return fmt.Errorf("fallocate unsupported and only %d bytes free: %w", int64(st.Bavail)*st.Bsize, unix.ENOSPC)
	}
	return nil
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
