// Package testbin builds the project's commands once per end-to-end test
// package, so that the tests run the binaries an operator runs.
package testbin

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

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
	if err := statSources(slices.Collect(maps.Values(binaries))); err != nil {
		cleanup()
		return nil, nil, err
	}
	return paths, cleanup, nil
}

// statSources stats every source file of the module that the packages are
// built from. `go test` caches a result by the files the test process
// opened or statted: without this, a test package that runs a binary built
// here would be served from the cache after the binary's code changed,
// since the build ran in another process.
func statSources(pkgs []string) error {
	files, err := Sources(pkgs)
	if err != nil {
		return err
	}
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("source of a test binary: %w", err)
		}
	}
	return nil
}

// Sources are the module's files the packages are built from (go.mod,
// go.sum and the Go files of every package of this module they import).
func Sources(pkgs []string) ([]string, error) {
	root := etcdtest.RepoRoot()
	args := append([]string{"list", "-deps", "-f", `{{if and .Module .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", strings.Join(pkgs, " "), err)
	}
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	return append(files, strings.Fields(string(out))...), nil
}
