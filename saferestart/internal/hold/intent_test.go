package hold

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

// putIntent writes host's intent with a fresh lease; revoked, it plays a
// helper SIGKILLed mid-restart (its intent stays, its lease goes).
func putIntent(t *testing.T, cli *clientv3.Client, host string, revoked bool) {
	t.Helper()
	ctx := context.Background()
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := (&Store{C: cli, HoldKey: "h", Host: host}).SetIntent(ctx, Intent{PID: 7, Lease: int64(l.ID), Started: at, What: "systemctl restart kube-apiserver"}); err != nil {
		t.Fatal(err)
	}
	if revoked {
		if _, err := cli.Revoke(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOrphanedIntentHolds(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	putIntent(t, cli, "m2", true)
	putIntent(t, cli, "m3", false)

	// Stored with no lease, under the hold key, and invisible to its exact read.
	resp, _ := cli.Get(ctx, "h/intent/m2")
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease != 0 {
		t.Fatalf("intent key %+v", resp.Kvs)
	}
	if r, err := Get(ctx, cli, "h"); r != nil || err != nil {
		t.Fatalf("the hold's exact read sees intents: %v %v", r, err)
	}

	r, _, err := Active(ctx, cli, "h", "m1")
	if err != nil || r == nil {
		t.Fatalf("another host: %v %v, want the orphan as a hold", r, err)
	}
	s := r.String()
	for _, want := range []string{"host m2 (pid 7)", "2030-01-02T03:04:05Z", "died mid-restart", "systemctl restart kube-apiserver", "m2's next successful restart clears this", "unhold"} {
		if !strings.Contains(s, want) {
			t.Errorf("hold %q lacks %q", s, want)
		}
	}
	if strings.Contains(s, "m3") {
		t.Errorf("a live intent counted as a hold: %q", s)
	}
	// The owner's own orphan does not hold the owner: its retry clears it.
	if r, _, err := Active(ctx, cli, "h", "m2"); r != nil || err != nil {
		t.Fatalf("owner: %v %v, want no hold", r, err)
	}
	// Beside a real hold, the orphan is listed after it.
	if _, err := Add(ctx, cli, "h", Record{Host: "op", Reason: "maintenance"}); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := Active(ctx, cli, "h", "m2"); r == nil || r.Host != "op" || len(r.Also) != 0 {
		t.Fatalf("hold, owner: %+v", r)
	}
	if r, _, _ := Active(ctx, cli, "h", "m1"); r == nil || r.Host != "op" || len(r.Also) != 1 || r.Also[0].Host != "m2" {
		t.Fatalf("hold and orphan: %+v", r)
	}
	if _, err := Delete(ctx, cli, "h"); err != nil {
		t.Fatal(err)
	}

	// unhold's part: orphans go, live intents stay.
	gone, err := ClearOrphans(ctx, cli, "h")
	if err != nil || len(gone) != 1 || gone[0].Host != "m2" {
		t.Fatalf("cleared %+v %v, want m2's", gone, err)
	}
	if r, _, err := Active(ctx, cli, "h", ""); r != nil || err != nil {
		t.Fatalf("after unhold: %v %v", r, err)
	}
	in, err := Intents(ctx, cli, "h")
	if err != nil || len(in) != 1 || in[0].Host != "m3" || in[0].Orphaned {
		t.Fatalf("left %+v %v, want m3's live intent", in, err)
	}
}

// forget-host's hook, and the owner's clean-up: one host's intent goes.
func TestDeleteIntent(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	putIntent(t, cli, "m2", true)
	putIntent(t, cli, "m3", true)
	if ok, err := DeleteIntent(ctx, cli, "h", "m2"); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if ok, err := DeleteIntent(ctx, cli, "h", "m2"); ok || err != nil {
		t.Fatalf("second delete: %v %v", ok, err)
	}
	if r, _, _ := Active(ctx, cli, "h", ""); r == nil || r.Host != "m3" || len(r.Also) != 0 {
		t.Fatalf("left %+v, want m3's orphan alone", r)
	}
}

// A value written by hand under the intents holds (no lease shows it live),
// naming the host from its key.
func TestRawIntentHolds(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, "h/intent/m4", "restarting"); err != nil {
		t.Fatal(err)
	}
	r, _, err := Active(ctx, cli, "h", "m1")
	if err != nil || r == nil || r.Host != "m4" || !strings.Contains(r.String(), `"restarting"`) {
		t.Fatalf("%+v %v", r, err)
	}
}
