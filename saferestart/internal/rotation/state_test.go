package rotation

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

func TestClaimStopsASecondRotation(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cli := srv.Client(t)
	c1, err := Acquire(ctx, cli, DefaultPrefix, "m1", "op-a", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(ctx, srv.Client(t), DefaultPrefix, "m1", "op-b", 2, 0)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "op-a") {
		t.Fatalf("second claim: %v, want ErrBusy naming op-a", err)
	}
	// Another host's rotation is independent.
	c3, err := Acquire(ctx, srv.Client(t), DefaultPrefix, "m2", "op-b", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = c3.Withdraw()
	// A claim whose process died (client gone, lease not revoked) is taken
	// over once its lease expires, by a claimer willing to wait that long.
	dead, err := clientv3.New(srv.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	_ = c1.Withdraw()
	if _, err := Acquire(ctx, dead, DefaultPrefix, "m1", "killed", 1, 0); err != nil {
		t.Fatal(err)
	}
	_ = dead.Close()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c2, err := Acquire(wctx, cli, DefaultPrefix, "m1", "op-b", 2, 20*time.Second)
	if err != nil {
		t.Fatalf("claim after the holder died: %v", err)
	}
	_ = c2.Withdraw()
}

func TestEtcdStoreRoundTrip(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	s := &EtcdStore{KV: srv.Client(t), Prefix: DefaultPrefix, Host: "m1.example"}
	if st, err := s.Load(ctx); err != nil || st != nil {
		t.Fatalf("empty load: %v %v", st, err)
	}
	want := State{Host: "m1.example", Phase: PhasePublished, Previous: "a", Next: "b", Started: time.Now().UTC().Truncate(time.Second)}
	if err := s.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx)
	if err != nil || got.Phase != want.Phase || got.Next != "b" || !got.Started.Equal(want.Started) {
		t.Fatalf("load %+v %v", got, err)
	}
	srv.Put(t, s.Key(), "garbage")
	if _, err := s.Load(ctx); err == nil || !strings.Contains(err.Error(), s.Key()) {
		t.Fatalf("garbage state: %v, want an error naming the key", err)
	}
}
