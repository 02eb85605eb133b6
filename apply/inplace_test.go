package apply

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/template"
)

// A destination torn by an interrupted in-place write (the record names
// the write, the live content matches neither side) is restored from the
// kept copy, with a warning, before the pass renders; the pass then writes
// the new content, and neither copy nor record line is left.
func TestTornInPlaceWriteIsRestoredFirst(t *testing.T) {
	f := newFixture(t, "")
	var hook *test.Hook
	f.s, hook = testSettings(f.dir)
	old, rendered := []byte("name=zero, a longer old line\n"), []byte("name=one\n")
	if err := os.WriteFile(f.dest, []byte("name=one, a longer old line\n"), 0o640); err != nil { // torn: new head, old tail
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(previousPath(f.dest), old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeOwed(f.dest, owedRecord{inPlace: &inPlaceWrite{old: contentSum(template.TextOf(old)), new: contentSum(template.TextOf(rendered))}}); err != nil {
		t.Fatal(err)
	}
	r := f.load()
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f.dest); got != string(rendered) {
		t.Errorf("dest = %q, want %q", got, rendered)
	}
	var torn, outOfSync int
	for i, e := range hook.AllEntries() {
		switch {
		case e.Level == logrus.WarnLevel && strings.Contains(e.Message, "torn by an interrupted in-place write") && strings.Contains(e.Message, "restored"):
			torn = i + 1
		case strings.Contains(e.Message, "out of sync"):
			outOfSync = i + 1
		}
	}
	if torn == 0 || outOfSync == 0 || torn > outOfSync {
		t.Errorf("want the restore logged (entry %d) before the render's verdict (entry %d)", torn, outOfSync)
	}
	for _, p := range []string{previousPath(f.dest), owedPath(f.dest)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}

// An in-place write that completed (or never began) leaves nothing to
// restore: the next pass drops the copy and the line, and logs no tear.
func TestCompleteInPlaceWriteIsOnlyCleanedUp(t *testing.T) {
	f := newFixture(t, "")
	var hook *test.Hook
	f.s, hook = testSettings(f.dir)
	rendered := []byte("name=one\n")
	if err := os.WriteFile(f.dest, rendered, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.WriteFile(previousPath(f.dest), []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeOwed(f.dest, owedRecord{sums: []string{contentSum(template.TextOf(rendered))}, inPlace: &inPlaceWrite{old: contentSum(template.TextOf([]byte("old\n"))), new: contentSum(template.TextOf(rendered))}}); err != nil {
		t.Fatal(err)
	}
	rec, _ := readOwed(f.dest)
	if !rec.valid || len(rec.sums) != 1 || rec.inPlace == nil {
		t.Fatalf("record read back as %+v", rec)
	}
	r := f.load()
	if _, err := r.Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "torn") {
			t.Errorf("logged %q for a complete write", e.Message)
		}
	}
	if _, err := os.Stat(previousPath(f.dest)); !os.IsNotExist(err) {
		t.Errorf("copy left: %v", err)
	}
}

func readAll(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
