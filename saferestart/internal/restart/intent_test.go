package restart

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/saferestart/internal/hold"
)

const holdKey = "lock-hold"

// runAs runs one restart as host with the real hold store on cli and fake
// lock, command and gate; the session's lease is lease. It returns the
// code, how many commands started, and the log.
func runAs(t *testing.T, cli *clientv3.Client, host string, lease clientv3.LeaseID) (Code, int, string) {
	t.Helper()
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	sess := newSession()
	sess.lease = int64(lease)
	locker := &fakeLocker{sess: sess}
	run := &fakeRunner{onStart: ok}
	st := &hold.Store{C: cli, HoldKey: holdKey, Host: host}
	code := New(Config{Argv: []string{"systemctl", "restart", "kube-apiserver"}, Host: host, PID: 9, Log: log},
		locker, run, &fakeGate{wait: ready}, st).Run(context.Background(), make(chan struct{}))
	var b strings.Builder
	for _, e := range hook.AllEntries() {
		b.WriteString(e.Message + "\n")
	}
	return code, len(run.procs), b.String()
}

func grant(t *testing.T, cli *clientv3.Client) clientv3.LeaseID {
	t.Helper()
	l, err := cli.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

// killedOwner plays a helper SIGKILLed mid-restart: its intent, written
// with its lock lease, stays; the lease goes (expired: revoked here).
func killedOwner(t *testing.T, cli *clientv3.Client, host string) {
	t.Helper()
	ctx := context.Background()
	lease := grant(t, cli)
	if err := (&hold.Store{C: cli, HoldKey: holdKey, Host: host}).SetIntent(ctx, hold.Intent{PID: 4242, Lease: int64(lease),
		Started: time.Now(), What: "systemctl restart kube-apiserver"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
}

func intentOf(t *testing.T, cli *clientv3.Client, host string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), hold.IntentKey(holdKey, host))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Kvs) > 0
}

// A helper killed mid-restart leaves the fleet held: another host's run
// exits 4 naming it, running nothing, until the owner's retry succeeds.
func TestKilledOwnerHoldsOthersUntilItsRetry(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	killedOwner(t, cli, "m2")

	code, starts, log := runAs(t, cli, "m1", grant(t, cli))
	if code != Held || starts != 0 {
		t.Fatalf("other host: code %d, %d starts, want %d and none; log:\n%s", code, starts, Held, log)
	}
	for _, want := range []string{"host m2 (pid 4242)", "died mid-restart", "m2's next successful restart clears this", "unhold"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}

	// The owner's own orphan does not stop its retry, which clears it.
	if code, starts, log := runAs(t, cli, "m2", grant(t, cli)); code != OK || starts != 1 {
		t.Fatalf("owner's retry: code %d, %d starts, want OK and 1; log:\n%s", code, starts, log)
	}
	if intentOf(t, cli, "m2") {
		t.Fatal("the owner's successful retry left its intent")
	}
	if code, starts, log := runAs(t, cli, "m1", grant(t, cli)); code != OK || starts != 1 {
		t.Fatalf("other host after the owner's retry: code %d, %d starts; log:\n%s", code, starts, log)
	}
	if intentOf(t, cli, "m1") {
		t.Fatal("a successful run left its intent")
	}
}

// A live owner's intent (its lease kept alive: it holds the lock and
// restarts now) is no hold: the others just queue for the lock.
func TestLiveIntentIsNoHold(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	lease := grant(t, cli)
	if err := (&hold.Store{C: cli, HoldKey: holdKey, Host: "m2"}).SetIntent(context.Background(), hold.Intent{Lease: int64(lease), Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if code, starts, log := runAs(t, cli, "m1", grant(t, cli)); code != OK || starts != 1 {
		t.Fatalf("code %d, %d starts, want OK and 1; log:\n%s", code, starts, log)
	}
	if !intentOf(t, cli, "m2") {
		t.Fatal("another host's live intent was removed")
	}
}

// The intent is in etcd, with no lease, while the command runs; a failed
// restart whose hold is written leaves the hold, not the intent.
func TestIntentWhileCommandRuns(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	lease := grant(t, cli)
	sess := newSession()
	sess.lease = int64(lease)
	var seen *hold.Intent
	var leased int64 = -1
	run := &fakeRunner{onStart: func(n int, p *fakeProc) { p.finish(errors.New("exit 1")) }}
	run.before = func() {
		resp, err := cli.Get(context.Background(), hold.IntentKey(holdKey, "m1"))
		if err == nil && len(resp.Kvs) == 1 {
			leased = resp.Kvs[0].Lease
			in, _ := hold.Intents(context.Background(), cli, holdKey)
			if len(in) == 1 {
				seen = &in[0]
			}
		}
	}
	st := &hold.Store{C: cli, HoldKey: holdKey, Host: "m1"}
	code := New(Config{Argv: []string{"restart"}, Host: "m1", PID: 9}, &fakeLocker{sess: sess}, run, &fakeGate{wait: ready}, st).
		Run(context.Background(), make(chan struct{}))
	if code != Failed {
		t.Fatalf("code %d, want %d", code, Failed)
	}
	if seen == nil || seen.Host != "m1" || seen.PID != 9 || seen.Lease != int64(lease) || seen.What != "restart" || seen.LockKey != "lock/1" || seen.Orphaned || leased != 0 {
		t.Fatalf("intent as the command started: %+v (its key's lease %d, want none)", seen, leased)
	}
	if intentOf(t, cli, "m1") {
		t.Fatal("intent kept beside the written hold")
	}
	if rec, _ := hold.Get(context.Background(), cli, holdKey); rec == nil || rec.Host != "m1" {
		t.Fatalf("hold %+v", rec)
	}
}

// A failed restart whose hold cannot be written keeps its intent: once
// the lease is gone, that is the hold the others see.
func TestIntentKeptWhenHoldNotWritten(t *testing.T) {
	h := &fakeHolds{failAdds: 1 << 30}
	force := make(chan struct{})
	close(force) // gives up the hold write at once
	run := &fakeRunner{onStart: func(n int, p *fakeProc) { p.finish(errors.New("exit 1")) }}
	code := New(Config{Argv: []string{"restart"}, Host: "m1"}, &fakeLocker{sess: newSession()}, run, &fakeGate{wait: ready}, h).
		Run(context.Background(), force)
	// (The closed force channel may also stop the command: Interrupted.)
	if code != Failed && code != Interrupted {
		t.Fatalf("code %d, want %d or %d", code, Failed, Interrupted)
	}
	if h.intent == nil || h.intent.Host != "m1" {
		t.Fatalf("intent %+v, want m1's kept", h.intent)
	}
}
