package signer

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// TestRollbackCancelsPendingSwitch: the key file changes to a new key (a
// switch waits for the barrier), then holds the signing key again (as
// rotate-key --rollback leaves it): the switch is cancelled, logged, the
// new key no longer served, and the barrier passing afterwards does not
// make it sign.
func TestRollbackCancelsPendingSwitch(t *testing.T) {
	e := etcdtest.Start(t)
	cli := e.Client(t)
	put := func(host string, kids ...string) {
		b, _ := json.Marshal(trust.Record{Host: host, Trusted: kids})
		e.Put(t, "/trust/"+host, string(b))
	}
	oldPriv, nextPriv := keytest.EC(t), keytest.EC(t)
	old, next := mustSigningKey(t, oldPriv), mustSigningKey(t, nextPriv)
	put("m2", old.KeyID)

	file := writeFile(t, "sa.key", string(keytest.PKCS8PEM(t, oldPriv)))
	logs := &syncBuffer{}
	log := logrus.New()
	log.SetOutput(logs)
	ks := NewKeySet(nil, old)
	km := &KeyManager{Keys: ks, File: file, Log: log, Metrics: NewMetrics(),
		Barrier: &Barrier{Client: func(context.Context) (*clientv3.Client, error) { return cli, nil }, Prefix: "/trust/", Timeout: time.Minute, Log: log}}
	t.Cleanup(km.Wait)
	ctx := context.Background()

	writeKeyFile(t, file, keytest.PKCS8PEM(t, nextPriv))
	km.Reload(ctx, "SIGHUP")
	if p := km.Pending(); p == nil || p.KeyID != next.KeyID {
		t.Fatalf("pending %v after a new key, want %s", p, next.KeyID)
	}
	if s := ks.Snapshot(); s.Signing != old.KeyID || !slices.Contains(s.IDs(), next.KeyID) {
		t.Fatalf("while waiting: signing %s serving %v, want %s signing and %s served", s.Signing, s.IDs(), old.KeyID, next.KeyID)
	}

	writeKeyFile(t, file, keytest.PKCS8PEM(t, oldPriv))
	km.Reload(ctx, "SIGHUP")
	if !strings.Contains(logs.String(), "switch to "+next.KeyID+" cancelled") {
		t.Errorf("cancellation not logged:\n%s", logs)
	}
	if p := km.Pending(); p != nil {
		t.Errorf("still pending %s after the file holds the signing key again", p.KeyID)
	}
	if s := ks.Snapshot(); slices.Contains(s.IDs(), next.KeyID) {
		t.Errorf("the cancelled key is still served: %v", s.IDs())
	}

	// Every host now lists the new key: a wait still running passes.
	put("m2", old.KeyID, next.KeyID)
	done := make(chan struct{})
	go func() { km.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the barrier wait neither passed nor was cancelled")
	}
	if s := ks.Signer(); s.KeyID != old.KeyID {
		t.Fatalf("signing with %s, which the key file no longer holds; want %s", s.KeyID, old.KeyID)
	}
}

func writeKeyFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestKeyFileWarnings: a key file open to group or others, or owned by
// another user, is logged and counted at each load, and still used.
func TestKeyFileWarnings(t *testing.T) {
	priv := keytest.EC(t)
	file := writeFile(t, "sa.key", string(keytest.PKCS8PEM(t, priv)))
	logs := &syncBuffer{}
	log := logrus.New()
	log.SetOutput(logs)
	m := NewMetrics()
	km := &KeyManager{Keys: NewKeySet(nil, nil), File: file, Log: log, Metrics: m}

	if _, err := km.Load(); err != nil || logs.String() != "" {
		t.Fatalf("mode 0600, owned by us: %v, logged %q", err, logs)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if k, err := km.Load(); err != nil || k == nil {
			t.Fatalf("mode 0644: %v; the key must still load", err)
		}
	}
	if n := metricValue(t, m, "kube_apiserver_sa_signer_signing_key_file_warnings_total", "reason", "mode"); n != 2 {
		t.Errorf("mode warnings counted %v, want 2 (one per load)", n)
	}
	if !strings.Contains(logs.String(), "mode 0644") || !strings.Contains(logs.String(), "level=warning") {
		t.Errorf("mode not warned:\n%s", logs)
	}

	if os.Geteuid() != 0 {
		t.Skip("owner: chown needs root")
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, 65534, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := km.Load(); err != nil {
		t.Fatal(err)
	}
	if n := metricValue(t, m, "kube_apiserver_sa_signer_signing_key_file_warnings_total", "reason", "owner"); n != 1 {
		t.Errorf("owner warnings counted %v, want 1", n)
	}
	if !strings.Contains(logs.String(), "owned by uid 65534") {
		t.Errorf("owner not warned:\n%s", logs)
	}
}

// Pending returns the key waiting for the barrier; nil when none is.
func (m *KeyManager) Pending() *SigningKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pending
}
