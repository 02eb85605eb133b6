// Package keywatch is publish-key --watch: it keeps this master's current
// keys published, and every tombstone it has seen in etcd, whatever
// happens to etcd (a restore from a snapshot, a deleted key, an operator's
// edit). The disk is the source, etcd the copy: each reconcile publishes
// the key files through keystate (current ∪ superseded − retired, one
// compare-and-swap), writes back the tombstones a record lost (its own
// host's and every other host's still in etcd) and keeps them on disk
// under --state-dir. It reconciles at start, when the key files change,
// when etcd's copy of its value or any key record changes, after a
// restore (etcdrestore) and at least every Interval. While it runs, a
// lease-bound alive record says so.
package keywatch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/etcdrestore"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/sdnotify"
	"github.com/keysync/confd/saferestart/internal/rotation"
)

// Refused is a source refused at the first reconcile: the caller exits 3.
type Refused struct{ Err error }

func (e *Refused) Error() string { return e.Err.Error() }
func (e *Refused) Unwrap() error { return e.Err }

// Watcher is one host's publisher.
type Watcher struct {
	Client *clientv3.Client
	Store  *keystate.Store
	Host   string
	// Source reads the key files: the name to log and the public items
	// to publish. Its error is a refusal (a private key, a weak key, a
	// file that does not parse): nothing is published from it.
	Source func(ctx context.Context) (name string, items []keystate.Item, err error)
	// Files are polled (content) every Poll for a change.
	Files []string
	// Trim removes retired keys from the host's own key files.
	Trim  func(rec keystate.Record, log logrus.FieldLogger)
	Grace time.Duration
	By    string // the writer named in superseded keys
	// Interval: the longest time between two reconciles.
	Interval time.Duration
	Poll     time.Duration
	// TTL of the alive record's lease, in seconds.
	TTL            int
	RequestTimeout time.Duration
	// StateDir holds TombstonesFile ("" keeps nothing on disk).
	StateDir string
	Version  string
	Log      logrus.FieldLogger
	Metrics  *Metrics
	Notify   *sdnotify.Notifier
	// Runners run beside the loop until it ends; an error is logged and
	// does not stop the publisher.
	Runners []func(context.Context) error

	restore etcdrestore.Detector
	// published: key IDs of the host's files this watcher published, so
	// that their absence later is a repair, not a first publish.
	published map[string]bool
	tombs     tombstones
	// unsaved: tombs holds tombstones the file does not.
	unsaved bool
	alive   *rotation.Announcement
}

// Run reconciles until ctx ends. It returns a *Refused when the first
// reconcile refuses the key files; etcd not answering at start is retried
// until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.published = map[string]bool{}
	w.loadTombstones()
	lastFiles := w.filesDigest()
	retry := time.Second
	for {
		err := w.reconcile(ctx, TriggerStart)
		if _, refused := errors.AsType[*Refused](err); refused {
			return err
		}
		if err == nil {
			break
		}
		w.Log.WithError(err).Warnf("first reconcile failed: trying again in %s", retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
		retry = min(2*retry, w.Interval)
	}
	w.announce(ctx)
	w.Notify.ReadyStatus(fmt.Sprintf("publishing %s's keys; reconciling at least every %s", w.Host, w.Interval))

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		if w.Notify != nil {
			w.Notify.Stopping()
		}
		if w.alive != nil {
			if err := w.alive.Withdraw(); err != nil {
				w.Log.WithError(err).Warn("alive record not removed")
			}
			w.Metrics.setAlive(false)
		}
	}()
	for _, run := range w.Runners {
		wg.Go(func() {
			if err := run(ctx); err != nil && ctx.Err() == nil {
				w.Log.WithError(err).Error("background task of the publisher ended")
			}
		})
	}
	wake := make(chan string, 1)
	wg.Go(func() { w.watch(ctx, wake) })

	poll := time.NewTicker(w.Poll)
	defer poll.Stop()
	interval := time.NewTimer(w.Interval)
	defer interval.Stop()
	for {
		var lost <-chan struct{}
		if w.alive != nil {
			lost = w.alive.Lost()
		}
		trigger := ""
		select {
		case <-ctx.Done():
			return nil
		case trigger = <-wake:
		case <-interval.C:
			trigger = TriggerInterval
		case <-lost:
			w.Log.WithField("key", rotation.AliveKey(w.Store.RecordPrefix, w.Host)).Warn("alive record's lease lost: writing it again")
			w.alive = nil
			w.Metrics.setAlive(false)
		case <-poll.C:
			w.Notify.Ping()
			if d := w.filesDigest(); d != lastFiles {
				lastFiles = d
				trigger = TriggerFile
			}
		}
		if w.alive == nil {
			w.announce(ctx)
		}
		if trigger == "" {
			continue
		}
		if err := w.reconcile(ctx, trigger); err != nil && ctx.Err() == nil {
			w.Log.WithError(err).Error("reconcile failed: trying again at the next change or in " + w.Interval.String())
		}
		interval.Reset(w.Interval)
	}
}

// filesDigest is a hash of the key files' contents, to notice a change
// however it was made (renamed over, rewritten in place, same mtime). A
// hash, so that no copy of a private key stays in memory.
func (w *Watcher) filesDigest() string {
	h := sha256.New()
	for _, f := range w.Files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(h, "%s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	return string(h.Sum(nil))
}

// reconcile makes etcd hold the host's current keys and every tombstone
// this master knows.
func (w *Watcher) reconcile(ctx context.Context, trigger string) error {
	w.Metrics.reconciles.WithLabelValues(trigger).Inc()
	log := w.Log.WithField("trigger", trigger)
	rctx, cancel := context.WithTimeout(ctx, w.RequestTimeout)
	defer cancel()
	_, restored, err := w.restore.Read(rctx, w.Client, w.Store.ValueKey(w.Host), clientv3.WithCountOnly())
	if err != nil {
		w.Metrics.fail(ErrEtcd)
		return err
	}
	if restored != nil {
		w.Metrics.restore(restored.Evidence)
		log = log.WithField("evidence", string(restored.Evidence))
		log.Warn("etcd restore detected: " + restored.Error() + "; publishing this host's keys and every tombstone seen again")
	}
	name, items, err := w.Source(ctx)
	if err != nil {
		w.Metrics.fail(ErrSource)
		log.WithError(err).Error("publish-key --watch: refusing to publish the key files; the published value is left as it is")
		return &Refused{Err: err}
	}
	etcdRetired, bad, err := w.Store.Retired(rctx)
	if err != nil {
		w.Metrics.fail(ErrEtcd)
		return err
	}
	for _, e := range bad {
		log.WithError(e).Warn("a key record does not parse: its tombstones are not read")
	}
	for host, r := range etcdRetired {
		w.remember(host, r)
	}
	for _, host := range slices.Sorted(maps.Keys(w.tombs)) {
		if host == w.Host {
			continue
		}
		if err := w.keepRetired(rctx, log, host, w.tombs.missing(host, etcdRetired[host])); err != nil {
			w.Metrics.fail(ErrEtcd)
			return err
		}
	}
	res, err := w.publishOwn(rctx, log, name, items)
	if err != nil {
		return err
	}
	w.remember(w.Host, res.Record.Retired)
	w.saveTombstones(log)
	if w.Trim != nil {
		w.Trim(res.Record, log)
	}
	current := 0
	for _, it := range res.Items {
		if _, sup := res.Record.Superseded[it.KID]; !sup {
			current++
		}
	}
	w.Metrics.setKeys(current, len(res.Record.Superseded), len(res.Record.Retired))
	w.Metrics.lastOK.Set(float64(time.Now().Unix()))
	if restored != nil {
		log.WithField("keys", keystate.KIDs(res.Items)).Info("etcd restore handled: this host's keys and every tombstone seen are in etcd")
	}
	return nil
}

// publishOwn publishes the key files (current keys), with the host's
// tombstones this master knows written back first.
func (w *Watcher) publishOwn(ctx context.Context, log logrus.FieldLogger, name string, items []keystate.Item) (keystate.Result, error) {
	log = log.WithFields(logrus.Fields{"host": w.Host, "key": w.Store.ValueKey(w.Host)})
	var why, added, dropped []string
	res, err := w.Store.Update(ctx, w.Host, func(cur keystate.State) (keystate.State, error) {
		kept, a := cur.KeepRetired(w.tombs[w.Host])
		next, d, err := kept.Publish(items, w.By, time.Now(), w.Grace)
		added, dropped, why = a, d, w.reasons(cur, next, items, a)
		return next, err
	})
	if errors.Is(err, keystate.ErrRetired) {
		w.Metrics.fail(ErrSource)
		log.WithError(err).Errorf("publish-key --watch: %s holds only retired keys: not published", name)
		return res, &Refused{Err: err}
	}
	if err != nil {
		w.Metrics.fail(ErrEtcd)
		return res, fmt.Errorf("publish %s to %s: %w", name, w.Store.ValueKey(w.Host), err)
	}
	if len(dropped) > 0 {
		log.Warnf("%s holds retired key(s) %s: not published (retired keys are never published again)", name, strings.Join(dropped, ", "))
	}
	kids := keystate.KIDs(res.Items)
	switch {
	case res.Wrote && len(why) > 0:
		for _, r := range why {
			w.Metrics.repair(r)
		}
		l := log.WithFields(logrus.Fields{"reasons": strings.Join(why, ","), "keys": kids, "revision": res.Revision})
		if len(added) > 0 {
			l = l.WithField("tombstones", strings.Join(added, ","))
		}
		l.Warnf("repaired this host's published keys (%s): %s", strings.Join(why, ", "), describe(why))
	case res.Wrote:
		log.WithFields(logrus.Fields{"keys": kids, "revision": res.Revision}).Infof("%s published", name)
	}
	for _, it := range items {
		w.published[it.KID] = true
	}
	return res, nil
}

// reasons says why next differs from cur, as repairs (empty: a plain
// publish of changed key files, or nothing).
func (w *Watcher) reasons(cur, next keystate.State, source []keystate.Item, tombstoned []string) []string {
	var why []string
	have := map[string]bool{}
	for _, it := range cur.Items {
		have[it.KID] = true
	}
	switch {
	case cur.ValueErr != nil:
		why = append(why, ValueInvalid)
	case len(cur.Items) == 0 && (len(w.published) > 0 || cur.Stored()):
		why = append(why, ValueMissing)
	default:
		for _, it := range source {
			if w.published[it.KID] && !have[it.KID] {
				why = append(why, CurrentMissing)
				break
			}
		}
		for _, it := range next.Items {
			if _, sup := next.Record.Superseded[it.KID]; sup && !have[it.KID] && !slices.Contains(why, SupersededMissing) {
				if _, wasSup := cur.Record.Superseded[it.KID]; wasSup {
					why = append(why, SupersededMissing)
				}
			}
		}
	}
	for kid := range have {
		if _, gone := next.Record.Retired[kid]; gone {
			why = append(why, RetiredPresent)
			break
		}
	}
	if len(tombstoned) > 0 {
		why = append(why, TombstoneMissing)
	}
	return why
}

// describe says what each reason means, for the log line.
func describe(why []string) string {
	text := map[string]string{
		ValueMissing:      "the published value was gone",
		ValueInvalid:      "the published value did not parse",
		CurrentMissing:    "a key of this host's key files was missing",
		SupersededMissing: "a superseded key was missing",
		RetiredPresent:    "a retired key was back in the value",
		TombstoneMissing:  "a tombstone seen before was missing from the key record",
	}
	var out []string
	for _, r := range why {
		out = append(out, text[r])
	}
	return strings.Join(out, "; ")
}

// keepRetired writes host's tombstones this master knows and its record
// lacks back, and takes those keys out of its value. A host with neither
// a value nor a record in etcd is left alone: it has no value to keep a
// retired key out of, and forget-host's removal of a host stays final.
func (w *Watcher) keepRetired(ctx context.Context, log logrus.FieldLogger, host string, missing map[string]time.Time) error {
	if len(missing) == 0 {
		return nil
	}
	var added, removed []string
	res, err := w.Store.Update(ctx, host, func(cur keystate.State) (keystate.State, error) {
		added, removed = nil, nil
		if !cur.Stored() {
			return cur, nil
		}
		next, a := cur.KeepRetired(missing)
		added = a
		for _, it := range cur.Items {
			if _, gone := next.Record.Retired[it.KID]; gone {
				removed = append(removed, it.KID)
			}
		}
		return next, nil
	})
	if err != nil {
		return fmt.Errorf("write back %s's tombstones: %w", host, err)
	}
	if !res.Wrote {
		return nil
	}
	w.Metrics.repair(TombstoneMissing)
	l := log.WithFields(logrus.Fields{"host": host, "key": w.Store.RecordKey(host), "tombstones": strings.Join(added, ","), "revision": res.Revision})
	if len(removed) > 0 {
		w.Metrics.repair(RetiredPresent)
		l = l.WithField("removed", strings.Join(removed, ","))
	}
	l.Warnf("repaired %s's key record: tombstone(s) this master had seen were missing (a restore from an older snapshot?); retired keys are never published again", host)
	return nil
}

func (w *Watcher) tombstonePath() string {
	if w.StateDir == "" {
		return ""
	}
	return filepath.Join(w.StateDir, TombstonesFile)
}

// loadTombstones reads the tombstone file; without StateDir the path is
// "", which names no file, and the set starts empty.
func (w *Watcher) loadTombstones() {
	t, err := readTombstones(w.tombstonePath())
	if err != nil {
		w.Metrics.fail(ErrStateDir)
		w.Log.WithError(err).Warn("--state-dir: tombstones seen before are not known; those in etcd are kept from now on")
	}
	w.tombs = t
}

// remember adds tombstones seen; a new one is unsaved.
func (w *Watcher) remember(host string, more map[string]time.Time) {
	w.unsaved = w.tombs.add(host, more) || w.unsaved
}

// saveTombstones writes the tombstone file when it changed. A failure is
// logged and counted: etcd still holds the tombstones.
func (w *Watcher) saveTombstones(log logrus.FieldLogger) {
	path := w.tombstonePath()
	if path == "" || !w.unsaved {
		return
	}
	if err := w.tombs.write(path); err != nil {
		w.Metrics.fail(ErrStateDir)
		log.WithError(err).Warn("--state-dir: cannot keep the tombstones seen on disk; a restore of etcd from an older snapshot may bring retired keys back until another master writes them back (fix the directory)")
		return
	}
	w.unsaved = false
	n := 0
	for _, m := range w.tombs {
		n += len(m)
	}
	log.WithField("file", path).WithField("tombstones", n).Info("tombstones seen kept on disk")
}

// announce writes the alive record; a failure is logged and counted, and
// tried again at the next wake-up.
func (w *Watcher) announce(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, w.RequestTimeout)
	defer cancel()
	a, err := rotation.AnnounceAlive(rctx, w.Client, w.Store.RecordPrefix, w.TTL, rotation.Alive{
		Host: w.Host, PID: os.Getpid(), Since: time.Now().UTC(), Version: w.Version,
	})
	if err != nil {
		w.Metrics.fail(ErrAlive)
		w.Log.WithError(err).Warn("alive record not written: trying again")
		return
	}
	w.alive = a
	w.Metrics.setAlive(true)
	w.Log.WithField("key", a.Key()).WithField("ttl", w.TTL).Info("alive record written")
}

// watch wakes the loop when etcd's copy changes: this host's value, or any
// host's key record (a tombstone written or lost). It starts after the
// newest revision seen (the first reconcile's read, at the latest), so
// that no change after that read is missed. A lost connection ends it at
// once (clientv3 would resume it silently, and on an etcd restored
// meanwhile wait for revisions the restored store reaches only later):
// once etcd answers again the loop is woken, and its reconcile tells the
// restore and repairs what it lost. Any other end of the watch wakes the
// loop too.
func (w *Watcher) watch(ctx context.Context, wake chan<- string) {
	send := func(trigger string) {
		select {
		case wake <- trigger:
		default: // a wake-up is already pending
		}
	}
	valueKey := w.Store.ValueKey(w.Host)
	for ctx.Err() == nil {
		lost := make(chan struct{}, 1)
		sctx := etcdclient.WithStreamErrors(ctx, func(error) {
			select {
			case lost <- struct{}{}:
			default:
			}
		})
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(sctx))
		watcher := clientv3.NewWatcher(w.Client)
		from := clientv3.WithRev(w.restore.Seen().Revision + 1)
		values := watcher.Watch(wctx, valueKey, from)
		records := watcher.Watch(wctx, etcdkey.Dir(w.Store.RecordPrefix), clientv3.WithPrefix(), from)
		disconnected := w.follow(wctx, values, records, lost, valueKey, send)
		cancel()
		_ = watcher.Close()
		if disconnected {
			w.awaitEtcd(ctx, valueKey)
			send(TriggerWatch)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// awaitEtcd returns once etcd answers a read again (or ctx ends).
func (w *Watcher) awaitEtcd(ctx context.Context, key string) {
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, w.RequestTimeout)
		_, err := w.Client.Get(rctx, key, clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// follow reads both watches until one ends; disconnected: the connection
// was lost.
func (w *Watcher) follow(ctx context.Context, values, records clientv3.WatchChan, lost <-chan struct{}, valueKey string, send func(string)) (disconnected bool) {
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return false
		case <-lost:
			return true
		case wr, ok = <-values:
		case wr, ok = <-records:
		}
		if !ok {
			send(TriggerWatch)
			return false
		}
		var r *etcdrestore.Restored
		if wr.CompactRevision != 0 {
			r = w.restore.Compaction(wr.CompactRevision)
		} else {
			r = w.restore.Check(etcdrestore.HeaderOf(wr.Header), false)
		}
		if r != nil {
			w.Log.WithField("evidence", string(r.Evidence)).Warn("etcd restore detected by the watch: " + r.Error())
			w.Metrics.restore(r.Evidence)
			send(TriggerRestore)
			return false
		}
		if err := wr.Err(); err != nil {
			send(TriggerWatch)
			return false
		}
		for _, ev := range wr.Events {
			key := string(ev.Kv.Key)
			// Keep-alives make no event; the alive, waiting, state and
			// owner records are not ours to repair.
			if key == valueKey || strings.HasSuffix(key, "/kept") {
				send(TriggerWatch)
				break
			}
		}
	}
}
