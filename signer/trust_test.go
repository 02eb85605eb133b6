package signer

import (
	"context"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

func TestMissing(t *testing.T) {
	rec := func(kids ...string) []byte { b, _ := json.Marshal(Record{Host: "x", Trusted: kids}); return b }
	kvs := map[string][]byte{
		"a": rec("k1", "k2"), "b": rec("k1"), "c": []byte("garbled"), "d": rec("k2"),
	}
	if got := Missing(kvs, "k2"); !slices.Equal(got, []string{"b", "c"}) {
		t.Errorf("Missing = %v, want [b c] (a garbled record trusts nothing)", got)
	}
}

func quietLog(t testing.TB) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	return l
}

// TestBarrierWaitsForEveryRecord: the barrier passes only once every
// host's record lists the key, wakes on the record's change, and times
// out naming the hosts still missing.
func TestBarrierWaitsForEveryRecord(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	clientFn := func(context.Context) (*clientv3.Client, error) { return cli, nil }
	put := func(host string, kids ...string) {
		b, _ := json.Marshal(Record{Host: host, Trusted: kids})
		e.Put(t, "/trust/"+host, string(b))
	}
	put("m1", "old", "new")
	put("m2", "old")
	put("m3", "old")

	b := &Barrier{Client: clientFn, Prefix: "/trust/", Timeout: 30 * time.Second, Log: quietLog(t)}
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background(), "new") }()
	put("m2", "old", "new")
	select {
	case err := <-done:
		t.Fatalf("barrier passed (%v) while m3 has not fetched the key", err)
	default:
	}
	put("m3", "new")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("barrier did not pass once every record listed the key")
	}

	short := &Barrier{Client: clientFn, Prefix: "/trust/", Timeout: 300 * time.Millisecond, Log: quietLog(t)}
	err := short.Wait(context.Background(), "newer")
	var nt *NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"m1", "m2", "m3"}) {
		t.Fatalf("timeout: %v, want NotTrustedError naming m1, m2, m3", err)
	}
}

// TestRecorderWritesOnChange: a record is written for each new set the
// apiserver fetched, not for every call.
func TestRecorderWritesOnChange(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	written := make(chan Record, 10)
	r := &Recorder{Client: func(context.Context) (*clientv3.Client, error) { return cli, nil },
		Prefix: "/trust/", Host: "m1", Timeout: 5 * time.Second, Log: quietLog(t), Written: func(r Record) { written <- r }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	sk := mustSigningKey(t, ecKey(t, elliptic.P256()))
	ks := NewKeySet(nil, sk)
	r.Fetched(ks.Snapshot())
	first := <-written
	if first.Source != RecordSource || !slices.Equal(first.Trusted, []string{sk.KeyID}) || first.Signing != sk.KeyID {
		t.Fatalf("record %+v", first)
	}
	resp, err := cli.Get(ctx, "/trust/m1")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("record not stored: %v", err)
	}
	rev := resp.Kvs[0].ModRevision

	// The same set fetched again: no write. A new set: one write.
	r.Fetched(ks.Snapshot())
	r.Fetched(ks.Snapshot())
	h1 := keyOf(t, &rsaKey(t).PublicKey)
	ks.SetHost("h1", []Key{h1})
	r.Fetched(ks.Snapshot())
	second := <-written
	if !slices.Contains(second.Trusted, h1.ID) {
		t.Fatalf("second record %+v lacks %s", second, h1.ID)
	}
	resp, _ = cli.Get(ctx, "/trust/m1")
	if got := resp.Kvs[0].Version; resp.Kvs[0].ModRevision == rev || got != 2 {
		t.Fatalf("record version %d, want 2 (written once per new set)", got)
	}
}
