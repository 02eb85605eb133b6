package status

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
)

// A helper killed mid-restart left its intent: status shows the line held,
// naming the host; a live intent is shown, and holds nothing.
func TestCollectIntents(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	started := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	put := func(host string) int64 {
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		if err := (&hold.Store{C: cli, HoldKey: "l-hold", Host: host}).SetIntent(ctx, hold.Intent{Lease: int64(l.ID), Started: started, What: "systemctl restart kube-apiserver"}); err != nil {
			t.Fatal(err)
		}
		return int64(l.ID)
	}
	put("m3")
	r, err := Collect(ctx, cli, "l", "l-hold", "/rot")
	if err != nil || r.Hold != nil || len(r.Intents) != 1 || r.Intents[0].Orphaned {
		t.Fatalf("live intent: %+v %v", r, err)
	}
	var b bytes.Buffer
	_ = r.WriteText(&b)
	if !strings.Contains(b.String(), "hold:    none") || !strings.Contains(b.String(), "intent:  m3 live (restart under way), started 2030-01-01T00:00:00Z") {
		t.Errorf("text:\n%s", b.String())
	}

	if _, err := cli.Revoke(ctx, clientv3.LeaseID(put("m2"))); err != nil {
		t.Fatal(err)
	}
	r, err = Collect(ctx, cli, "l", "l-hold", "/rot")
	if err != nil || r.Hold == nil || r.Hold.Host != "m2" || len(r.Intents) != 2 {
		t.Fatalf("orphaned intent: %+v %v", r, err)
	}
	b.Reset()
	_ = r.WriteText(&b)
	for _, want := range []string{"hold:    ACTIVE (l-hold): host m2 at 2030-01-01T00:00:00Z: the helper on m2 died mid-restart", "intent:  m2 ORPHANED"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	_ = r.WriteJSON(&b)
	if !strings.Contains(b.String(), `"orphaned": true`) || !strings.Contains(b.String(), `"host": "m2"`) {
		t.Errorf("json:\n%s", b.String())
	}
}

// Collect asks etcd how long the holder's lease has left, so that status
// says when the lock of a host that died frees itself.
func TestCollectHolderTTL(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	// A holder as etcdctl lock leaves it: a key on its lease, no info.
	if _, err := cli.Put(ctx, lock.Prefix("l")+strconv.FormatInt(int64(l.ID), 16), "", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	r, err := Collect(ctx, cli, "l", "l-hold", "/rot")
	if err != nil || r.Holder == nil || r.Holder.TTL < 1 || r.Holder.TTL > 60 {
		t.Fatalf("holder %+v (lease TTL 60), %v", r.Holder, err)
	}
	var b bytes.Buffer
	_ = r.WriteText(&b)
	if !strings.Contains(b.String(), "if its holder is gone, the lock frees itself then") {
		t.Errorf("status lacks the advice:\n%s", b.String())
	}
}
