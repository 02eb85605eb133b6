package apply

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/template"
)

// An owed reload is recorded in a marker file beside the destination,
// ".confd-reload-owed.<name>", holding the SHA-256 of each content whose
// reload is owed (one "sha256:<hex>" line each; more than one while a new
// update is on its way over a file whose own reload is still owed). Beside the destination, not under a state directory:
// the directory is already writable (stage files are created there), the
// record shares the destination's fate (same file system, same backups,
// removed with it), it needs no new flag with a default that may not
// exist or be shared by several confd instances, and one directory fsync
// makes both the rename and the record durable. It is a dot file, which
// kubelet's manifest directory and usual *.conf globs ignore, like the
// stage files.
const owedPrefix = ".confd-reload-owed."

func owedPath(dest string) string {
	return filepath.Join(filepath.Dir(dest), owedPrefix+filepath.Base(dest))
}

func contentSum(t template.Text) string {
	h := sha256.New()
	_, _ = t.WriteTo(h) // a hash takes every write
	return hex.EncodeToString(h.Sum(nil))
}

type owedRecord struct {
	exists bool
	valid  bool // the record could be parsed
	sums   []string
	// inPlace is set while an in-place write may be under way: the sums of
	// the content before and after it, whose copy is in previousPath.
	inPlace *inPlaceWrite
}

type inPlaceWrite struct{ old, new string }

// covers reports whether the record owes a reload for content.
func (o owedRecord) covers(content []byte) bool {
	return slices.Contains(o.sums, contentSum(template.TextOf(content)))
}

// inPlacePrefix starts the record's line that names an in-place write and
// its copy of the old content: "in-place sha256:OLD sha256:NEW .NAME.confd-previous".
const inPlacePrefix = "in-place"

func readOwed(dest string) (owedRecord, error) {
	b, err := os.ReadFile(owedPath(dest))
	if errors.Is(err, fs.ErrNotExist) {
		return owedRecord{}, nil
	}
	if err != nil {
		return owedRecord{}, fmt.Errorf("read owed-reload record: %w", err)
	}
	o := owedRecord{exists: true, valid: true}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) == 4 && f[0] == inPlacePrefix && len(f[1]) == 71 && len(f[2]) == 71 {
			o.inPlace = &inPlaceWrite{old: strings.TrimPrefix(f[1], "sha256:"), new: strings.TrimPrefix(f[2], "sha256:")}
			continue
		}
		sum, ok := strings.CutPrefix(l, "sha256:")
		if !ok || len(sum) != 64 {
			o.valid = false
			continue
		}
		o.sums = append(o.sums, sum)
	}
	if len(o.sums) == 0 && o.inPlace == nil {
		o.valid = false
	}
	return o, nil
}

// writeOwed replaces the record with o's sums and in-place write, or
// removes it when o holds neither.
func writeOwed(dest string, o owedRecord) error {
	if len(o.sums) == 0 && o.inPlace == nil {
		p := owedPath(dest)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove owed-reload record %s: %w", p, err)
		}
		return atomicfile.SyncDir(filepath.Dir(p))
	}
	var b strings.Builder
	for _, s := range o.sums {
		b.WriteString("sha256:" + s + "\n")
	}
	if w := o.inPlace; w != nil {
		fmt.Fprintf(&b, "%s sha256:%s sha256:%s %s\n", inPlacePrefix, w.old, w.new, filepath.Base(previousPath(dest)))
	}
	if err := atomicfile.WriteFile(owedPath(dest), []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("record owed reload: %w", err)
	}
	return nil
}

// MarkOwed implements Writer: the record is written before the rename, so
// that no crash between the rename and the record can lose the reload.
func (FileWriter) MarkOwed(dest string, contents ...template.Text) error {
	o := owedRecord{}
	for _, c := range contents {
		o.sums = append(o.sums, contentSum(c))
	}
	return writeOwed(dest, o)
}

// ClearOwed implements Writer, once the reload succeeded (or the record was
// found stale): it keeps an in-place write the record names, and makes the
// removal durable.
func (FileWriter) ClearOwed(dest string) error {
	o, err := readOwed(dest)
	if err != nil {
		return err
	}
	return writeOwed(dest, owedRecord{inPlace: o.inPlace})
}

// ReloadPending reports a reload_cmd owed since its file was replaced: an
// owed-reload record that covers the live content (for metrics; Apply
// itself decides from the record).
func (r *File) ReloadPending() bool {
	rec, err := readOwed(r.Dest)
	if err != nil || !rec.exists {
		return err != nil
	}
	live, err := os.ReadFile(r.Dest)
	return err == nil && rec.covers(live)
}
