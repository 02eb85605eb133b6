package etcdv3

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/etcdclient"
	"github.com/keysync/confd/internal/etcdrestore"
)

// DefaultStallTimeout is how long a watch waits for any answer from etcd,
// progress requests included, before it gives up on the connection
// (-watch-stall-timeout). etcd answers a progress request only when its
// watchers are synced, and a defrag of a multi-GB member, or a member
// saturated by a large backlog, delays that by many seconds: a timeout
// shorter than such a pause turns it into a reconnect and a full re-read
// on every master at once. A lost connection needs no timeout: it is
// reported by the stream (etcdclient.WithStreamErrors).
const DefaultStallTimeout = 30 * time.Second

// probesPerStall is how many progress requests a healthy etcd gets to
// answer within the stall timeout.
const probesPerStall = 3

// maxRanges is how many ranges a watch opens before keys sharing a
// directory are watched as that directory. clientv3's Watcher creates
// ranges one at a time, each waiting for etcd's answer (and runs a
// goroutine for each): measured by BenchmarkWatchOpen on 2 cores, a range
// per key took 0.30-0.32 s to open 1,000 keys and 2.3-2.5 s for 10,000;
// merged, 0.10-0.15 s and 0.07-0.09 s.
const maxRanges = 64

// A directory watched for the keys below it is never "/" (or ""): a range
// that wide would carry every change to Kubernetes' "/registry/" (values
// included) into confd only to drop it. Directories are merged deepest
// first, so keys share the narrowest directory that brings the ranges
// under maxRanges.

// watchKeys are the keys a watch must cover, each once, in the order given:
// a key below another is covered by it.
//
// The keys a key can lie below are few and known from the key itself ("",
// and its cut before and after each "/"), so each is looked up rather than
// every pair compared, which took 1,000,000 comparisons for 1,000 resources
// on every (re)connect.
func watchKeys(keys []string) []string {
	set := make(map[string]bool, len(keys))
	for _, k := range keys {
		set[k] = true
	}
	var out []string
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if _, below := coveringKey(set, k, false); !seen[k] && !below {
			out = append(out, k)
		}
		seen[k] = true
	}
	return out
}

// coveringKey is the key of set that k is equal to (when self) or below,
// as a path. A key is below at most one key of a set whose keys cover none
// of one another, as watchKeys' are.
func coveringKey(set map[string]bool, k string, self bool) (string, bool) {
	if self && set[k] {
		return k, true
	}
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] != '/' {
			continue
		}
		// k[:i+1] ends in "/" and k extends it; k[:i] has k below it as a path.
		if i+1 < len(k) && set[k[:i+1]] {
			return k[:i+1], true
		}
		if i > 0 && set[k[:i]] {
			return k[:i], true
		}
	}
	if k != "" && set[""] {
		return "", true
	}
	return "", false
}

// watchRange is one range of a watch and the requested keys it serves.
type watchRange struct {
	key, end string
	// keys are the requested keys whose changes the range carries; a
	// change below none of them is dropped.
	keys []string
	set  map[string]bool // keys, when there are several
	// whole: the range carries every change to each of keys in order
	// (backends.WatchEvent.Whole); false for one half of a key watched as itself
	// and as "key/".
	whole bool
}

// keyOf is the requested key k belongs to, or false.
func (r *watchRange) keyOf(k string) (string, bool) {
	if len(r.keys) == 1 {
		return r.keys[0], !r.whole || backends.KeyUnder(k, r.keys[0])
	}
	return coveringKey(r.set, k, true)
}

// oneRange is key's own range. The one range of "/foo" is ["/foo",
// "/foo0"): "0" follows "/", so it holds "/foo", everything below "/foo/",
// and only the neighbours whose next byte sorts before "/" ("/foo-old",
// "/foo.bak"), dropped by keyOf. A prefix range would also carry
// "/foobar" and, for a key as short as "/r", every change to Kubernetes'
// "/registry/" through confd.
func oneRange(k string) watchRange {
	if k == "" || strings.HasSuffix(k, "/") {
		return watchRange{key: prefixStart(k), end: prefixEnd(k), keys: []string{k}, whole: true}
	}
	return watchRange{key: k, end: k + "0", keys: []string{k}, whole: true}
}

// planRanges watches each key as its own range while there are at most
// limit keys. Beyond that, keys are watched as the directories they share,
// deepest first (keys under "/a/b/c/" are merged before those under
// "/a/b/"), until limit ranges remain or only top-level directories ("/a/")
// are left.
func planRanges(keys []string, limit int) []watchRange {
	type group struct {
		dir  string // "": the key stands alone
		keys []string
	}
	groups := make([]group, len(keys))
	for i, k := range keys {
		groups[i] = group{keys: []string{k}}
	}
	// parent is the directory one level above g: of a key, the directory
	// it is in; of a directory, the one it is in; "" when too wide.
	parent := func(g group) string {
		p := g.dir
		if p == "" {
			p = g.keys[0]
		}
		p = strings.TrimSuffix(p, "/")
		i := strings.LastIndexByte(p, '/')
		if i <= 0 {
			return ""
		}
		return p[:i+1]
	}
	depth := func(g group) int { return strings.Count(parent(g), "/") } // 0: too wide
	for len(groups) > limit {
		deepest := 0
		for _, g := range groups {
			deepest = max(deepest, depth(g))
		}
		if deepest == 0 {
			break
		}
		// Merge every group whose parent is at the deepest level.
		byDir := map[string]int{}
		var next []group
		for _, g := range groups {
			if depth(g) != deepest {
				next = append(next, g)
				continue
			}
			p := parent(g)
			if i, ok := byDir[p]; ok {
				next[i].keys = append(next[i].keys, g.keys...)
				continue
			}
			byDir[p] = len(next)
			next = append(next, group{dir: p, keys: slices.Clone(g.keys)})
		}
		groups = next
	}
	out := make([]watchRange, 0, len(groups))
	for _, g := range groups {
		if len(g.keys) == 1 {
			out = append(out, oneRange(g.keys[0]))
			continue
		}
		r := watchRange{key: g.dir, end: prefixEnd(g.dir), keys: g.keys, whole: true, set: make(map[string]bool, len(g.keys))}
		for _, k := range g.keys {
			r.set[k] = true
		}
		out = append(out, r)
	}
	return out
}

// split is what replaces r when etcd refuses it: its keys one by one, or
// a key's halves (the key itself and "key/", for a role granted exactly
// those).
func (r watchRange) split() ([]watchRange, bool) {
	switch {
	case len(r.keys) > 1:
		out := make([]watchRange, len(r.keys))
		for i, k := range r.keys {
			out[i] = oneRange(k)
		}
		return out, true
	case r.whole && r.end == r.key+"0":
		k := r.keys[0]
		return []watchRange{{key: k, keys: r.keys}, {key: k + "/", end: prefixEnd(k + "/"), keys: r.keys}}, true
	}
	return nil, false
}

// answer is what the watch's main loop hears from the goroutines that
// open ranges and forward their answers.
type answer struct {
	i      int // the range
	opened *watchRange
	resp   clientv3.WatchResponse
	closed bool  // the range's channel closed
	err    error // opening failed
	done   bool  // every range is open
}

// Watch streams every change to a key equal to or below one of keys after
// afterRev into fn, in revision order per range, until ctx ends (ctx.Err())
// or the watch fails: compaction (backends.ErrCompacted), a revision lower than
// afterRev or than one its range answered with before
// (*backends.RevisionBehindError), no answer within the stall timeout, progress
// requests included (backends.ErrStalled), a lost connection (the caller resumes
// from the last Resume), or an error from etcd. fn also receives progress
// answers (no keys).
//
// The ranges go through clientv3's Watcher on one stream. A key is one
// range whose answers are filtered back to the key and the keys below it
// ("/foo" hears "/foo/x", never "/foo-old"), so that its changes come in
// order (see backends.WatchEvent.Whole); where the user's role refuses that range,
// as a least-privilege role granting exactly the key and "key/" does, the
// key is watched as those two ranges instead. Beyond maxRanges keys, keys
// sharing a directory are watched as that directory (planRanges) and each
// change is routed to the key it is below, or dropped.
func (c *Client) Watch(ctx context.Context, keys []string, afterRev int64, fn func(backends.WatchEvent)) error {
	stall := c.StallTimeout
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	where := fmt.Sprintf("%s: watch %s after revision %d", c.where, describe(keys), afterRev)
	if len(keys) == 0 {
		<-ctx.Done()
		return ctx.Err()
	}
	lost := make(chan error, 1)
	// RequireLeader: a member cut off from its cluster ends the watch with
	// an error instead of keeping it open and silent. Every range is
	// opened under wctx (or a context derived from it), so that clientv3
	// puts them all on one stream.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(etcdclient.WithStreamErrors(ctx, func(err error) {
		select {
		case lost <- err:
		default:
		}
	})))
	w := clientv3.NewWatcher(c.cli)
	answers := make(chan answer, 64)
	defer func() {
		cancel()
		_ = w.Close()
	}()
	// The goroutines that send stop once the watch ends (wctx).
	send := func(a answer) bool {
		select {
		case answers <- a:
			return true
		case <-wctx.Done():
			return false
		}
	}
	// From afterRev, not after it: etcd answers no progress request while
	// a watcher's next revision is above its own (3.6), as afterRev+1 is
	// until the next write anywhere, so a quiet etcd would look stalled.
	// The changes of afterRev itself, delivered already, are dropped below.
	start := max(afterRev, 1)
	go c.openRanges(wctx, w, planRanges(watchKeys(keys), c.maxRanges), start, send)

	var ranges []*watchRange
	var pos []int64 // per range: delivered up to
	// Per range, the headers seen: one range's answers come in order on
	// one stream, so a lower revision is a restore (etcdrestore, shared
	// with the signer). Only revisions are compared, as confd always did.
	var seen []*etcdrestore.Detector
	allOpen := false
	resume := func() int64 {
		if !allOpen || len(pos) == 0 {
			return afterRev
		}
		return slices.Min(pos)
	}
	last := time.Now() // when etcd last answered
	probing := make(chan struct{}, 1)
	handle := func(a answer) error {
		r := ranges[a.i]
		resp := a.resp
		if resp.CompactRevision != 0 {
			r := seen[a.i].Compaction(resp.CompactRevision)
			return fmt.Errorf("%w (oldest revision kept is %d)", backends.ErrCompacted, r.Current.Revision)
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch of %q: %w", r.key, err)
		}
		if resp.Canceled {
			return fmt.Errorf("watch of %q canceled by etcd: %s", r.key, cancelReason(resp))
		}
		if r := seen[a.i].Check(etcdrestore.Header{Revision: resp.Header.GetRevision()}, true); r != nil {
			return &backends.RevisionBehindError{Current: r.Current.Revision, Seen: r.Seen.Revision}
		}
		if resp.Created {
			return nil // the range is open; it is not synced yet
		}
		// An answer without events means the range is synced up to the
		// header's revision.
		upTo := resp.Header.GetRevision()
		var evs []backends.WatchEvent
		byKey := map[string]int{}
		for _, e := range resp.Events {
			upTo = e.Kv.ModRevision
			k := string(e.Kv.Key)
			owner, ok := r.keyOf(k)
			if !ok || e.Kv.ModRevision <= afterRev {
				continue // "/foobar", heard by the range of "/foo"; or delivered before
			}
			j, ok := byKey[owner]
			if !ok {
				j = len(evs)
				byKey[owner] = j
				evs = append(evs, backends.WatchEvent{})
				if r.whole {
					evs[j].Whole = owner
				}
			}
			// A delete's key-value (a tombstone) has no value.
			ch := backends.Change{Key: k, Value: string(e.Kv.Value), Rev: e.Kv.ModRevision, Deleted: e.Type == mvccpb.DELETE}
			evs[j].Keys = append(evs[j].Keys, k)
			evs[j].Changes = append(evs[j].Changes, ch)
			evs[j].Revision = ch.Rev
		}
		// Only the last event of an answer moves Resume: the others'
		// keys share the range with changes not yet delivered.
		before := resume()
		pos[a.i] = max(pos[a.i], upTo)
		if len(evs) == 0 {
			evs = append(evs, backends.WatchEvent{Revision: upTo})
		}
		for j := range evs {
			evs[j].Resume = before
			if j == len(evs)-1 {
				evs[j].Resume = resume()
			}
			fn(evs[j])
		}
		return nil
	}
	tick := time.NewTicker(stall / probesPerStall)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-lost:
			return fmt.Errorf("%s: watch stream ended (connection lost?): %w", where, rpctypes.Error(err))
		case <-tick.C:
			// Opening waits on etcd too (a password login takes a
			// bcrypt), within a read's deadline at least.
			limit := stall
			if !allOpen {
				limit = max(stall, c.cfg.RequestTimeout)
			}
			if since := time.Since(last); since > limit {
				return fmt.Errorf("%s: %w: no answer from etcd for %s (-watch-stall-timeout %s)", where, backends.ErrStalled, since.Round(time.Millisecond), limit)
			}
			// RequestProgress waits while clientv3 reconnects: one at a
			// time, beside the loop.
			select {
			case probing <- struct{}{}:
				go func() {
					defer func() { <-probing }()
					_ = w.RequestProgress(wctx)
					if c.afterProbe != nil {
						c.afterProbe()
					}
				}()
			default:
			}
		case a := <-answers:
			last = time.Now()
			switch {
			case a.err != nil:
				return fmt.Errorf("%s: %w", where, a.err)
			case a.done:
				allOpen = true
				top := afterRev
				for i := range seen {
					top = max(top, seen[i].Seen().Revision)
				}
				fn(backends.WatchEvent{Revision: top, Resume: resume()})
			case a.opened != nil:
				ranges = append(ranges, a.opened)
				pos = append(pos, afterRev)
				d := &etcdrestore.Detector{}
				d.Check(etcdrestore.Header{Revision: afterRev}, true)
				seen = append(seen, d)
			case a.closed:
				return fmt.Errorf("%s: watch of %q closed by the client", where, ranges[a.i].key)
			default:
				if err := handle(a); err != nil {
					return fmt.Errorf("%s: %w", where, err)
				}
			}
		}
	}
}

// openRanges opens plan's ranges one by one on w, from revision start, and
// sends each one (opened), its answers, and done once all are open. A
// range etcd refuses for permissions is replaced by its split (the keys of
// a directory one by one; a key's halves); any other refusal ends the
// watch. The first answer of each range is its creation's, which proves
// it open and whose header revision is checked like any other.
func (c *Client) openRanges(ctx context.Context, w clientv3.Watcher, plan []watchRange, start int64, send func(answer) bool) {
	n := 0
	for len(plan) > 0 {
		r := plan[0]
		plan = plan[1:]
		rctx, rcancel := context.WithCancel(ctx)
		ch := w.Watch(rctx, r.key, clientv3.WithRange(r.end), clientv3.WithRev(start),
			clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
		created, ok := <-ch
		if !ok {
			rcancel()
			if ctx.Err() == nil {
				send(answer{err: fmt.Errorf("watch of %q closed before etcd confirmed it", r.key)})
			}
			return
		}
		if created.Canceled && created.CompactRevision == 0 {
			rcancel()
			reason := cancelReason(created)
			if more, ok := r.split(); ok && strings.Contains(reason, rpctypes.ErrPermissionDenied.Error()) {
				plan = append(more, plan...)
				continue
			}
			send(answer{err: fmt.Errorf("watch of %q refused by etcd: %s", r.key, reason)})
			return
		}
		i := n
		n++
		if !send(answer{i: i, opened: &r}) || !send(answer{i: i, resp: created}) {
			rcancel()
			return
		}
		go func() {
			defer rcancel()
			for resp := range ch {
				if !send(answer{i: i, resp: resp}) {
					return
				}
			}
			send(answer{i: i, closed: true})
		}()
	}
	send(answer{done: true})
}

// cancelReason is why etcd canceled a watch, for an error message.
func cancelReason(resp clientv3.WatchResponse) string {
	if err := resp.Err(); err != nil {
		return err.Error()
	}
	return cmp.Or(resp.CancelReason, "no reason given")
}

// Revision is etcd's current revision, read through key (one the caller
// may read: least-privilege roles deny a read of "/").
func (c *Client) Revision(ctx context.Context, key string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("%s: read revision: %w", c.where, err)
	}
	return resp.Header.Revision, nil
}

// Diagnose names why etcd cannot be used right now (an expired client
// certificate, an unreachable endpoint, a refused handshake); nil when
// nothing was found.
func (c *Client) Diagnose(ctx context.Context) error {
	return etcdclient.Diagnose(ctx, c.cfg)
}
