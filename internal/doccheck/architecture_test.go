package doccheck

import (
	"bufio"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestArchitectureListsEveryPackage holds the "## Packages" section of
// docs/architecture.md to the module's directories of Go files: each
// package has a row, and each row names a package that exists. Packages are
// found by walking the tree rather than from a fixed list, so a package
// added on any branch fails here until its row is written, with the row's
// start in the message.
func TestArchitectureListsEveryPackage(t *testing.T) {
	root := moduleRoot(t)
	pkgs := modulePackages(t, root)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under %s: the walk is broken", len(pkgs), root)
	}
	rows := documentedPackages(t, filepath.Join(root, "docs", "architecture.md"))
	if len(rows) == 0 {
		t.Fatal(`docs/architecture.md: no package rows under "## Packages"`)
	}
	for _, p := range slices.Sorted(maps.Keys(pkgs)) {
		if !rows[p] {
			t.Errorf("package %s is missing from docs/architecture.md; add a row such as:\n| `%s` | %s |", p, p, docSummary(filepath.Join(root, p)))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(rows)) {
		if !pkgs[p] {
			t.Errorf("docs/architecture.md names package %s, which has no Go files: remove or rename its row", p)
		}
	}
}

// moduleRoot is the directory of the go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// modulePackages returns the slash-separated directories, relative to root,
// that hold at least one .go file: test-only packages (integration) and
// files behind build tags (the rehearsal's) count, which `go list ./...`
// without those tags would miss. It skips what the go command skips:
// testdata, directories starting with "." or "_" (.tools holds the sources
// make builds etcd and kube-apiserver from), and nested modules.
func modulePackages(t *testing.T, root string) map[string]bool {
	t.Helper()
	pkgs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			name := d.Name()
			if name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			if rel != "." {
				pkgs[filepath.ToSlash(rel)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "main.go")); err == nil {
		t.Error("main.go at the module root: the binaries' mains live under cmd/")
	}
	return pkgs
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// documentedPackages returns the packages the "## Packages" section's table
// rows name: every code span in a row's first cell, without a trailing
// slash. Header and separator rows name none.
func documentedPackages(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]bool{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line) == "## Packages"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			p := strings.TrimSuffix(m[1], "/")
			if rows[p] {
				t.Errorf("%s: package %s has two rows", path, p)
			}
			rows[p] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// docSummary is the first sentence of the package's doc comment, as a
// starting point for its row.
func docSummary(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil || f.Doc == nil {
			continue
		}
		s := strings.Join(strings.Fields(f.Doc.Text()), " ")
		if i := strings.Index(s, ". "); i >= 0 {
			s = s[:i+1]
		}
		return s
	}
	return "ITS ONE JOB"
}
