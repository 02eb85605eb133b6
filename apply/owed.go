package apply

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
}

// covers reports whether the record owes a reload for content.
func (o owedRecord) covers(content []byte) bool {
	sum := contentSum(template.TextOf(content))
	for _, s := range o.sums {
		if s == sum {
			return true
		}
	}
	return false
}

func readOwed(dest string) (owedRecord, error) {
	b, err := os.ReadFile(owedPath(dest))
	if errors.Is(err, fs.ErrNotExist) {
		return owedRecord{}, nil
	}
	if err != nil {
		return owedRecord{}, fmt.Errorf("read owed-reload record: %w", err)
	}
	o := owedRecord{exists: true, valid: true}
	for _, l := range strings.Fields(string(b)) {
		sum, ok := strings.CutPrefix(l, "sha256:")
		if !ok || len(sum) != 64 {
			o.valid = false
			continue
		}
		o.sums = append(o.sums, sum)
	}
	if len(o.sums) == 0 {
		o.valid = false
	}
	return o, nil
}

// markOwed records, durably, that a reload is owed for each of contents once
// it is live. It is written before the rename, so that no crash between the
// rename and the record can lose the reload.
func markOwed(dest string, contents ...template.Text) error {
	var b strings.Builder
	for _, c := range contents {
		b.WriteString("sha256:" + contentSum(c) + "\n")
	}
	if err := atomicfile.WriteFile(owedPath(dest), []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("record owed reload: %w", err)
	}
	return nil
}

// clearOwed removes the record once the reload succeeded (or was found
// stale) and makes the removal durable.
func clearOwed(dest string) error {
	p := owedPath(dest)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove owed-reload record %s: %w", p, err)
	}
	return atomicfile.SyncDir(filepath.Dir(p))
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
