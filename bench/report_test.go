package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// make bench replaces the docs' results block with the run's table, its
// headings one level down, and leaves the page around it alone.
func TestSpliceResults(t *testing.T) {
	p := filepath.Join(t.TempDir(), "performance.md")
	page := "# Performance\n\nmethod\n\n" + resultsBegin + "\nold table\n" + resultsEnd + "\n\nafter\n"
	if err := os.WriteFile(p, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	md := "# Benchmark results\n\nWritten on X.\n\n## Machine\n\n| a | b |\n"
	if err := spliceResults(p, md); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	want := "# Performance\n\nmethod\n\n" + resultsBegin + "\nWritten on X.\n\n### Machine\n\n| a | b |\n" + resultsEnd + "\n\nafter\n"
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
