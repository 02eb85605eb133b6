package signer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
)

// Follower keeps a KeySet's published keys current from one etcd prefix:
// a read of the whole prefix, then one watch from the revision after it;
// a broken watch (etcd down, compaction, lost leader) is followed by a new
// read. While etcd cannot be read the set is left as it is: a signer never
// serves fewer keys because etcd is down.
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
	// bad names the etcd keys whose value is refused now (logged once
	// when it starts, once when it ends).
	bad  map[string]bool
	down bool
}

// NormalizePrefix is etcdkey.Dir, for the command line that names it.
func NormalizePrefix(prefix string) string { return etcdkey.Dir(prefix) }

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
	f.bad = map[string]bool{}
	delay := f.Retry
	defer func() {
		if f.client != nil {
			_ = f.client.Close()
		}
	}()
	for ctx.Err() == nil {
		if f.client == nil {
			c, err := f.Connect(ctx)
			if err != nil {
				f.setDown(err)
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				delay = min(2*delay, 8*f.Retry)
				continue
			}
			f.client = c
		}
		rev, err := f.list(ctx)
		if err != nil {
			f.setDown(err)
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			delay = min(2*delay, 8*f.Retry)
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

// list reads the whole prefix and replaces the published keys.
func (f *Follower) list(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, f.RequestTimeout)
	defer cancel()
	resp, err := f.client.Get(rctx, f.Prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", f.Prefix, err)
	}
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		host := etcdkey.Host(f.Prefix, string(kv.Key))
		if host == "" {
			continue
		}
		seen[host] = true
		f.accept(host, string(kv.Key), kv.Value)
	}
	for host := range f.good {
		if !seen[host] {
			f.withdraw(host)
		}
	}
	f.Keys.Replace(f.good)
	return resp.Header.Revision, nil
}

// watch applies changes from rev+1 until the watch breaks.
func (f *Follower) watch(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancelCause(clientv3.WithRequireLeader(ctx))
	defer cancel(nil)
	go f.probe(wctx, cancel)
	for wr := range f.client.Watch(wctx, f.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			if c := context.Cause(wctx); c != nil {
				return c
			}
			return err
		}
		for _, ev := range wr.Events {
			host := etcdkey.Host(f.Prefix, string(ev.Kv.Key))
			if host == "" {
				continue
			}
			if ev.Type == mvccpb.DELETE {
				f.withdraw(host)
				f.Keys.SetHost(host, nil)
				continue
			}
			if f.accept(host, string(ev.Kv.Key), ev.Kv.Value) {
				f.Keys.SetHost(host, f.good[host])
			}
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
		_, err := f.client.Get(pctx, f.Prefix, clientv3.WithSerializable(), clientv3.WithCountOnly(), clientv3.WithPrefix())
		pcancel()
		if err != nil && wctx.Err() == nil {
			cancel(&probeError{err})
			return
		}
	}
}

// accept checks one published value; it reports whether the host's keys
// changed.
func (f *Follower) accept(host, key string, value []byte) bool {
	keys, err := ParsePublished(key, value)
	if err != nil {
		f.Metrics.incRejected()
		if !f.bad[key] {
			f.bad[key] = true
			l := f.Log.WithField("key", key).WithError(err)
			if prev := f.good[host]; len(prev) > 0 {
				l.WithField("kept", len(prev)).Error("published value refused: serving the host's previous keys")
			} else {
				l.Error("published value refused: the host has no key served")
			}
		}
		return false
	}
	if f.bad[key] {
		delete(f.bad, key)
		f.Log.WithField("key", key).Info("published value accepted again")
	}
	f.good[host] = keys
	return true
}

func (f *Follower) withdraw(host string) {
	delete(f.good, host)
	delete(f.bad, f.Prefix+host)
}

// probeError is a failed read while a watch was open: etcd is unreachable.
type probeError struct{ err error }

func (e *probeError) Error() string { return "etcd read while watching: " + e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }
