package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make bench replaces the results block with the run's table, its
// headings one level down, and leaves the page around it alone.
func TestSpliceResults(t *testing.T) {
	p := filepath.Join(t.TempDir(), "results.md")
	page := "# Benchmark results\n\nmethod\n\n" + resultsBegin + "\nold table\n" + resultsEnd + "\n\nafter\n"
	if err := os.WriteFile(p, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	md := "# Benchmark results\n\nWritten on X.\n\n## Machine\n\n| a | b |\n"
	if err := spliceResults(p, md); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	want := "# Benchmark results\n\nmethod\n\n" + resultsBegin + "\nWritten on X.\n\n### Machine\n\n| a | b |\n" + resultsEnd + "\n\nafter\n"
	if string(got) != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if err := os.WriteFile(p, []byte("# no block\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := spliceResults(p, md); err == nil || !strings.Contains(err.Error(), "no results block") {
		t.Fatalf("a page without the block: %v", err)
	}
}

// A results file without the block (a new one, the smoke test's) gets the
// whole table; one with the block keeps what lies outside it.
func TestWriteResults(t *testing.T) {
	md := "# Benchmark results\n\nWritten on X.\n"
	fresh := filepath.Join(t.TempDir(), "results.md")
	if err := writeResults(fresh, md); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(fresh); string(got) != md {
		t.Fatalf("new file: got\n%s\nwant\n%s", got, md)
	}
	kept := filepath.Join(t.TempDir(), "results.md")
	page := "# Benchmark results\n\n" + resultsBegin + "\nold\n" + resultsEnd + "\n\n## Notes\n\nkept\n"
	if err := os.WriteFile(kept, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeResults(kept, md); err != nil {
		t.Fatal(err)
	}
	want := "# Benchmark results\n\n" + resultsBegin + "\nWritten on X.\n" + resultsEnd + "\n\n## Notes\n\nkept\n"
	if got, _ := os.ReadFile(kept); string(got) != want {
		t.Fatalf("file with a block: got\n%s\nwant\n%s", got, want)
	}
}
