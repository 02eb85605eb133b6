package lock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/keysync/confd/internal/etcdtest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func open(t *testing.T, cli *clientv3.Client, name string, pid int) *Session {
	t.Helper()
	s, err := Open(ctxT(t), cli, Config{Name: name, TTL: 5, OpTimeout: 5 * time.Second,
		Info: Info{Host: "host-" + fmt.Sprint(pid), PID: pid, Started: time.Now()}})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = s.Release(context.Background()) })
	return s
}

// waitQueueLen blocks until the lock has n keys, watching rather than polling.
func waitQueueLen(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	ctx := ctxT(t)
	for {
		resp, err := cli.Get(ctx, Prefix(name), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if int(resp.Count) == n {
			return
		}
		wc := cli.Watch(ctx, Prefix(name), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		select {
		case <-wc:
		case <-ctx.Done():
			t.Fatalf("queue of %s never reached %d keys", name, n)
		}
	}
}

// TestLock runs the cases against one etcd (starting one costs about a
// second), in parallel, each under its own lock name.
func TestLock(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	for name, f := range map[string]func(*testing.T, *clientv3.Client){
		"LockReleaseAndEnv":               testLockReleaseAndEnv,
		"FIFOAndInteropWithPlainMutex":    testFIFOAndInteropWithPlainMutex,
		"CancelWhileWaitingRemovesWaiter": testCancelWhileWaitingRemovesWaiter,
		"TimeoutWhileWaiting":             testTimeoutWhileWaiting,
		"LostLeaseIsNotReleased":          testLostLeaseIsNotReleased,
		"LeaseLostWhileWaiting":           testLeaseLostWhileWaiting,
		"DeletedKeyIsLost":                testDeletedKeyIsLost,
		"HolderTTLAndAdvice":              testHolderTTLAndAdvice,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, cli)
		})
	}
}

// The holder's entry tells how long its lease has left and that a dead
// host's lock frees itself then: key and lease alone said neither.
func testHolderTTLAndAdvice(t *testing.T, cli *clientv3.Client) {
	sess := open(t, cli, "ttl", 7)
	if err := sess.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	q, _, err := Queue(ctxT(t), cli, "ttl")
	if err != nil || len(q) != 1 {
		t.Fatalf("queue = %+v, %v", q, err)
	}
	if q[0].Advice() != "" {
		t.Errorf("advice without a TTL asked: %q", q[0].Advice())
	}
	if err := FillTTL(ctxT(t), cli, &q[0]); err != nil || q[0].TTL < 1 || q[0].TTL > 5 {
		t.Fatalf("TTL %d (lease TTL 5), %v", q[0].TTL, err)
	}
	want := fmt.Sprintf("its lease expires in %ds; if host host-7 is gone, the lock frees itself then", q[0].TTL)
	if got := q[0].Advice(); got != want {
		t.Errorf("advice %q, want %q", got, want)
	}
	if got := q[0].String(); !strings.Contains(got, fmt.Sprintf("lease %s, %ds left,", sess.LeaseHex(), q[0].TTL)) {
		t.Errorf("entry %q lacks the TTL left", got)
	}
	if err := sess.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A lease gone by the time it is asked about: no TTL, no advice.
	gone := q[0]
	gone.TTL = 0
	if err := FillTTL(ctxT(t), cli, &gone); err != nil || gone.TTL != 0 || gone.Advice() != "" {
		t.Errorf("revoked lease: TTL %d advice %q, %v", gone.TTL, gone.Advice(), err)
	}
}

func testLockReleaseAndEnv(t *testing.T, cli *clientv3.Client) {
	sess := open(t, cli, "t1", 1)
	if err := sess.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(sess.Key(), "t1/") || sess.rev <= 0 {
		t.Fatalf("key %q rev %d", sess.Key(), sess.rev)
	}
	env := strings.Join(sess.Env(), " ")
	if !strings.Contains(env, "ETCD_LOCK_KEY="+sess.Key()) || !strings.Contains(env, fmt.Sprintf("ETCD_LOCK_REV=%d", sess.rev)) {
		t.Fatalf("env %q", env)
	}
	q, _, err := Queue(ctxT(t), cli, "t1")
	if err != nil || len(q) != 1 || q[0].Info == nil || q[0].Info.PID != 1 || q[0].Info.Acquired == nil {
		t.Fatalf("queue = %+v, %v", q, err)
	}
	if err := sess.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{Prefix("t1"), InfoPrefix("t1")} {
		resp, _ := cli.Get(ctxT(t), p, clientv3.WithPrefix())
		if len(resp.Kvs) != 0 {
			t.Fatalf("%s keys left after release: %v", p, resp.Kvs)
		}
	}
	ttl, err := cli.TimeToLive(ctxT(t), sess.Lease())
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("lease after release: %+v %v", ttl, err)
	}
}

func testFIFOAndInteropWithPlainMutex(t *testing.T, cli *clientv3.Client) {
	// A plain concurrency mutex, as etcdctl lock uses, holds first.
	other, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	m := concurrency.NewMutex(other, "fifo")
	if err := m.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	sessions := []*Session{open(t, cli, "fifo", 1), open(t, cli, "fifo", 2), open(t, cli, "fifo", 3)}
	order := make(chan int, 3)
	for i, sess := range sessions {
		go func() {
			if err := sess.Lock(ctxT(t)); err != nil {
				t.Errorf("lock %d: %v", i+1, err)
				order <- -1
				return
			}
			order <- i + 1
			_ = sess.Release(context.Background())
		}()
		waitQueueLen(t, cli, "fifo", i+2) // queue in a known order
	}
	q, _, err := Queue(ctxT(t), cli, "fifo")
	if err != nil || len(q) != 4 {
		t.Fatalf("queue %v %v", q, err)
	}
	if q[0].Info != nil || q[0].Key != m.Key() {
		t.Fatalf("holder should be the plain mutex without info: %+v", q[0])
	}
	for i, e := range q[1:] {
		if e.Info == nil || e.Info.PID != i+1 {
			t.Fatalf("waiter %d = %+v", i+1, e)
		}
	}
	select {
	case n := <-order:
		t.Fatalf("session %d acquired while the plain mutex held the lock", n)
	default:
	}
	if err := m.Unlock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 3; want++ {
		if got := <-order; got != want {
			t.Fatalf("acquisition %d went to session %d", want, got)
		}
	}
}

func testCancelWhileWaitingRemovesWaiter(t *testing.T, cli *clientv3.Client) {
	holder := open(t, cli, "cancel", 1)
	if err := holder.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, cli, "cancel", 2)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock(ctx) }()
	waitQueueLen(t, cli, "cancel", 2)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("lock after cancel = %v", err)
	}
	waitQueueLen(t, cli, "cancel", 1)
	if err := waiter.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, _ := cli.Get(ctxT(t), InfoPrefix("cancel"), clientv3.WithPrefix())
	if len(resp.Kvs) != 1 {
		t.Fatalf("info keys after the waiter left: %d", len(resp.Kvs))
	}
}

func testTimeoutWhileWaiting(t *testing.T, cli *clientv3.Client) {
	holder := open(t, cli, "timeout", 1)
	if err := holder.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, cli, "timeout", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := waiter.Lock(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock = %v, want deadline exceeded", err)
	}
}

// A lost lease is never released: the new holder's key must survive.
func testLostLeaseIsNotReleased(t *testing.T, cli *clientv3.Client) {
	a := open(t, cli, "fence", 1)
	if err := a.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctxT(t), a.Lease()); err != nil { // as if it expired
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session did not notice its lease was gone")
	}
	b := open(t, cli, "fence", 2)
	if err := b.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctxT(t)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release of a lost lock = %v, want ErrLeaseLost", err)
	}
	q, _, _ := Queue(ctxT(t), cli, "fence")
	if len(q) != 1 || q[0].Key != b.Key() {
		t.Fatalf("queue after the old holder's release: %+v", q)
	}
}

func testLeaseLostWhileWaiting(t *testing.T, cli *clientv3.Client) {
	holder := open(t, cli, "lostwait", 1)
	if err := holder.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, cli, "lostwait", 2)
	errc := make(chan error, 1)
	go func() { errc <- waiter.Lock(ctxT(t)) }()
	waitQueueLen(t, cli, "lostwait", 2)
	if _, err := cli.Revoke(ctxT(t), waiter.Lease()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("lock = %v, want ErrLeaseLost", err)
	}
}

// TestLeaseLossNoticedBeforeExpiry: cut off from etcd, a holder must give
// the lease up before etcd can expire it and hand the lock on, or two
// hosts would hold the lock at once.
func TestLeaseLossNoticedBeforeExpiry(t *testing.T) {
	s := etcdtest.Start(t)
	direct := s.Client(t)
	proxy := etcdtest.NewProxy(t, s.Endpoint)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxy.Endpoint()}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const ttl = 2
	sess, err := Open(ctxT(t), cli, Config{Name: "early", TTL: ttl, OpTimeout: time.Second, Info: Info{Host: "h", PID: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Abandon()
	if err := sess.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	next := open(t, direct, "early", 2)
	acquired := make(chan time.Time, 1)
	go func() {
		if err := next.Lock(ctxT(t)); err != nil {
			t.Errorf("next holder: %v", err)
		}
		acquired <- time.Now()
	}()
	waitQueueLen(t, direct, "early", 2)
	proxy.Cut()
	var noticed time.Time
	select {
	case <-sess.Done():
		noticed = time.Now()
	case <-time.After(2 * ttl * time.Second):
		t.Fatal("lease loss not noticed")
	}
	var handedOn time.Time
	select {
	case handedOn = <-acquired:
	case <-time.After(3 * ttl * time.Second):
		t.Fatal("the lock was never handed on")
	}
	// The cut holder must have let go well before the next one got the
	// lock: that gap is the time it has to stop its command.
	if gap := handedOn.Sub(noticed); gap < SafetyMargin(ttl)/2 {
		t.Fatalf("lease loss noticed only %s before the lock was handed on, want at least %s", gap, SafetyMargin(ttl)/2)
	}
	if m := SafetyMargin(ttl); m != 500*time.Millisecond {
		t.Errorf("SafetyMargin(%d) = %s", ttl, m)
	}
}

func TestSafetyMargin(t *testing.T) {
	for ttl, want := range map[int]time.Duration{1: 250 * time.Millisecond, 2: 500 * time.Millisecond, 10: 2 * time.Second, 60: 2 * time.Second} {
		if got := SafetyMargin(ttl); got != want {
			t.Errorf("SafetyMargin(%d) = %s, want %s", ttl, got, want)
		}
	}
}

// Someone deleting the holder's key hands the lock to the next waiter: the
// holder must take that as the loss of the lock, and then touch nothing.
func testDeletedKeyIsLost(t *testing.T, cli *clientv3.Client) {
	a, b := open(t, cli, "del", 1), open(t, cli, "del", 2)
	if err := a.Lock(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctxT(t)) }()
	waitQueueLen(t, cli, "del", 2)
	if _, err := cli.Delete(ctxT(t), a.Key()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("holder did not notice its key was deleted")
	}
	// The deletion, not the lease, lost it: the lease still lives.
	if ttl, err := cli.TimeToLive(ctxT(t), a.Lease()); err != nil || ttl.TTL <= 0 {
		t.Fatalf("lock lost with its lease gone (TTL %v, %v), want lost by the key's deletion", ttl, err)
	}
	if err := <-got; err != nil {
		t.Fatalf("next waiter: %v", err)
	}
	if err := a.Release(ctxT(t)); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release after deletion = %v, want ErrLeaseLost", err)
	}
	if keys, _, _ := Queue(ctxT(t), cli, "del"); len(keys) != 1 || keys[0].Key != b.Key() {
		t.Fatalf("the new holder's key must survive: %v", keys)
	}
}
