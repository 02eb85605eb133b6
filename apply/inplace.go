package apply

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/template"
)

// An in-place write (a bind-mounted destination cannot be renamed over)
// can be torn by a crash: half new, half old bytes. So before it, the old
// content is kept beside the destination and the owed-reload record names
// the write; the next pass over the destination finds a torn file and
// restores the old content before anything else (then renders as usual).

// previousPath is where the content before an in-place write is kept. Its
// mode is 0600 whatever the destination's: it may hold a private key.
func previousPath(dest string) string {
	return filepath.Join(filepath.Dir(dest), "."+filepath.Base(dest)+".confd-previous")
}

// writeInPlaceKept is writeInPlace with the old content kept, and named by
// the record, until the new content is complete and fsynced.
func writeInPlaceKept(dest string, content template.Text, mode os.FileMode, uid, gid int, log logrus.FieldLogger) error {
	old, err := os.ReadFile(dest)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("write %s in place: keep its content: %w; %s left unchanged", dest, err, dest)
	}
	if err := atomicfile.WriteFile(previousPath(dest), old, 0o600); err != nil {
		return fmt.Errorf("write %s in place: keep its content: %w; %s left unchanged", dest, err, dest)
	}
	rec, err := readOwed(dest)
	if err == nil {
		rec.inPlace = &inPlaceWrite{old: contentSum(template.TextOf(old)), new: contentSum(content)}
		err = writeOwed(dest, rec)
	}
	if err != nil {
		_ = os.Remove(previousPath(dest))
		return fmt.Errorf("write %s in place: %w; %s left unchanged", dest, err, dest)
	}
	err = writeInPlace(dest, content, mode, uid, gid)
	if _, nd := errors.AsType[*atomicfile.NotDurableError](err); err != nil && !nd {
		// Untouched, or torn: settle it now rather than on the next pass.
		if rerr := repairInPlace(dest, log); rerr != nil {
			log.Warnf("%v", rerr)
		}
		return err
	}
	if err == nil {
		err = dropInPlace(dest)
	}
	return err
}

// repairInPlace settles an in-place write the record names: complete, or
// never begun, it only drops the copy and the record's line; torn (the
// live content matches neither side), it first writes the kept old
// content back in place and logs it. The pass that follows renders and
// writes as usual.
func repairInPlace(dest string, log logrus.FieldLogger) error {
	rec, err := readOwed(dest)
	if err != nil || rec.inPlace == nil {
		return err
	}
	live, err := readLive(dest)
	if err != nil {
		return fmt.Errorf("check %s after an in-place write: %w", dest, err)
	}
	if sum := contentSum(template.TextOf(live.content)); sum != rec.inPlace.old && sum != rec.inPlace.new {
		prev, err := os.ReadFile(previousPath(dest))
		if err != nil || contentSum(template.TextOf(prev)) != rec.inPlace.old {
			return fmt.Errorf("%s is torn by an interrupted in-place write, and its previous content %s is unusable (%v); it is rendered anew", dest, previousPath(dest), err)
		}
		if err := writeInPlace(dest, template.TextOf(prev), live.mode, live.uid, live.gid); err != nil {
			return fmt.Errorf("%s is torn by an interrupted in-place write; restore its previous content from %s: %w", dest, previousPath(dest), err)
		}
		log.Warnf("%s was torn by an interrupted in-place write (half old, half new content); restored its previous content from %s before rendering it anew", dest, previousPath(dest))
	}
	return dropInPlace(dest)
}

// dropInPlace removes the kept copy, then the record's line: a crash in
// between leaves a line whose copy is gone, for a file already complete.
func dropInPlace(dest string) error {
	if err := os.Remove(previousPath(dest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", previousPath(dest), err)
	}
	rec, err := readOwed(dest)
	if err != nil {
		return err
	}
	rec.inPlace = nil
	return writeOwed(dest, rec)
}
