//go:build benchsmoke

// The smoke run is not part of `go test ./...` (make test): it times
// nothing, takes minutes on 2 cores, and CI runs it with `make bench-smoke`.

package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/testbin"
	"github.com/keysync/confd/internal/toolbin"
)

// TestSmoke runs the whole harness in its smoke mode (tiny data, one run)
// against freshly built binaries, so that `make bench` keeps working: every
// scenario must run, render what it must (the harness checks line counts
// and, with a reference, identical bytes) and land in the table. It judges
// no timing.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs daemons")
	}
	// Before building: without etcd there is nothing to build for.
	etcdDir := filepath.Dir(toolbin.Etcd(t, "etcd"))
	bins, cleanup, err := testbin.Build(nil, map[string]string{"confd": "./cmd/confd", "safe-restart": "./cmd/kube-apiserver-safe-restart"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := config{
		Confd:       bins["confd"],
		Ref:         os.Getenv("CONFD_REF"),
		SafeRestart: bins["safe-restart"],
		EtcdDir:     etcdDir,
		Smoke:       true,
		Out:         filepath.Join(t.TempDir(), "results.md"),
		WorkDir:     t.TempDir(),
		Root:        etcdtest.RepoRoot(),
		Log:         io.Discard,
	}
	rep, err := runBench(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rep.rows {
		seen[strings.Fields(r.scenario)[0]] = true
		if r.binary == "confd" && len(r.samples) == 0 {
			t.Errorf("%s: no samples for confd", r.scenario)
		}
	}
	for _, target := range []string{"1", "2", "3", "4", "5", "6"} {
		if !seen[target] {
			t.Errorf("no row for target %s:\n%s", target, rep.table())
		}
	}
	md, err := os.ReadFile(c.Out)
	if err != nil || !strings.Contains(string(md), "SMOKE") || !strings.Contains(string(md), "| 1 flat | confd |") ||
		!strings.Contains(string(md), "| 2 dirs×10 | confd |") {
		t.Errorf("results file: %v\n%s", err, md)
	}
}
