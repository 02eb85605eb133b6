package saferestart

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/cli"
	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// rotate-key opens one etcd client: its rotation and the restart of its
// install step (restartcmd.Step, which takes the client it is given and
// never dials) run on it. --dry-run goes through that restart's plan.
func TestRotateKeyOneClient(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	k := keytest.EC(t)
	signing := filepath.Join(dir, "sa.key")
	public := filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(signing, keytest.PKCS8PEM(t, k), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, keytest.PublicPEM(t, k.Public()), 0o644); err != nil {
		t.Fatal(err)
	}
	var dials atomic.Int32
	dial := func(e *cli.Etcd, ctx context.Context) (*clientv3.Client, error) {
		dials.Add(1)
		return e.Client(ctx)
	}
	var out, errb bytes.Buffer
	code := runWith(context.Background(), nil, []string{"rotate-key", "--config", "", "--endpoints", srv.Endpoint, "--host", "m1",
		"--signing-key", signing, "--public-key", public, "--health-url", "", "--dry-run", "--", "true"}, &out, &errb, dial)
	if code != cmdkit.ExitOK || !strings.Contains(out.String(), "dry run: no lock taken, nothing run") {
		t.Fatalf("rotate-key --dry-run: exit %d\nstdout %s\nstderr %s", code, out.String(), errb.String())
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("rotate-key dialled etcd %d times, want once", n)
	}
}
