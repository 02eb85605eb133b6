package keystate

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// A writer that changes the value between Update's read and its write
// makes Update read and merge again: neither change is lost. One that
// always does makes it give up after Attempts with a clear error.
func TestUpdateCompareAndSwap(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cli := srv.Client(t)
	s := &Store{KV: cli, KeysPrefix: "/keys", RecordPrefix: "/rot", Attempts: 3}
	a, b, c := keys(t)
	now := time.Now()
	if _, err := cli.Put(ctx, s.ValueKey("m1"), string(Join([]Item{a}))); err != nil {
		t.Fatal(err)
	}
	calls := 0
	res, err := s.Update(ctx, "m1", func(cur State) (State, error) {
		calls++
		if calls == 1 {
			// Another master's publish-key lands meanwhile: b replaces a.
			if _, err := cli.Put(ctx, s.ValueKey("m1"), string(Join([]Item{b}))); err != nil {
				t.Fatal(err)
			}
		}
		next, _, err := cur.Publish([]Item{c}, "publish-key", now, time.Hour)
		return next, err
	})
	if err != nil || calls != 2 || !res.Wrote {
		t.Fatalf("update: %v after %d calls (wrote %v)", err, calls, res.Wrote)
	}
	got, err := s.Load(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	// b (the value the conflicting writer put) is superseded, not lost; a
	// was already gone from the value and no record held it.
	if !slices.Equal(KIDs(got.Items), []string{b.KID, c.KID}) || got.Record.Superseded[b.KID].PEM == "" {
		t.Fatalf("after the conflict: value %v record %+v", KIDs(got.Items), got.Record)
	}
	// Unchanged: nothing written.
	res, err = s.Update(ctx, "m1", func(cur State) (State, error) {
		next, _, err := cur.Publish([]Item{c}, "publish-key", now, time.Hour)
		return next, err
	})
	if err != nil || res.Wrote {
		t.Fatalf("unchanged publish wrote %v (%v)", res.Wrote, err)
	}
	// Always conflicting: bounded.
	n := 0
	_, err = s.Update(ctx, "m1", func(cur State) (State, error) {
		n++
		if _, err := cli.Put(ctx, s.RecordKey("m1"), `{"host":"m1"}`); err != nil {
			t.Fatal(err)
		}
		return cur.Retire([]string{b.KID}, now)
	})
	if err == nil || n != 3 || !strings.Contains(err.Error(), "run the command again") {
		t.Fatalf("endless conflicts: %v after %d attempts", err, n)
	}
}

// Upgrade in place: a legacy keep record and a plain value are read as
// superseded keys, and the first write stores the new format with the PEM.
func TestLoadLegacyRecordAndHosts(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cli := srv.Client(t)
	s := &Store{KV: cli, KeysPrefix: "/keys", RecordPrefix: "/rot"}
	a, b, _ := keys(t)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	srv.Put(t, s.ValueKey("m1"), string(Join([]Item{a, b})))
	srv.Put(t, s.RecordKey("m1"), `{"host":"m1","keep":{"`+a.KID+`":"`+until.Format(time.RFC3339)+`"}}`)
	srv.Put(t, "/rot/m2/state", `{"host":"m2","phase":"installed"}`)
	srv.Put(t, "/rot/m2/owner", `x`)
	hosts, err := s.Hosts(ctx)
	if err != nil || !slices.Equal(hosts, []string{"m1", "m2"}) {
		t.Fatalf("hosts %v %v", hosts, err)
	}
	res, err := s.Update(ctx, "m1", func(cur State) (State, error) {
		next, _, err := cur.Publish([]Item{b}, "publish-key", time.Now(), 0)
		return next, err
	})
	if err != nil || !res.Wrote {
		t.Fatalf("update: %v (wrote %v)", err, res.Wrote)
	}
	resp, err := cli.Get(ctx, s.RecordKey("m1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("record: %v", err)
	}
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec["keep"]; ok {
		t.Errorf("legacy keep map written back: %s", resp.Kvs[0].Value)
	}
	got, err := s.Load(ctx, "m1")
	if err != nil || !got.Record.Superseded[a.KID].RetireAfter.Equal(until) || got.Record.Superseded[a.KID].PEM != string(a.PEM) ||
		!slices.Equal(KIDs(got.Items), []string{a.KID, b.KID}) {
		t.Fatalf("after the upgrade: %v %+v %v", err, got.Record, KIDs(got.Items))
	}
}
