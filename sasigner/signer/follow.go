package signer

import (
	"cmp"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/etcdrestore"
	"github.com/keysync/confd/internal/pemcheck"
)

// Follower keeps a KeySet's published keys current from one etcd prefix:
// a read of the whole prefix, then one watch from the revision after it; a
// broken watch is followed by a new read. While etcd cannot be read the
// set is left as it is: a signer never serves fewer keys because etcd is
// down. An etcd restored from an older snapshot is noticed (etcdrestore),
// logged, counted and read again: a resumed watch would wait for revisions
// above the old ones, serving keys the restored etcd no longer holds.
type Follower struct {
	// Connect returns the etcd client, which its owner closes; it is
	// called before each read until it succeeds, the signer serving the
	// cached set meanwhile.
	Connect func(context.Context) (*clientv3.Client, error)
	// Prefix is KEYS-PREFIX with its trailing slash.
	Prefix string
	Keys   *KeySet
	Log    logrus.FieldLogger
	// RequestTimeout bounds the read of the prefix.
	RequestTimeout time.Duration
	// Retry is the pause after a failed read (doubling up to 8×).
	Retry time.Duration
	// Probe is how often a live watch is checked with a read: a watch
	// whose server is gone retries silently forever.
	Probe   time.Duration
	Metrics *Metrics

	// bad holds, by etcd key, the revision of the value refused now, so
	// that a refusal is logged once, and its end once.
	bad  map[string]int64
	weak map[string]bool // RSA keys under 2048 bits warned of
	down bool

	restore   etcdrestore.Detector  // fed by the probe too: safe for that
	restoring *etcdrestore.Restored // noticed, the prefix not yet re-read
}

// Run follows etcd until ctx ends. synced, if not nil, is called once after
// the first successful read.
func (f *Follower) Run(ctx context.Context, synced func()) {
	f.Retry, f.Probe = cmp.Or(f.Retry, time.Second), cmp.Or(f.Probe, 5*time.Second)
	f.bad = map[string]int64{}
	f.weak = map[string]bool{}
	delay := f.Retry
	// backOff marks etcd down and waits, twice as long each time up to
	// eight retries' worth, before the next connect or read.
	backOff := func(err error) {
		f.setEtcd(false, err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, 8*f.Retry)
	}
	for ctx.Err() == nil {
		cli, err := f.Connect(ctx)
		if err != nil {
			backOff(err)
			continue
		}
		rev, err := f.list(ctx, cli)
		if err != nil {
			backOff(err)
			continue
		}
		f.setEtcd(true, nil)
		delay = f.Retry
		if synced != nil {
			synced()
			synced = nil
		}
		err = f.watch(ctx, cli, rev)
		if down, ok := errors.AsType[*probeError](err); ok {
			f.setEtcd(false, down.err)
			continue
		}
		if restored, ok := errors.AsType[*etcdrestore.Restored](err); ok {
			f.Metrics.restarts.Inc()
			f.restored(restored)
			continue
		}
		if ctx.Err() == nil {
			f.Log.WithError(err).Warn("etcd watch of the published keys ended; reading the prefix again")
			f.Metrics.restarts.Inc()
		}
	}
}

// setEtcd records whether etcd can be read; a change is logged once.
func (f *Follower) setEtcd(up bool, err error) {
	f.Metrics.etcdUp.Set(map[bool]float64{true: 1}[up])
	if f.down != up {
		return
	}
	f.down = !up
	if up {
		f.Log.Info("etcd reachable again: the key set follows the published keys")
	} else {
		snap := f.Keys.Snapshot()
		f.Log.WithError(err).WithField("keys", len(snap.Keys)).WithField("since", snap.Time.Format(time.RFC3339)).
			Error("etcd unreachable: serving the last good key set until it is back")
	}
}

// restored logs and counts a restore noticed; the next read of the prefix
// ends it.
func (f *Follower) restored(r *etcdrestore.Restored) {
	f.Metrics.restores.WithLabelValues(string(r.Evidence)).Inc()
	f.restoring = r
	f.Log.WithField("evidence", string(r.Evidence)).Warn("etcd restore detected: " + r.Error() + "; re-reading the whole key set")
}

// list reads the whole prefix and replaces the published keys. It is also
// where a restore shows when the watch ended for another reason (etcd
// restarted on a restored data directory): its read is then the re-read.
func (f *Follower) list(ctx context.Context, cli *clientv3.Client) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, f.RequestTimeout)
	defer cancel()
	resp, r, err := f.restore.Read(rctx, cli, f.Prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	if r != nil {
		f.restored(r)
	}
	// Every host's keys in one change; a host absent from the read (set
	// nil) withdrew its keys.
	hosts := map[string][]Key{}
	for _, kv := range resp.Kvs {
		f.put(hosts, kv, false)
	}
	for host := range f.Keys.Hosts() {
		if _, ok := hosts[host]; !ok {
			delete(f.bad, f.Prefix+host)
			hosts[host] = nil
		}
	}
	f.Keys.SetHosts(hosts)
	if r := f.restoring; r != nil {
		f.restoring = nil
		f.Log.WithField("evidence", string(r.Evidence)).WithField("keys", len(f.Keys.Snapshot().Keys)).
			Infof("etcd restore handled: key set re-read at revision %d", resp.Header.Revision)
	}
	return resp.Header.Revision, nil
}

// watch applies changes from rev+1 until the watch breaks. A lost
// connection ends it at once: clientv3 would resume it silently from its
// last revision, which an etcd restored meanwhile may reach only much
// later, with other changes; the read that follows tells the restore.
func (f *Follower) watch(ctx context.Context, cli *clientv3.Client, rev int64) error {
	var cancel context.CancelCauseFunc
	lost := etcdclient.WithStreamErrors(ctx, func(err error) {
		cancel(fmt.Errorf("watch stream ended (connection lost?): %w", err))
	})
	wctx, cancel := context.WithCancelCause(clientv3.WithRequireLeader(lost))
	defer cancel(nil)
	// A watcher of its own: clientv3 shares a stream among watches with
	// the same metadata, and a stream opened by another user of the
	// client (the trust barrier's watch) would not carry lost's callback.
	w := clientv3.NewWatcher(cli)
	defer func() { _ = w.Close() }()
	go f.probe(wctx, cli, cancel)
	for wr := range w.Watch(wctx, f.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if wr.CompactRevision != 0 {
			return f.restore.Compaction(wr.CompactRevision)
		}
		// Not ordered: after a reconnect clientv3 may have resumed the
		// watch on another member, which can lag a little.
		if r := f.restore.Check(etcdrestore.HeaderOf(wr.Header), false); r != nil {
			return r
		}
		if err := wr.Err(); err != nil {
			return cmp.Or(context.Cause(wctx), err)
		}
		// One change for the response's events: a burst of publishes
		// arrives in few responses when the watch falls behind.
		changes := map[string][]Key{}
		for _, ev := range wr.Events {
			f.put(changes, ev.Kv, ev.Type == mvccpb.DELETE)
		}
		if len(changes) > 0 {
			f.Keys.SetHosts(changes)
		}
	}
	return cmp.Or(context.Cause(wctx), errors.New("watch channel closed"))
}

// probe reads etcd every f.Probe while the watch is open and ends the
// watch (cause: a probeError) when a read fails.
func (f *Follower) probe(wctx context.Context, cli *clientv3.Client, cancel context.CancelCauseFunc) {
	t := time.NewTicker(f.Probe)
	defer t.Stop()
	for {
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
		pctx, pcancel := context.WithTimeout(wctx, f.RequestTimeout)
		resp, err := cli.Get(pctx, f.Prefix, clientv3.WithSerializable(), clientv3.WithCountOnly(), clientv3.WithPrefix())
		pcancel()
		if err != nil {
			cancel(&probeError{err}) // nothing if the watch ended first: the first cause stays
			return
		}
		// Serializable, from any member: its cluster ID tells, its
		// revision is only recorded (a member may lag).
		if r := f.restore.Check(etcdrestore.HeaderOf(resp.Header), false); r != nil {
			cancel(r)
			return
		}
	}
}

// put records in hosts the keys its host publishes in kv (deleted: none);
// a value refused leaves the host's previous keys: those of an earlier
// event in hosts, else those served, as confd keeps the live bundle when
// a render fails its check. The etcd key is quoted wherever it is logged:
// anyone who may publish may put a newline in it, and the text log format
// prints fields raw.
func (f *Follower) put(hosts map[string][]Key, kv *mvccpb.KeyValue, deleted bool) {
	key, quoted := string(kv.Key), strconv.Quote(string(kv.Key))
	host := etcdkey.Host(f.Prefix, key)
	if host == "" {
		return
	}
	if deleted {
		delete(f.bad, key)
		hosts[host] = nil
		return
	}
	prev, seen := hosts[host]
	if !seen {
		prev = f.Keys.Host(host)
	}
	keys, err := ParsePublished(quoted, kv.Value, host, f.Log)
	if err != nil {
		f.Metrics.rejected.Inc()
		if f.bad[key] != kv.ModRevision {
			f.bad[key] = kv.ModRevision
			l := f.Log.WithField("key", quoted).WithError(err)
			if len(prev) > 0 {
				l.WithField("kept", len(prev)).Error("published value refused: serving the host's previous keys")
			} else {
				l.Error("published value refused: the host has no key served")
			}
		}
		hosts[host] = prev
		return
	}
	if _, ok := f.bad[key]; ok {
		delete(f.bad, key)
		f.Log.WithField("key", quoted).Info("published value accepted again")
	}
	// An RSA key under 2048 bits is warned of once: the signer refuses to
	// sign with one, but serves it, since dropping a key at once would
	// refuse the tokens it signed; retire it instead.
	for _, k := range keys {
		pub, _ := x509.ParsePKIXPublicKey(k.DER)
		if r, ok := pub.(*rsa.PublicKey); ok && r.N.BitLen() < pemcheck.MinRSABits && !f.weak[k.ID] {
			f.weak[k.ID] = true
			f.Metrics.weakKeys.Inc()
			f.Log.WithField("key", quoted).WithField("kid", k.ID).WithField("bits", r.N.BitLen()).
				Warn("published RSA key under 2048 bits: served, as its tokens may be live, but anyone able to factor it can forge tokens; rotate that host's key and retire this one")
		}
	}
	hosts[host] = keys
}

// probeError is a failed read while a watch was open: etcd is unreachable.
type probeError struct{ err error }

func (e *probeError) Error() string { return "etcd read while watching: " + e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }
