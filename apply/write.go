package apply

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/resource"
	"github.com/keysync/confd/template"
)

// Writer is the file system side of Apply. FileWriter is the real one;
// tests inject faults through their own.
type Writer interface {
	// Stage writes content to a new file beside dest and returns its path.
	Stage(dest string, content template.Text, mode os.FileMode, uid, gid int) (string, error)
	// Replace puts the checked stage file's content at dest. An
	// *atomicfile.NotDurableError means dest was replaced but the change may not
	// survive a crash; any other error means dest was not replaced.
	Replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int) error
	// MarkOwed durably records that a reload is owed for each of contents
	// once it is live at dest; ClearOwed removes the record.
	MarkOwed(dest string, contents ...template.Text) error
	ClearOwed(dest string) error
}

// FileWriter writes to the local file systems; Log (Settings.Logger) is
// where an in-place write says why.
type FileWriter struct {
	Log logrus.FieldLogger
}

// Stage implements Writer.
func (w FileWriter) Stage(dest string, content template.Text, mode os.FileMode, uid, gid int) (string, error) {
	return atomicfile.Stage(dest, mode, uid, gid, func(w io.Writer) error {
		_, err := content.WriteTo(w)
		return err
	})
}

// StaleStageFile is a stage file that a killed confd left beside the
// destination of Resource.
type StaleStageFile struct {
	Resource *resource.Resource
	Path     string
}

// RemoveStaleStageFiles removes the stage files that a killed confd left
// beside the destinations of rs (named as atomicfile.Stage names them) and
// returns those it removed, and one error per problem (as LoadNamed). A
// destination's stage files are removed only under its lock, and those of
// a destination whose lock another process holds are left alone: they
// belong to that process's pass (an operator's -onetime must not delete
// the daemon's stage file while its check_cmd reads it). Each directory is
// listed once, whatever the number of resources writing into it: one
// listing per resource made a start-up with 1,000 files in one directory
// read a million entries. lockDir holds the locks (empty: DefaultLockDir).
func RemoveStaleStageFiles(rs []*resource.Resource, lockDir string) ([]StaleStageFile, []error) {
	lockDir = cmp.Or(lockDir, DefaultLockDir())
	byDir := map[string]map[string]*resource.Resource{} // directory, then dest's base name
	var dirs []string
	for _, r := range rs {
		dir, base := filepath.Split(r.Dest)
		if dir == "" {
			dir = "."
		}
		if byDir[dir] == nil {
			byDir[dir] = map[string]*resource.Resource{}
			dirs = append(dirs, dir)
		}
		// The destination's stage files, and those of its owed-reload
		// record and in-place copy (atomicfile.WriteFile's).
		for _, b := range []string{base, owedPrefix + base, "." + base + ".confd-previous"} {
			if _, ok := byDir[dir][b]; !ok { // the first in file-name order names it
				byDir[dir][b] = r
			}
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
		locks := map[string]*os.File{} // by destination; nil: held by another process
		for _, e := range entries {
			r, ok := byDir[dir][atomicfile.StageOf(e.Name())]
			if !ok {
				continue
			}
			l, tried := locks[r.Dest]
			if !tried {
				var p string
				if p, err = lockPath(lockDir, r.Dest); err == nil {
					l, err = tryLock(p)
				}
				// errNoDestDir only if dir went since it was listed.
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", r.File, err))
				}
				locks[r.Dest] = l
			}
			if l == nil {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("%s: remove stale stage file: %w", r.File, err))
				continue
			}
			removed = append(removed, StaleStageFile{Resource: r, Path: p})
		}
		for _, l := range locks {
			_ = l.Close()
		}
	}
	return removed, errs
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
	err := os.Chmod(stage, mode.Perm()&^0o007)
	if err == nil {
		err = os.Rename(stage, kept)
	}
	if err != nil {
		return "", fmt.Errorf("keep stage file: %w", err)
	}
	return kept, nil
}

// Replace implements Writer: it moves the checked stage file over dest and
// makes the rename durable. A bind-mounted dest cannot be renamed over
// (EBUSY) and a stage file on another device cannot be renamed (EXDEV):
// then the content is written in place, the only option left.
func (w FileWriter) Replace(stage, dest string, content template.Text, mode os.FileMode, uid, gid int) error {
	err := atomicfile.Replace(stage, dest)
	if _, nd := errors.AsType[*atomicfile.NotDurableError](err); err == nil || nd {
		return err
	}
	if !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EXDEV) {
		return fmt.Errorf("rename %s to %s: %w", stage, dest, err)
	}
	w.Log.Debugf("Rename failed (%v): %s is likely a mount point; writing in place", err, dest)
	return writeInPlaceKept(dest, content, mode, uid, gid, w.Log)
}

// writeInPlace overwrites dest without ever leaving it truncated for want
// of space: the blocks for the new content are reserved first, and until
// that succeeded nothing about dest (content, mode, owner) has changed.
func writeInPlace(dest string, content template.Text, mode os.FileMode, uid, gid int) error {
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE, mode.Perm())
	if err != nil {
		return fmt.Errorf("write %s in place: %w; %s left unchanged", dest, err, dest)
	}
	defer f.Close() // on the error paths; the last step closes it and reports
	if err := reserve(f, int64(content.Len())); err != nil {
		return fmt.Errorf("write %s in place: cannot reserve %d bytes: %w; %s left unchanged", dest, content.Len(), err, dest)
	}
	if err := atomicfile.SetOwnerMode(f, mode, uid, gid); err != nil {
		return fmt.Errorf("write %s in place: %w; its content is unchanged", dest, err)
	}
	if _, err := content.WriteTo(io.NewOffsetWriter(f, 0)); err != nil {
		return fmt.Errorf("write %s in place: %w; the file may now be partly written", dest, err)
	}
	if err := f.Truncate(int64(content.Len())); err != nil {
		return fmt.Errorf("write %s in place: truncate: %w; the file may hold old bytes after the new content", dest, err)
	}
	if err := f.Sync(); err != nil {
		return &atomicfile.NotDurableError{Err: fmt.Errorf("fsync %s: %w", dest, err)}
	}
	if err := f.Close(); err != nil {
		return &atomicfile.NotDurableError{Err: fmt.Errorf("close %s: %w", dest, err)}
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
