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
// always does makes it give up after its attempts with a clear error.
func TestUpdateCompareAndSwap(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cli := srv.Client(t)
	s := &Store{KV: cli, KeysPrefix: "/keys", RecordPrefix: "/rot"}
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
	if err == nil || n != attempts || !strings.Contains(err.Error(), "run the command again") {
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

// Retiring a forgotten host's last key deletes its value and keeps its
// record (tombstones, forgotten); List shows the host's keys throughout.
func TestForgottenHostValueGoesWithItsLastKey(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	cli := srv.Client(t)
	s := &Store{KV: cli, KeysPrefix: "/keys", RecordPrefix: "/rot"}
	a, b, _ := keys(t)
	now := time.Now()
	for host, it := range map[string]Item{"m1": a, "m2": b} {
		if _, err := cli.Put(ctx, s.ValueKey(host), string(Join([]Item{it}))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Update(ctx, "m2", func(cur State) (State, error) { return cur.Forget("forget-host", now, time.Hour), nil }); err != nil {
		t.Fatal(err)
	}
	life, err := s.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	m1, m2 := life["m1"], life["m2"]
	if m1.Gone() || !slices.Equal(m1.Current, []string{a.KID}) || len(m1.Superseded) != 0 {
		t.Errorf("m1: %+v", m1)
	}
	if !m2.Gone() || len(m2.Current) != 0 || len(m2.Superseded) != 1 || m2.Superseded[0].KID != b.KID ||
		!m2.Superseded[0].RetireAfter.Equal(now.Add(time.Hour).UTC()) || !strings.Contains(m2.Text(), "GONE") {
		t.Errorf("m2 after forget: %+v (%s)", m2, m2.Text())
	}
	if _, err := s.Update(ctx, "m2", func(cur State) (State, error) { return cur.Retire([]string{b.KID}, now) }); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, s.ValueKey("m2")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("m2's value after its last key retired: %v %v, want deleted", resp, err)
	}
	resp, err := cli.Get(ctx, s.RecordKey("m2"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("m2's key record: %v %v, want kept", resp, err)
	}
	var rec Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil || rec.Forgotten.IsZero() || rec.Retired[b.KID].IsZero() {
		t.Fatalf("m2's key record %s: %v", resp.Kvs[0].Value, err)
	}
	if life, err = s.List(ctx, 0); err != nil || !life["m2"].Gone() || !strings.Contains(life["m2"].Text(), "every key retired") {
		t.Fatalf("m2 listed as %+v: %v", life["m2"], err)
	}
}
