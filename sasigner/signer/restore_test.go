package signer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
)

// etcdIDs is the set a signer following etcd must serve: its signing key
// and every key published under /keys/ now.
func etcdIDs(t *testing.T, cli *clientv3.Client, sk *SigningKey) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/keys/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{sk.KeyID}
	for _, kv := range resp.Kvs {
		if etcdkey.Host("/keys/", string(kv.Key)) == "" {
			continue
		}
		keys, err := ParsePublished(string(kv.Key), kv.Value, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			ids = append(ids, k.ID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// waitForEtcd waits until the set served is etcd's.
func (f *follow) waitForEtcd(t *testing.T, what string, cli *clientv3.Client, sk *SigningKey) {
	t.Helper()
	want := etcdIDs(t, cli, sk)
	f.waitFor(t, fmt.Sprintf("%s: etcd's set %v", what, want), func(s *Snapshot) bool { return slices.Equal(s.IDs(), want) })
}

// restores is kube_apiserver_sa_signer_etcd_restores_total{evidence}.
func (f *follow) restores(t *testing.T, evidence string) float64 {
	t.Helper()
	mfs, err := f.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kube_apiserver_sa_signer_etcd_restores_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "evidence" && l.GetValue() == evidence {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// waitLog waits for a line containing each of parts.
func (f *follow) waitLog(t *testing.T, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for line := range strings.SplitSeq(f.log.String(), "\n") {
			found := true
			for _, p := range parts {
				found = found && strings.Contains(line, p)
			}
			if found {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q; log:\n%s", parts, f.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// slowProbe leaves the watch to notice the outage by itself: an outage
// shorter than the probe interval (5 s in production) is not seen by the
// probe, which is how the 2 s outage went unnoticed.
func slowProbe(fl *Follower) { fl.Probe = time.Hour }

// TestFollowRestoredEtcd is issue 34's scenario: a signer follows etcd,
// 100 writes later a host's key is deleted, etcd is killed and restored
// from a copy taken before the writes, and a new host publishes. The
// restore is noticed (the revision went back), logged when seen and when
// the set is read again, counted, and the set served is the restored
// etcd's, the new host included. Without detection the signer kept
// serving the key the restored etcd no longer holds and never saw the new
// host, its watch waiting for revisions above its old one.
func TestFollowRestoredEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	sk := mustSigningKey(t, keytest.EC(t))
	k1, k2, k3 := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	e.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	backup := e.Backup(t)

	f := startFollower(t, e.Endpoint, NewKeySet(nil, sk), slowProbe)
	<-f.synced
	cli := e.Client(t)
	ctx := context.Background()
	e.Put(t, "/keys/h2", string(keytest.PublicPEM(t, &k2.PublicKey)))
	for i := range 100 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/other/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	del, err := cli.Delete(ctx, "/keys/h1")
	if err != nil {
		t.Fatal(err)
	}
	f.waitForEtcd(t, "before the restore", cli, sk)

	e.Kill()
	killed := time.Now()
	e.RestoreBackup(t, backup)
	back := time.Now()
	e.Put(t, "/keys/h3", string(keytest.PublicPEM(t, &k3.PublicKey)))
	f.waitForEtcd(t, "after the restore and a new publish", cli, sk)
	t.Logf("etcd down %s; restored set served %s after etcd was back", back.Sub(killed).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	f.waitLog(t, "etcd restore detected", fmt.Sprintf("lower than revision %d seen before", del.Header.Revision))
	f.waitLog(t, "etcd restore handled: key set re-read at revision")
	if n := f.restores(t, "revision"); n != 1 {
		t.Errorf("restores{evidence=revision} = %v, want 1", n)
	}
}

// TestFollowEtcdOfAnotherCluster: the endpoint now leads to another etcd
// cluster (a cluster ID of its own), already past the revision the signer
// had seen: the revision alone would not tell. The new cluster ID does.
func TestFollowEtcdOfAnotherCluster(t *testing.T) {
	a, b := etcdtest.Start(t), etcdtest.Start(t)
	sk := mustSigningKey(t, keytest.EC(t))
	k1, k2 := keytest.EC(t), keytest.EC(t)
	a.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	seen := a.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
	b.Put(t, "/keys/h2", string(keytest.PublicPEM(t, &k2.PublicKey)))
	for b.Put(t, "/other", "x") <= seen+10 {
	}
	p := etcdtest.NewProxy(t, a.Endpoint)

	f := startFollower(t, p.Endpoint(), NewKeySet(nil, sk), slowProbe)
	<-f.synced
	f.waitForEtcd(t, "cluster a", a.Client(t), sk)
	p.Cut()
	p.Retarget(b.Endpoint)
	p.Restore()
	f.waitForEtcd(t, "cluster b", b.Client(t), sk)
	f.waitLog(t, "etcd restore detected", "cluster ID")
	if n := f.restores(t, "cluster"); n != 1 {
		t.Errorf("restores{evidence=cluster} = %v, want 1", n)
	}
}

// TestFollowRestoreThenWrites: etcd is restored while the signer is cut
// off from it, and written to until its revision passes the one the signer
// had seen before the signer reconnects. Same cluster, higher revision:
// that restore cannot be told from an outage, but the signer reads the
// whole prefix again on every reconnect, so it serves etcd's set anyway.
// Marked compacted as `etcdutl snapshot restore --bump-revision
// --mark-compacted` leaves it (simulated by a compaction at the current
// revision), the restore is also detected and counted.
func TestFollowRestoreThenWrites(t *testing.T) {
	for _, compact := range []bool{false, true} {
		t.Run(fmt.Sprint("compacted=", compact), func(t *testing.T) {
			e := etcdtest.Start(t)
			sk := mustSigningKey(t, keytest.EC(t))
			k1, k2, k3 := keytest.EC(t), keytest.EC(t), keytest.EC(t)
			e.Put(t, "/keys/h1", string(keytest.PublicPEM(t, &k1.PublicKey)))
			backup := e.Backup(t)
			p := etcdtest.NewProxy(t, e.Endpoint)

			f := startFollower(t, p.Endpoint(), NewKeySet(nil, sk), slowProbe)
			<-f.synced
			cli := e.Client(t)
			ctx := context.Background()
			seen := e.Put(t, "/keys/h2", string(keytest.PublicPEM(t, &k2.PublicKey)))
			f.waitForEtcd(t, "before the restore", cli, sk)

			p.Cut()
			e.RestoreBackup(t, backup)
			e.Put(t, "/keys/h3", string(keytest.PublicPEM(t, &k3.PublicKey)))
			rev := int64(0)
			for rev <= seen+10 {
				resp, err := cli.Put(ctx, "/other", "x")
				if err != nil {
					t.Fatal(err)
				}
				rev = resp.Header.Revision
			}
			if compact {
				if _, err := cli.Compact(ctx, rev); err != nil {
					t.Fatal(err)
				}
			}
			p.Restore()
			f.waitForEtcd(t, "after the restore", cli, sk)
			if compact {
				f.waitLog(t, "etcd restore detected", fmt.Sprintf("compacted, past revision %d seen before", seen))
				f.waitLog(t, "etcd restore handled: key set re-read at revision", fmt.Sprint(rev))
				if n := f.restores(t, "compacted"); n != 1 {
					t.Errorf("restores{evidence=compacted} = %v, want 1", n)
				}
			}
		})
	}
}
