package atomicfile

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A stage file's name (as Stage makes it) is recognised as exactly that,
// for the destination it belongs to.
func TestStageOfNamesStageMakes(t *testing.T) {
	dir := t.TempDir()
	for _, base := range []string{"out.conf", "a", ".hidden", "x.0123456789ab", "sa.pub"} {
		stage, err := Stage(filepath.Join(dir, base), 0o600, os.Geteuid(), os.Getegid(), func(w io.Writer) error {
			_, err := io.WriteString(w, "x")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := StageOf(filepath.Base(stage)); got != base {
			t.Errorf("StageOf(%q) = %q, want %q", filepath.Base(stage), got, base)
		}
	}
}

// WriteFile leaves the new content with its mode, and no stage file.
func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if b, _ := os.ReadFile(p); err != nil || string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Errorf("after WriteFile: %q, %v, %v", b, fi.Mode(), err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Errorf("%d files left in the directory, want 1", len(es))
	}
}
