package trust

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/keytest"
)

// A host forget-host removed publishes only superseded keys and has no
// trust record: it is no publisher (no wait, fleet check or staleness
// counts it), but its keys stay published, so the others must still
// trust them. A wait blocked on it ends when its key record says it is
// gone. An unreadable key record leaves the host a publisher.
func TestForgottenHostIsNoPublisher(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	p := Prefixes{Keys: "/k", Trust: "/k-trust", Rotation: "/k-rot"}
	a, c := keytest.EC(t), keytest.EC(t)
	ka, kc := keytest.KeyID(t, &a.PublicKey), keytest.KeyID(t, &c.PublicKey)
	srv.Put(t, "/k/a", string(keytest.PublicPEM(t, &a.PublicKey)))
	srv.Put(t, "/k/c", string(keytest.PublicPEM(t, &c.PublicKey)))
	if err := Put(ctx, cli, p.Trust, "", Record{Host: "a", Trusted: []string{ka, kc}, Signing: ka}); err != nil {
		t.Fatal(err)
	}
	// Before forget-host: c publishes and has no record; a wait for a's
	// key waits for it, until c is forgotten.
	done := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{ka}})
		done <- err
	}()
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := Wait(wctx, cli, WaitOptions{Log: quiet(), Prefixes: p, Keys: []string{ka}})
	cancel()
	var nt *NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"c"}) {
		t.Fatalf("wait before forget-host: %v, want c named", err)
	}
	store := &keystate.Store{KV: cli, KeysPrefix: p.Keys, RecordPrefix: p.Rotation}
	now := time.Now()
	if _, err := store.Update(ctx, "c", func(cur keystate.State) (keystate.State, error) {
		return cur.Forget("forget-host", now, time.Hour), nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the wait blocked on c after c was forgotten: %v", err)
	}
	rep, err := Collect(ctx, cli, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Publishers(nil); !slices.Equal(got, []string{"a"}) {
		t.Errorf("publishers %v, want [a]", got)
	}
	if got := rep.NotTrustingAmong(Publishers, []string{"new"}, nil); !slices.Equal(got, []string{"a"}) {
		t.Errorf("not trusting a new key: %v, want [a] (not the forgotten c)", got)
	}
	if len(rep.Stale()) != 0 || !slices.Equal(rep.Gone(), []string{"c"}) || !slices.Equal(rep.Published, []string{ka, kc}) && !slices.Equal(rep.Published, []string{kc, ka}) {
		t.Errorf("stale %v gone %v published %v", rep.Stale(), rep.Gone(), rep.Published)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	retire := now.Add(time.Hour).UTC().Format(time.RFC3339)
	for _, want := range []string{"GONE: removed by forget-host", "keys of c: GONE (forget-host", "superseded " + kc + " (by forget-host, retired after " + retire, "keys of a: current " + ka} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("trust text lacks %q:\n%s", want, b.String())
		}
	}
	// Without the key records (no rotation prefix), c is a publisher.
	if rep, err := Collect(ctx, cli, Prefixes{Keys: p.Keys, Trust: p.Trust}); err != nil || !slices.Equal(rep.Publishers(nil), []string{"a", "c"}) {
		t.Fatalf("without key records: %v %v", rep.Publishers(nil), err)
	}
	// A key record that does not parse: every published key counts.
	srv.Put(t, "/k-rot/c/kept", "{not json")
	if rep, err := Collect(ctx, cli, p); err != nil || !slices.Equal(rep.Publishers(nil), []string{"a", "c"}) || len(rep.Gone()) != 0 {
		t.Fatalf("unreadable key record: publishers %v gone %v: %v", rep.Publishers(nil), rep.Gone(), err)
	}
}
