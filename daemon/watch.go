package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/backends"
)

// Reconnect backoff while etcd cannot be reached.
const (
	minReconnect = 500 * time.Millisecond
	maxReconnect = 10 * time.Second
)

// watcher keeps the daemon's one watch open: it resumes from the last
// revision delivered, says loudly when the watch breaks and when it is
// back, and turns restores and compactions into a full re-read. Events
// wait in pending for Run, which may be busy with a long reload.
type watcher struct {
	store  WatchStore
	log    logrus.FieldLogger
	obs    Observer
	now    func() time.Time
	notify func()

	mu      sync.Mutex
	events  []timedEvent
	all     bool // re-read everything
	forget  bool // revisions went back: forget those read
	pos     int64
	current int64
	up      bool
	gen     int64 // counts watch streams opened

	cancel  context.CancelFunc
	running sync.WaitGroup // run, until stop
}

type timedEvent struct {
	keys    []string
	rev     int64
	at      time.Time
	changes []backends.Change // with values, when the store gave them
	whole   string            // see backends.WatchEvent.Whole
	gen     int64             // the watch stream it came from
}

func (w *watcher) start(ctx context.Context, keys []string) {
	ctx, w.cancel = context.WithCancel(ctx)
	w.running.Go(func() { w.run(ctx, keys) })
}

func (w *watcher) stop() {
	w.cancel()
	w.running.Wait()
}

// apply hands what arrived to s.
func (w *watcher) apply(s *sched) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.forget {
		s.forget()
	}
	if w.all {
		s.all(w.now())
	}
	switch {
	case w.up:
		s.watching(w.gen)
	case w.gen == 0 && w.pos != 0:
		// No stream opened yet, and the first opens from pos, fixed before
		// any read: it delivers every change after what a read returns
		// now, so the start-up passes follow it. Without this the first
		// change after start-up waited on a read of its own (1–2 ms).
		s.watching(w.gen + 1) // the number open gives it
	default:
		s.watching(0)
	}
	for _, e := range w.events {
		s.event(e)
	}
	w.events, w.all, w.forget = nil, false, false
}

// state is whether the watch is up, and the newest revision it saw.
func (w *watcher) state() (up bool, current int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.up, w.current
}

func (w *watcher) deliver(ev backends.WatchEvent) {
	w.mu.Lock()
	w.pos = max(w.pos, ev.Resume)
	w.current = max(w.current, ev.Revision)
	if len(ev.Keys) > 0 {
		w.events = append(w.events, timedEvent{keys: ev.Keys, rev: ev.Revision, at: w.now(),
			changes: ev.Changes, whole: ev.Whole, gen: w.gen})
	}
	w.mu.Unlock()
	if len(ev.Keys) > 0 {
		w.notify()
	}
}

// setUp marks the watch down, or up on a new stream: the stream is counted
// in the same step, as apply must never see the new stream's number with
// the watch down, or the watch up with the old stream's number.
func (w *watcher) setUp(up bool) {
	w.mu.Lock()
	changed := w.up != up
	w.up = up
	if up {
		w.gen++
	}
	w.mu.Unlock()
	if changed {
		w.obs.WatchUp(up)
		w.notify() // readiness changed
	}
}

// resync makes Run re-read everything; forget when revisions went back.
func (w *watcher) resync(current int64, forget bool) {
	w.mu.Lock()
	w.all, w.forget = true, w.forget || forget
	w.pos, w.current = current, current
	w.mu.Unlock()
	w.notify()
}

func (w *watcher) run(ctx context.Context, keys []string) {
	if len(keys) == 0 {
		return
	}
	var downSince time.Time // zero while the watch is up
	var lastErr string
	backoff := minReconnect
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
			backoff = min(2*backoff, maxReconnect)
			return true
		}
	}
	broken := func(err error) {
		w.mu.Lock()
		pos := w.pos
		w.mu.Unlock()
		if downSince.IsZero() {
			downSince = w.now()
			msg := fmt.Sprintf("etcd watch broken at revision %d: %v", pos, err)
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if cause := w.store.Diagnose(dctx); cause != nil {
				msg += "; cause: " + cause.Error()
			}
			cancel()
			w.log.Warn(msg + "; reconnecting")
			w.setUp(false)
			lastErr = err.Error()
		} else if err.Error() != lastErr {
			lastErr = err.Error()
			w.log.Warnf("etcd watch still down after %s: %v", w.now().Sub(downSince).Round(time.Second), err)
		}
	}
	first := true
	for ctx.Err() == nil {
		w.mu.Lock()
		pos := w.pos
		w.mu.Unlock()
		// Before each (re)start: where is etcd? A revision lower than
		// ours means a restore, which a watch from ours would not notice.
		rev, err := w.store.Revision(ctx, keys[0])
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			broken(err)
			if !wait() {
				return
			}
			continue
		}
		switch {
		case pos == 0:
			w.resync(rev, false)
			pos = rev
		case rev < pos:
			w.log.Warnf("etcd is at revision %d, lower than revision %d processed (restored from a snapshot?); re-reading every resource", rev, pos)
			w.resync(rev, true)
			pos = rev
		}
		if !downSince.IsZero() {
			w.log.Infof("etcd watch back after %s at revision %d (resuming after revision %d)", w.now().Sub(downSince).Round(time.Millisecond), rev, pos)
			w.obs.WatchReconnect()
			downSince = time.Time{}
		} else if !first {
			w.obs.WatchReconnect()
		}
		first = false
		w.mu.Lock()
		w.current = max(w.current, rev)
		w.mu.Unlock()
		// A new stream: what groups follow from the last one's changes
		// no longer applies (sched.watching). pos is at or below any
		// revision a read from now on returns, so the new stream
		// delivers every change after such a read.
		w.setUp(true)
		backoff = minReconnect
		err = w.store.Watch(ctx, keys, pos, w.deliver)
		if ctx.Err() != nil {
			return
		}
		var behind *backends.RevisionBehindError
		switch {
		case errors.Is(err, backends.ErrCompacted):
			w.log.Warnf("%v; re-reading every resource", err)
			w.mu.Lock()
			w.pos = 0 // from etcd's current revision, after a full read
			w.mu.Unlock()
		case errors.As(err, &behind):
			w.log.Warnf("%v; re-reading every resource", err)
			w.resync(behind.Current, true)
		default:
			broken(err)
			if !wait() {
				return
			}
		}
	}
}
