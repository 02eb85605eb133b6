package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/backends/internal/keypath"
	"github.com/keysync/confd/internal/etcdclient"
)

// WatchEvent is one answer of Watch: keys that changed up to Revision, or,
// with no keys, a sign of life at etcd's current Revision.
type WatchEvent struct {
	Revision int64
	Keys     []string
	// Changes are the changes behind Keys, with their values, in the
	// order etcd made them.
	Changes []Change
	// Whole, when set, is a watched key whose every change (to it and
	// to the keys below it) comes in one range, in revision order: so
	// Changes applied to a read of keys under Whole at a revision below
	// theirs give those keys' state at Revision, without reading again.
	// It is empty when the key is watched as two ranges (as itself and as
	// "key/", for a role granted exactly those), whose answers may be
	// delivered in either order.
	Whole string
	// Resume is the revision up to which every change in the watched
	// ranges has been delivered: a new watch from Resume+1 misses nothing.
	Resume int64
}

// Change is one key's change in a WatchEvent.
type Change struct {
	Key, Value string
	Rev        int64 // the revision that made it
	Deleted    bool
}

// RevisionBehindError means etcd answered with a revision lower than one it
// had shown before: it was restored from a snapshot or rebuilt, and a watch
// from the old revision would wait for revisions that may not come for a
// long time.
type RevisionBehindError struct {
	Current, Seen int64
}

func (e *RevisionBehindError) Error() string {
	return fmt.Sprintf("etcd is at revision %d, lower than revision %d seen before (restored from a snapshot or rebuilt?)", e.Current, e.Seen)
}

// ErrStalled is wrapped by Watch when etcd answered nothing, not even a
// progress request, for two probe intervals: the connection is down or the
// member is stuck, and the client library would retry silently.
var ErrStalled = errors.New("watch stalled")

// DefaultProbeInterval is how often Watch asks etcd for progress.
const DefaultProbeInterval = 2 * time.Second

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
	below := func(k string) bool {
		if k != "" && set[""] {
			return true
		}
		for i := 0; i < len(k); i++ {
			if k[i] != '/' {
				continue
			}
			// k[:i+1] ends in "/" and k extends it; k[:i] has k below it as a path.
			if (i+1 < len(k) && set[k[:i+1]]) || (i > 0 && set[k[:i]]) {
				return true
			}
		}
		return false
	}
	var out []string
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if !seen[k] && !below(k) {
			out = append(out, k)
		}
		seen[k] = true
	}
	return out
}

// watchRange is one range of a watch: a key's one range, filtered back to
// the key and the keys below it (whole), or one half of a key watched as
// itself and as "key/".
type watchRange struct {
	whole string // "": a half
	ch    clientv3.WatchChan
	first *clientv3.WatchResponse // its answer to the creation
}

// Watch streams every change to a key equal to or below one of keys after
// afterRev into fn, in revision order per range, until ctx ends (ctx.Err())
// or the watch fails: compaction (ErrCompacted), a revision lower than
// afterRev or than one its range answered with before (*RevisionBehindError), no
// answer to progress probes (ErrStalled), or an error from etcd. All ranges
// share one gRPC stream. A key is watched as one range whose answers are
// filtered back to the key and the keys below it ("/foo" hears "/foo/x",
// never "/foo-old"), so that its changes come in order (see
// WatchEvent.Whole); where the user's role refuses that range, as a
// least-privilege role granting exactly the key and "key/" does, the key is
// watched as those two ranges instead. fn also receives progress answers
// (no keys).
func (c *Client) Watch(ctx context.Context, keys []string, afterRev int64, fn func(WatchEvent)) error {
	probe := c.probeInterval
	if probe <= 0 {
		probe = DefaultProbeInterval
	}
	where := fmt.Sprintf("etcd %s: watch %s after revision %d", strings.Join(c.endpoints, ", "), describe(keys), afterRev)
	// RequireLeader: a member cut off from its cluster ends the watch with
	// an error instead of keeping it open and silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	type answer struct {
		from int // index of the range
		resp clientv3.WatchResponse
	}
	merged := make(chan answer)
	closed := make(chan struct{}, 1)
	// Creating the watches waits on etcd's answers: a stalled server must
	// not hold us there.
	var createStalled atomic.Bool
	creating := time.AfterFunc(max(2*probe, c.requestTimeout), func() { createStalled.Store(true); cancel() })
	wk := watchKeys(keys)
	ranges, err := c.openRanges(wctx, wk, afterRev)
	creating.Stop()
	if createStalled.Load() && ctx.Err() == nil {
		return fmt.Errorf("%s: %w: etcd did not confirm the watch within %s", where, ErrStalled, max(2*probe, c.requestTimeout))
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: %w", where, err)
	}
	// pos[i]: every change in range i up to pos[i] was delivered. Ranges
	// catching up on a backlog advance independently, so only their
	// minimum is a safe place to resume from.
	pos := make([]int64, len(ranges))
	for i, r := range ranges {
		pos[i] = afterRev
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := func(resp clientv3.WatchResponse) bool {
				select {
				case merged <- answer{i, resp}:
					return true
				case <-wctx.Done():
					return false
				}
			}
			if !send(*r.first) {
				return
			}
			// Leave on wctx, not only when ch closes: clientv3 closes it
			// only once its stream goroutine runs again, which it does
			// not while a reconnect keeps failing (an expired
			// certificate).
			for {
				var resp clientv3.WatchResponse
				var ok bool
				select {
				case resp, ok = <-r.ch:
				case <-wctx.Done():
					return
				}
				if !ok {
					select {
					case closed <- struct{}{}:
					default:
					}
					return
				}
				if !send(resp) {
					return
				}
			}
		}()
	}
	seen := newHeaders(len(ranges), afterRev)
	// last is when etcd last answered; progressAt when it last answered a
	// progress request, probedAt when the last probe went out.
	last := time.Now()
	var progressAt, probedAt time.Time
	probing := make(chan struct{}, 1)
	// quietRev carries etcd's revision, read by a probe when the one
	// before it had no progress answer; see below.
	quietRev := make(chan int64, 1)
	var revKey string
	if len(wk) > 0 {
		revKey = prefixStart(wk[0])
	}
	tick := time.NewTicker(probe)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-closed:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%s: watch closed (client closed or connection lost)", where)
		case <-tick.C:
			if since := time.Since(last); since > 2*probe {
				return fmt.Errorf("%s: %w: no answer from etcd for %s", where, ErrStalled, since.Round(time.Millisecond))
			}
			// etcd 3.6 drops a progress request while a watcher's start
			// revision is above its own, as ours are from their creation
			// until the next write anywhere in etcd: a quiet etcd never
			// answers one, and every watch looked stalled after two
			// intervals. So when the last probe had no progress answer,
			// this one also reads etcd's revision, over the same client,
			// to tell that silence from a stall.
			unanswered := probedAt.IsZero() || progressAt.Before(probedAt)
			// With wctx itself: the first caller's context becomes the
			// shared stream's, so a shorter one would end the stream.
			// It blocks while the client library reconnects, hence the
			// goroutine; one probe at a time.
			select {
			case probing <- struct{}{}:
				probedAt = time.Now()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() {
						<-probing
						if c.afterProbe != nil {
							c.afterProbe()
						}
					}()
					_ = c.cli.RequestProgress(wctx)
					if !unanswered || revKey == "" {
						return
					}
					rctx, cancel := context.WithTimeout(wctx, probe)
					defer cancel()
					if rev, err := c.Revision(rctx, revKey); err == nil {
						select {
						case quietRev <- rev:
						default:
						}
					}
				}()
			default:
			}
		case rev := <-quietRev:
			// At the revision we last heard, etcd has nothing to tell: it
			// is there. Above it, the next progress request is answered.
			// Below it, etcd went back (a restore): the stall this leaves
			// reconnects, and the new watch's first answer tells it.
			if rev == slices.Max(seen) {
				last = time.Now()
			}
		case a := <-merged:
			resp := a.resp
			r := ranges[a.from]
			last = time.Now()
			if resp.CompactRevision != 0 {
				return fmt.Errorf("%s: %w (oldest revision kept is %d)", where, ErrCompacted, resp.CompactRevision)
			}
			if err := resp.Err(); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("%s: %w", where, err)
			}
			if err := seen.check(a.from, resp.Header.Revision); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			ev := WatchEvent{Revision: resp.Header.Revision, Whole: r.whole}
			for _, e := range resp.Events {
				ev.Revision = e.Kv.ModRevision
				k := string(e.Kv.Key)
				if r.whole != "" && !keypath.Under(k, r.whole) {
					continue // "/foobar", heard by the range of "/foo"
				}
				ev.Keys = append(ev.Keys, k)
				ch := Change{Key: k, Rev: e.Kv.ModRevision, Deleted: e.Type == clientv3.EventTypeDelete}
				if !ch.Deleted {
					ch.Value = string(e.Kv.Value)
				}
				ev.Changes = append(ev.Changes, ch)
			}
			if resp.Created && len(resp.Events) == 0 {
				continue // the header check above is all a creation tells
			}
			if len(resp.Events) == 0 {
				progressAt = last
			}
			// A progress answer (no events) means the range is synced
			// up to the header's revision.
			pos[a.from] = max(pos[a.from], ev.Revision)
			ev.Resume = slices.Min(pos)
			fn(ev)
		}
	}
}

// headers holds the highest header revision each range has answered with.
// A range answers in order, so a lower one from it means etcd went back
// (a restore). Ranges are not ordered with one another: their answers meet
// on goroutines, and a range's creation answer is sent on only once every
// range is open, so another range's later revision may come first.
type headers []int64

// newHeaders starts every range at afterRev: a creation answer below it
// means etcd is behind what was already delivered.
func newHeaders(n int, afterRev int64) headers {
	h := make(headers, n)
	for i := range h {
		h[i] = afterRev
	}
	return h
}

// check records range i's answer at header revision rev (0: none given).
func (h headers) check(i int, rev int64) error {
	if rev <= 0 {
		return nil
	}
	if rev < h[i] {
		return &RevisionBehindError{Current: rev, Seen: h[i]}
	}
	h[i] = rev
	return nil
}

// openRanges opens the watch of each key: as one range, filtered back to
// the key, or, where etcd refuses that range, as the key and "key/". Each
// range's creation is awaited (clientv3 creates one watch at a time on a
// stream anyway), so a refusal is known before the next opens.
//
// The one range of "/foo" is ["/foo", "/foo0"): "0" follows "/", so it
// holds "/foo", everything below "/foo/", and only the neighbours whose
// next byte sorts before "/" ("/foo-old", "/foo.bak"). A prefix range would
// also carry "/foobar" and, for a key as short as "/r", every change to
// Kubernetes' "/registry/" (values included) through confd.
func (c *Client) openRanges(ctx context.Context, keys []string, afterRev int64) ([]watchRange, error) {
	open := func(from string, span ...clientv3.OpOption) (clientv3.WatchChan, *clientv3.WatchResponse, error) {
		opts := append([]clientv3.OpOption{clientv3.WithRev(afterRev + 1), clientv3.WithCreatedNotify()}, span...)
		ch := c.cli.Watch(ctx, from, opts...)
		select {
		case resp, ok := <-ch:
			if !ok {
				return nil, nil, fmt.Errorf("watch of %q closed as it opened (client closed or connection lost)", from)
			}
			return ch, &resp, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	var out []watchRange
	for _, k := range keys {
		if k == "" || strings.HasSuffix(k, "/") {
			// A prefix range is the key's exactly.
			ch, first, err := open(k, clientv3.WithPrefix())
			if err != nil {
				return nil, err
			}
			out = append(out, watchRange{whole: k, ch: ch, first: first})
			continue
		}
		ch, first, err := open(k, clientv3.WithRange(k+"0"))
		if err != nil {
			return nil, err
		}
		if !first.Canceled || !refused(first.Err()) {
			out = append(out, watchRange{whole: k, ch: ch, first: first})
			continue
		}
		for _, half := range planReads([]string{k}) {
			var span []clientv3.OpOption
			if half.prefix {
				span = append(span, clientv3.WithPrefix())
			}
			ch, first, err := open(half.from, span...)
			if err != nil {
				return nil, err
			}
			out = append(out, watchRange{ch: ch, first: first})
		}
	}
	return out, nil
}

// refused tells a watch refused by the user's role. clientv3 hands the
// server's reason on as a plain error, the gRPC status only in its text.
func refused(err error) bool {
	return err != nil && strings.Contains(err.Error(), rpctypes.ErrPermissionDenied.Error())
}

// Revision is etcd's current revision, read through key (one the caller
// may read: least-privilege roles deny a read of "/").
func (c *Client) Revision(ctx context.Context, key string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	resp, err := c.cli.Get(ctx, key, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcd %s: read revision: %w", strings.Join(c.endpoints, ", "), err)
	}
	return resp.Header.Revision, nil
}

// Diagnose names why etcd cannot be used right now (an expired client
// certificate, an unreachable endpoint, a refused handshake); nil when
// nothing was found.
func (c *Client) Diagnose(ctx context.Context) error {
	return etcdclient.Diagnose(ctx, c.cfg)
}
