package signer

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// recordsWritten sends each trust record written under /trust/m1 from now
// on, as stored.
func recordsWritten(t *testing.T, cli *clientv3.Client) <-chan trust.Record {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := cli.Get(ctx, "/trust/m1")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan trust.Record, 10)
	go func() {
		for wr := range cli.Watch(ctx, "/trust/m1", clientv3.WithRev(resp.Header.Revision+1)) {
			for _, ev := range wr.Events {
				var rec trust.Record
				if json.Unmarshal(ev.Kv.Value, &rec) != nil {
					continue
				}
				select {
				case ch <- rec:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch
}

func quietLog(t testing.TB) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	return l
}

// TestBarrierWaitsForEveryRecord: the barrier passes only once every
// host's record lists the key (these hosts publish no key: a record is
// enough to be waited for), wakes on the record's change, and times out
// naming the hosts still missing; a garbled record trusts nothing, a key
// deeper than PREFIX/HOST is no host's record; an etcd client not yet
// connected is asked again.
func TestBarrierWaitsForEveryRecord(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	clientFn := func(context.Context) (*clientv3.Client, error) { return cli, nil }
	put := func(host string, kids ...string) {
		b, _ := json.Marshal(trust.Record{Host: host, Trusted: kids})
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
	var nt *trust.NotTrustedError
	if !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"m1", "m2", "m3"}) {
		t.Fatalf("timeout: %v, want NotTrustedError naming m1, m2, m3", err)
	}

	e.Put(t, "/trust/m4", "garbled")
	e.Put(t, "/trust/m5/old", "not a host's record")
	if err := short.Wait(context.Background(), "new"); !errors.As(err, &nt) || !slices.Equal(nt.Hosts, []string{"m4"}) {
		t.Fatalf("with a garbled record: %v, want NotTrustedError naming m4 only", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx, "newer"); err != context.Canceled {
		t.Fatalf("cancelled: %v, want context.Canceled", err)
	}

	if _, err := cli.Delete(context.Background(), "/trust/m4"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls := 0
	notYet := func(context.Context) (*clientv3.Client, error) {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 {
			return nil, errors.New("etcd not reachable yet")
		}
		return cli, nil
	}
	late := &Barrier{Client: notYet, Prefix: "/trust/", Timeout: 30 * time.Second, Log: quietLog(t)}
	if err := late.Wait(context.Background(), "new"); err != nil || calls != 2 {
		t.Fatalf("client unavailable at first: %v after %d calls, want nil after 2", err, calls)
	}
}

// TestRecorderWritesOnChange: a record is written for each new set the
// apiserver fetched, not for every call.
func TestRecorderWritesOnChange(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	written := recordsWritten(t, cli)
	r := &Recorder{Client: func(context.Context) (*clientv3.Client, error) { return cli, nil },
		Prefix: "/trust/", Host: "m1", Timeout: 5 * time.Second, Log: quietLog(t), Metrics: NewMetrics()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)

	sk := mustSigningKey(t, keytest.EC(t))
	ks := NewKeySet(nil, sk)
	r.Fetched(ks.Snapshot())
	first := <-written
	if first.Source != trust.SignerSource || !slices.Equal(first.Trusted, []string{sk.KeyID}) || first.Signing != sk.KeyID {
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
	h1 := keyOf(t, &keytest.RSA(t, 2048).PublicKey)
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

// TestRecorderNamesControllerManagerKey: the record carries the key
// kube-controller-manager signs with, and is written again when only that
// key changes (the set fetched is the same), so that retire-keys sees a
// controller-manager restarted with the new key; an unreadable key file
// records no key and is logged when it starts and when it ends.
func TestRecorderNamesControllerManagerKey(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	written := recordsWritten(t, cli)
	var mu sync.Mutex
	cm, cmErr := "OLDKID", error(nil)
	var logs syncBuffer
	log := logrus.New()
	log.SetOutput(&logs)
	m := NewMetrics()
	r := &Recorder{Client: func(context.Context) (*clientv3.Client, error) { return cli, nil },
		Prefix: "/trust/", Host: "m1", Timeout: 5 * time.Second, Log: log, Metrics: m,
		ControllerManager: func() (string, error) { mu.Lock(); defer mu.Unlock(); return cm, cmErr }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	set := func(kid string, err error) { mu.Lock(); cm, cmErr = kid, err; mu.Unlock() }
	next := func() trust.Record {
		t.Helper()
		select {
		case rec := <-written:
			return rec
		case <-time.After(20 * time.Second):
			t.Fatal("no trust record written")
			return trust.Record{}
		}
	}

	ks := NewKeySet(nil, mustSigningKey(t, keytest.EC(t)))
	r.Fetched(ks.Snapshot())
	if rec := next(); rec.ControllerManagerSigning != "OLDKID" {
		t.Fatalf("record %+v, want controller_manager_signing OLDKID", rec)
	}
	resp, err := cli.Get(ctx, "/trust/m1")
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), `"controller_manager_signing":"OLDKID"`) {
		t.Fatalf("stored record lacks the controller-manager's key: %v %v", resp, err)
	}
	// Same set, the controller-manager restarted with another key.
	set("NEWKID", nil)
	r.Fetched(ks.Snapshot())
	if rec := next(); rec.ControllerManagerSigning != "NEWKID" {
		t.Fatalf("record %+v, want controller_manager_signing NEWKID", rec)
	}
	// Its key file unreadable: the record names no key, logged once.
	set("", errors.New("open /etc/kubernetes/pki/sa.key: permission denied"))
	r.Fetched(ks.Snapshot())
	if rec := next(); rec.ControllerManagerSigning != "" {
		t.Fatalf("record %+v, want no controller-manager key", rec)
	}
	r.Fetched(ks.Snapshot())
	set("NEWKID", nil)
	r.Fetched(ks.Snapshot())
	if rec := next(); rec.ControllerManagerSigning != "NEWKID" {
		t.Fatalf("record %+v, want controller_manager_signing NEWKID again", rec)
	}
	out := logs.String()
	if strings.Count(out, "signing key unreadable") != 1 || strings.Count(out, "readable again") != 1 {
		t.Errorf("the failure is not logged once when it starts and once when it ends:\n%s", out)
	}
	if got := counterValue(t, m, "kube_apiserver_sa_signer_trust_record_errors_total", "controller_manager_key"); got < 1 {
		t.Errorf("trust_record_errors_total{what=controller_manager_key} = %v, want >= 1", got)
	}
}

// counterValue reads one labelled counter from m's registry (0 if absent).
func counterValue(t *testing.T, m *Metrics, name, what string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "what" && l.GetValue() == what {
					return mt.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
