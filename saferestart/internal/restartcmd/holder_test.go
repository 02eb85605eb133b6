package restartcmd

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/restart"
)

// The holder a waiting (or timed-out) restart logs says how long its lease
// has left, that a dead host's lock frees itself then, and where to see the
// queue: its key and lease alone left the operator to work that out.
func TestEtcdLockerHolder(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := &etcdLocker{cli: cli, cfg: lock.Config{Name: "holder", TTL: 30, OpTimeout: 5 * time.Second, Info: lock.Info{Host: "m2", PID: 9}}}
	if got := l.Holder(ctx); got != restart.HolderUnknown {
		t.Errorf("no holder: %q", got)
	}
	s, err := l.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Release(context.Background()) }()
	if err := s.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := l.Holder(ctx)
	for _, want := range []string{
		s.Key() + " (lease ", "s left,", "host m2 pid 9",
		"; its lease expires in ", "s; if host m2 is gone, the lock frees itself then; `kube-apiserver-safe-restart status` shows the queue",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("holder %q lacks %q", got, want)
		}
	}
}
