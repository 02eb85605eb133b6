package backends_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestConsumersLinkNoEtcd: the watch's event types live in backends so that
// daemon (scheduling policy) and backends itself link no etcd client and no
// gRPC; only backends/connect, which opens a store, does. An alias of
// etcdv3's types here made daemon link 67 gRPC packages.
func TestConsumersLinkNoEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, pkg := range []string{"github.com/keysync/confd/backends", "github.com/keysync/confd/daemon"} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "google.golang.org/grpc") || strings.HasPrefix(dep, "go.etcd.io/") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
