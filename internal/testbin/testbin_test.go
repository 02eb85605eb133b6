package testbin

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// The sources a binary is built from are the module's files it imports and
// nothing of the standard library or the module cache: Build stats them so
// that `go test`'s cache notices a change to the binary's code.
func TestSources(t *testing.T) {
	files, err := Sources([]string{"./cmd/kube-apiserver-safe-restart"})
	if err != nil {
		t.Fatal(err)
	}
	root := etcdtest.RepoRoot()
	for _, want := range []string{"go.mod", "go.sum", "cmd/kube-apiserver-safe-restart/main.go", "saferestart/internal/keycmd/publishwatch.go", "internal/version/version.go"} {
		if !slices.Contains(files, filepath.Join(root, want)) {
			t.Errorf("sources lack %s", want)
		}
	}
	for _, f := range files {
		if rel, err := filepath.Rel(root, f); err != nil || !filepath.IsLocal(rel) {
			t.Errorf("%s is not the module's", f)
		}
	}
	if slices.Contains(files, filepath.Join(root, "cmd/confd/main.go")) {
		t.Error("confd's main is no source of the helper")
	}
}
