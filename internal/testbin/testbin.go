// Package testbin builds the project's commands once per end-to-end test
// package, so that the tests run the binaries an operator runs.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"github.com/keysync/confd/internal/etcdtest"
)

// Build compiles each package (a path relative to the module root, such as
// "./cmd/confd") into a fresh temporary directory under the given
// binary name, with extra `go build` flags. It returns the paths by name and
// a function that removes the directory.
func Build(flags []string, binaries map[string]string) (map[string]string, func(), error) {
	dir, err := os.MkdirTemp("", "confd-testbin-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	paths := make(map[string]string, len(binaries))
	for name, pkg := range binaries {
		out := filepath.Join(dir, name)
		args := append(append([]string{"build"}, flags...), "-o", out, pkg)
		cmd := exec.Command("go", args...)
		cmd.Dir = etcdtest.RepoRoot()
		// Static, as `make build` builds them (see the Makefile); but
		// the race detector, which a test may build a binary with, needs
		// cgo.
		if !slices.Contains(flags, "-race") {
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		}
		if msg, err := cmd.CombinedOutput(); err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("go build %s: %w\n%s", pkg, err, msg)
		}
		paths[name] = out
	}
	return paths, cleanup, nil
}
