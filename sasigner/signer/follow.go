package signer

import (
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
)

// Follower keeps a KeySet's published keys current from one etcd prefix:
// a read of the whole prefix, then one watch from the revision after it;
// a broken watch (etcd down, a lost connection, compaction, lost leader)
// is followed by a new read. While etcd cannot be read the set is left as
// it is: a signer never serves fewer keys because etcd is down.
//
// An etcd restored from an older snapshot is noticed (etcdrestore: a
// revision lower than one seen, another cluster ID, or a compaction past
// the revisions seen), logged when noticed and when the set was read
// again, and counted. Without that, a watch resumed by clientv3 after a
// short outage waited for revisions above the old ones: the signer served
// keys the restored etcd no longer held and never saw new ones (issue 34).
type Follower struct {
	// Connect returns the etcd client (etcdclient.New); it is called until
	// it succeeds, the signer serving the cached set meanwhile.
	Connect func(context.Context) (*clientv3.Client, error)
	client  *clientv3.Client
	// Prefix is KEYS-PREFIX with its trailing slash.
	Prefix string
	Keys   *KeySet
	Log    logrus.FieldLogger
	// RequestTimeout bounds the read of the prefix.
	RequestTimeout time.Duration
	// Retry is the pause after a failed read (doubling up to 8×).
	Retry time.Duration
	// Probe is how often a live watch is checked with a read: a watch
	// whose server is gone retries silently forever, and the outage is
	// to be logged and counted when it starts.
	Probe   time.Duration
	Metrics *Metrics
	// OnEtcd, if set, is called when reading etcd starts failing (false)
	// and when it works again (true).
	OnEtcd func(up bool)

	// good is each host's last good keys: a value that fails the check
	// keeps the host's previous keys served, as confd keeps the live
	// bundle when a render fails its check.
	good map[string][]Key
	// bad holds, by etcd key, the revision of the value refused now:
	// each value refused is logged once (a re-read of the prefix reads it
	// again), and the end of the refusal once.
	bad map[string]int64
	// weak names the RSA keys under 2048 bits seen published (warned
	// once each).
	weak map[string]bool
	down bool

	// restore is fed by the probe too (the detector is safe for that).
	restore etcdrestore.Detector
	// restoring is the restore noticed and not yet followed by a read of
	// the whole prefix.
	restoring *etcdrestore.Restored
}

// Run follows etcd until ctx ends. synced, if not nil, is called once after
// the first successful read.
func (f *Follower) Run(ctx context.Context, synced func()) error {
	if f.Retry <= 0 {
		f.Retry = time.Second
	}
	if f.Probe <= 0 {
		f.Probe = 5 * time.Second
	}
	f.good = f.Keys.Hosts()
	f.bad = map[string]int64{}
	f.weak = map[string]bool{}
	delay := f.Retry
	// backOff marks etcd down and waits, twice as long each time up to
	// eight retries' worth, before the next connect or read.
	backOff := func(err error) {
		f.setDown(err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, 8*f.Retry)
	}
	defer func() {
		if f.client != nil {
			_ = f.client.Close()
		}
	}()
	for ctx.Err() == nil {
		if f.client == nil {
			c, err := f.Connect(ctx)
			if err != nil {
				backOff(err)
				continue
			}
			f.client = c
		}
		rev, err := f.list(ctx)
		if err != nil {
			backOff(err)
			continue
		}
		f.setUp()
		delay = f.Retry
		if synced != nil {
			synced()
			synced = nil
		}
		err = f.watch(ctx, rev)
		var down *probeError
		if errors.As(err, &down) {
			f.setDown(down.err)
			continue
		}
		var restored *etcdrestore.Restored
		if errors.As(err, &restored) {
			f.Metrics.incWatchRestart()
			f.restored(restored)
			continue
		}
		if ctx.Err() == nil {
			f.Log.WithError(err).Warn("etcd watch of the published keys ended; reading the prefix again")
			f.Metrics.incWatchRestart()
		}
	}
	return ctx.Err()
}

func (f *Follower) setDown(err error) {
	f.Metrics.setEtcdUp(false)
	if !f.down {
		f.down = true
		snap := f.Keys.Snapshot()
		f.Log.WithError(err).WithField("keys", len(snap.Keys)).WithField("since", snap.Time.Format(time.RFC3339)).
			Error("etcd unreachable: serving the last good key set until it is back")
		if f.OnEtcd != nil {
			f.OnEtcd(false)
		}
	}
}

func (f *Follower) setUp() {
	f.Metrics.setEtcdUp(true)
	if f.down {
		f.down = false
		f.Log.Info("etcd reachable again: the key set follows the published keys")
		if f.OnEtcd != nil {
			f.OnEtcd(true)
		}
	}
}

// restored logs and counts a restore noticed; the next read of the prefix
// ends it.
func (f *Follower) restored(r *etcdrestore.Restored) {
	f.Metrics.incRestore(r.Evidence)
	f.restoring = r
	f.Log.WithField("evidence", string(r.Evidence)).Warn("etcd restore detected: " + r.Error() + "; re-reading the whole key set")
}

// check compares a response header with those seen (etcdrestore.Detector.Check).
func (f *Follower) check(h etcdrestore.Header, ordered bool) *etcdrestore.Restored {
	return f.restore.Check(h, ordered)
}

// list reads the whole prefix and replaces the published keys.
//
// A read after the first is also where a restore shows when the watch
// ended for another reason (a lost connection, as when etcd was stopped
// and started on a restored data directory): a count-only read at the
// newest revision seen finds a store compacted past it (a restore with
// --mark-compacted, however many writes followed), and the read's header
// is compared with the headers seen (a revision gone back, another
// cluster). The read that tells is itself the re-read of the restored
// store: a linearizable read of the whole prefix, its revision the one the
// next watch starts after.
func (f *Follower) list(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, f.RequestTimeout)
	defer cancel()
	resp, r, err := f.restore.Read(rctx, f.client, f.Prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	if r != nil {
		f.restored(r)
	}
	hosts := map[string]bool{}
	for _, kv := range resp.Kvs {
		host := etcdkey.Host(f.Prefix, string(kv.Key))
		if host == "" {
			continue
		}
		hosts[host] = true
		f.accept(host, string(kv.Key), kv.Value, kv.ModRevision)
	}
	for host := range f.good {
		if !hosts[host] {
			f.withdraw(host)
		}
	}
	f.Keys.Replace(f.good)
	if r := f.restoring; r != nil {
		f.restoring = nil
		f.Log.WithField("evidence", string(r.Evidence)).WithField("keys", len(f.Keys.Snapshot().Keys)).
			Infof("etcd restore handled: key set re-read at revision %d", resp.Header.Revision)
	}
	return resp.Header.Revision, nil
}

// watch applies changes from rev+1 until the watch breaks.
//
// A lost connection ends it at once: clientv3 would resume it silently
// from the last revision it delivered, and on an etcd restored meanwhile
// that watch waits for revisions the restored store may reach only much
// later, with other changes. Ended, it is followed by a read of the whole
// prefix, which tells the restore and reads the restored keys.
func (f *Follower) watch(ctx context.Context, rev int64) error {
	var cancel context.CancelCauseFunc
	lost := etcdclient.WithStreamErrors(ctx, func(err error) {
		cancel(fmt.Errorf("watch stream ended (connection lost?): %w", err))
	})
	wctx, cancel := context.WithCancelCause(clientv3.WithRequireLeader(lost))
	defer cancel(nil)
	// A watcher of its own: clientv3 shares a stream among watches with
	// the same metadata, and a stream opened by another user of the
	// client (the trust barrier's watch) would not carry lost's callback.
	w := clientv3.NewWatcher(f.client)
	defer func() { _ = w.Close() }()
	go f.probe(wctx, cancel)
	for wr := range w.Watch(wctx, f.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if wr.CompactRevision != 0 {
			r := f.restore.Compaction(wr.CompactRevision)
			return r
		}
		// Not ordered: after a reconnect clientv3 may have resumed the
		// watch on another member, which can lag a little.
		if r := f.check(etcdrestore.HeaderOf(wr.Header), false); r != nil {
			return r
		}
		if err := wr.Err(); err != nil {
			if c := context.Cause(wctx); c != nil {
				return c
			}
			return err
		}
		// One change for the response's events: a burst of publishes
		// arrives in few responses when the watch falls behind.
		changes := map[string][]Key{}
		for _, ev := range wr.Events {
			host := etcdkey.Host(f.Prefix, string(ev.Kv.Key))
			if host == "" {
				continue
			}
			if ev.Type == mvccpb.DELETE {
				f.withdraw(host)
				changes[host] = nil
				continue
			}
			if f.accept(host, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision) {
				changes[host] = f.good[host]
			}
		}
		if len(changes) > 0 {
			f.Keys.SetHosts(changes)
		}
	}
	if err := context.Cause(wctx); err != nil {
		return err
	}
	return errors.New("watch channel closed")
}

// probe reads etcd every f.Probe while the watch is open and ends the
// watch (cause: a probeError) when a read fails.
func (f *Follower) probe(wctx context.Context, cancel context.CancelCauseFunc) {
	t := time.NewTicker(f.Probe)
	defer t.Stop()
	for {
		select {
		case <-wctx.Done():
			return
		case <-t.C:
		}
		pctx, pcancel := context.WithTimeout(wctx, f.RequestTimeout)
		resp, err := f.client.Get(pctx, f.Prefix, clientv3.WithSerializable(), clientv3.WithCountOnly(), clientv3.WithPrefix())
		pcancel()
		if err != nil && wctx.Err() == nil {
			cancel(&probeError{err})
			return
		}
		// Serializable, from any member: its cluster ID tells, its
		// revision is only recorded (a member may lag).
		if err == nil {
			if r := f.check(etcdrestore.HeaderOf(resp.Header), false); r != nil {
				cancel(r)
				return
			}
		}
	}
}

// accept checks one published value (of revision rev); it reports whether
// the host's keys changed. The etcd key is quoted wherever it is logged:
// anyone who may publish may put a newline in it, and the text log
// format prints fields raw.
func (f *Follower) accept(host, key string, value []byte, rev int64) bool {
	keys, err := parsePublished(strconv.Quote(key), value, host, f.Log)
	if err != nil {
		f.Metrics.incRejected()
		if f.bad[key] != rev {
			f.bad[key] = rev
			l := f.Log.WithField("key", strconv.Quote(key)).WithError(err)
			if prev := f.good[host]; len(prev) > 0 {
				l.WithField("kept", len(prev)).Error("published value refused: serving the host's previous keys")
			} else {
				l.Error("published value refused: the host has no key served")
			}
		}
		return false
	}
	if _, ok := f.bad[key]; ok {
		delete(f.bad, key)
		f.Log.WithField("key", strconv.Quote(key)).Info("published value accepted again")
	}
	for _, k := range keys {
		f.checkWeak(key, k)
	}
	f.good[host] = keys
	return true
}

// checkWeak warns, once per key, of an RSA key under 2048 bits: the
// signer refuses to sign with one, but serves it, since dropping a key
// at once would refuse the tokens it signed; retire it instead.
func (f *Follower) checkWeak(key string, k Key) {
	if f.weak[k.ID] {
		return
	}
	pub, err := x509.ParsePKIXPublicKey(k.DER)
	if err != nil {
		return
	}
	if r, ok := pub.(*rsa.PublicKey); ok && r.N.BitLen() < 2048 {
		f.weak[k.ID] = true
		f.Metrics.incWeakKey()
		f.Log.WithField("key", strconv.Quote(key)).WithField("kid", k.ID).WithField("bits", r.N.BitLen()).
			Warn("published RSA key under 2048 bits: served, as its tokens may be live, but anyone able to factor it can forge tokens; rotate that host's key and retire this one")
	}
}

func (f *Follower) withdraw(host string) {
	delete(f.good, host)
	delete(f.bad, f.Prefix+host)
}

// probeError is a failed read while a watch was open: etcd is unreachable.
type probeError struct{ err error }

func (e *probeError) Error() string { return "etcd read while watching: " + e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }
