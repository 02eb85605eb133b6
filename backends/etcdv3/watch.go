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

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/backends/internal/keypath"
	"github.com/keysync/confd/internal/etcdclient"
)

// The watch's types are backends', which links no etcd or gRPC.
type (
	WatchEvent          = backends.WatchEvent
	Change              = backends.Change
	RevisionBehindError = backends.RevisionBehindError
)

// ErrStalled and ErrCompacted are backends'.
var (
	ErrStalled   = backends.ErrStalled
	ErrCompacted = backends.ErrCompacted
)

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
	id    int64  // etcd's watch ID on the stream
	key   string // the range's start, for messages
}

// Watch streams every change to a key equal to or below one of keys after
// afterRev into fn, in revision order per range, until ctx ends (ctx.Err())
// or the watch fails: compaction (ErrCompacted), a revision lower than
// afterRev or than one its range answered with before (*RevisionBehindError), no
// answer to progress probes (ErrStalled), the stream's end (the
// connection was lost; the caller resumes from the last Resume), or an
// error from etcd. A key is watched as one range whose answers are
// filtered back to the key and the keys below it ("/foo" hears "/foo/x",
// never "/foo-old"), so that its changes come in order (see
// WatchEvent.Whole); where the user's role refuses that range, as a
// least-privilege role granting exactly the key and "key/" does, the key is
// watched as those two ranges instead. fn also receives progress answers
// (no keys).
//
// All ranges share one gRPC stream of etcd's Watch API, read by one
// goroutine and written by another, however many ranges there are:
// clientv3's Watcher runs a goroutine per range (ours forwarded each one's
// channel in another: 20,000 for 10,000 resources), and creates one range
// at a time, waiting for each answer, which at 10,000 ranges outlasted the
// creation deadline, so that the watch never opened. A lost connection
// ends the stream and the watch; the caller opens a new one from Resume.
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
	// Opening the stream and creating the ranges wait on etcd: a stalled
	// server must not hold us there.
	deadline := max(2*probe, c.requestTimeout)
	var createStalled atomic.Bool
	creating := time.AfterFunc(deadline, func() { createStalled.Store(true); cancel() })
	stalled := func(err error) error {
		if createStalled.Load() && ctx.Err() == nil {
			return fmt.Errorf("%s: %w: etcd did not confirm the watch within %s", where, ErrStalled, deadline)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: %w", where, err)
	}
	// Through the client's connection, so its interceptors add what
	// clientv3's own watch stream gets: the auth token, fetched anew.
	stream, err := pb.NewWatchClient(c.cli.ActiveConnection()).Watch(wctx, c.baseCallOptions()...)
	if err != nil {
		creating.Stop()
		return stalled(rpctypes.Error(err))
	}
	wk := watchKeys(keys)
	// One goroutine reads the stream and one writes it, so that neither
	// waits on the other: 10,000 creations sent while their answers went
	// unread filled gRPC's flow-control windows both ways, and etcd
	// stopped reading. Requests: each key's creation, up to two
	// more for its halves, then probes.
	requests := make(chan *pb.WatchRequest, 3*len(wk)+4)
	answers := make(chan *pb.WatchResponse, 64)
	ended := make(chan error, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			resp, err := stream.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case answers <- resp:
			case <-wctx.Done():
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			select {
			case req := <-requests:
				// A failed send ends the stream: Recv reports why.
				if stream.Send(req) != nil {
					return
				}
			case <-wctx.Done():
				return
			}
		}
	}()
	var seen headers // openRanges adds each range, from afterRev
	ranges, early, err := openRanges(requests, answers, ended, wk, afterRev, &seen)
	creating.Stop()
	if err != nil {
		// A compaction is no creation answer: it comes among the early
		// answers, handled below.
		var behind *RevisionBehindError
		if errors.As(err, &behind) {
			return fmt.Errorf("%s: %w", where, err)
		}
		return stalled(err)
	}
	byID := make(map[int64]int, len(ranges))
	for i, r := range ranges {
		byID[r.id] = i
	}
	// pos[i]: every change in range i up to pos[i] was delivered. Ranges
	// catching up on a backlog advance independently, so only their
	// minimum is a safe place to resume from.
	pos := make([]int64, len(ranges))
	for i := range pos {
		pos[i] = afterRev
	}
	// last is when etcd last answered; progressAt when it last answered a
	// progress request, probedAt when the last probe went out.
	last := time.Now()
	var progressAt, probedAt time.Time
	probing := make(chan struct{}, 1)
	probed := func() {
		<-probing
		if c.afterProbe != nil {
			c.afterProbe()
		}
	}
	// quietRev carries etcd's revision, read by a probe when the one
	// before it had no progress answer; see below.
	quietRev := make(chan int64, 1)
	var revKey string
	if len(wk) > 0 {
		revKey = prefixStart(wk[0])
	}
	progress := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}
	// handle takes one answer; a non-nil error ends the watch.
	handle := func(resp *pb.WatchResponse) error {
		last = time.Now()
		rev := resp.GetHeader().GetRevision()
		if resp.WatchId == clientv3.InvalidWatchID && !resp.Created {
			// A progress answer: every range is synced up to rev.
			if len(ranges) == 0 {
				return nil
			}
			for i := range ranges {
				if err := seen.check(i, rev); err != nil {
					return err
				}
				pos[i] = max(pos[i], rev)
			}
			progressAt = last
			fn(WatchEvent{Revision: rev, Resume: slices.Min(pos)})
			return nil
		}
		i, ok := byID[resp.WatchId]
		if !ok {
			return nil // no range of ours
		}
		r := ranges[i]
		if resp.CompactRevision != 0 {
			return fmt.Errorf("%w (oldest revision kept is %d)", ErrCompacted, resp.CompactRevision)
		}
		if resp.Canceled {
			return fmt.Errorf("watch of %q canceled by etcd: %s", r.key, cancelReason(resp))
		}
		if err := seen.check(i, rev); err != nil {
			return err
		}
		ev := WatchEvent{Revision: rev, Whole: r.whole}
		for _, e := range resp.Events {
			ev.Revision = e.Kv.ModRevision
			k := string(e.Kv.Key)
			if r.whole != "" && !keypath.Under(k, r.whole) {
				continue // "/foobar", heard by the range of "/foo"
			}
			ev.Keys = append(ev.Keys, k)
			ch := Change{Key: k, Rev: e.Kv.ModRevision, Deleted: e.Type == mvccpb.DELETE}
			if !ch.Deleted {
				ch.Value = string(e.Kv.Value)
			}
			ev.Changes = append(ev.Changes, ch)
		}
		if len(resp.Events) == 0 {
			progressAt = last
		}
		// An answer without events means the range is synced up to the
		// header's revision.
		pos[i] = max(pos[i], ev.Revision)
		ev.Resume = slices.Min(pos)
		fn(ev)
		return nil
	}
	// What came for open ranges while others were still being created.
	for _, resp := range early {
		if err := handle(resp); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	tick := time.NewTicker(probe)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-ended:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%s: watch stream ended (connection lost?): %w", where, rpctypes.Error(err))
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
			select {
			case probing <- struct{}{}:
				probedAt = time.Now()
				// Never blocks: a stream whose requests are not leaving
				// is stalled, and two intervals tell.
				select {
				case requests <- progress:
				default:
				}
				if !unanswered || revKey == "" {
					probed()
					break
				}
				// The read blocks while the client reconnects, hence the
				// goroutine; one probe at a time.
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer probed()
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
		case resp := <-answers:
			if err := handle(resp); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
	}
}

// cancelReason is why etcd canceled a watch, for an error message.
func cancelReason(resp *pb.WatchResponse) string {
	if resp.CancelReason != "" {
		return resp.CancelReason
	}
	return "no reason given"
}

// headers holds the highest header revision each range has answered with.
// A range answers in order, so a lower one from it means etcd went back
// (a restore). Ranges are not ordered with one another: etcd sends the
// backlog of a range catching up beside the answers of ranges already
// current, so another range's later revision may come first.
type headers []int64

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

// openRanges creates the watch of each key through requests: as one range,
// filtered back to the key, or, where etcd refuses that range, as the key
// and "key/". The creations are sent together and etcd answers them in the
// order sent (a refused one with no watch ID of its own), so the n-th
// creation answer is the n-th request's; answers for ranges already open
// that arrive meanwhile are returned, in order, for the caller to handle
// first. seen gets each range's creation header.
//
// The one range of "/foo" is ["/foo", "/foo0"): "0" follows "/", so it
// holds "/foo", everything below "/foo/", and only the neighbours whose
// next byte sorts before "/" ("/foo-old", "/foo.bak"). A prefix range would
// also carry "/foobar" and, for a key as short as "/r", every change to
// Kubernetes' "/registry/" (values included) through confd.
func openRanges(requests chan<- *pb.WatchRequest, answers <-chan *pb.WatchResponse, ended <-chan error, keys []string, afterRev int64, seen *headers) ([]watchRange, []*pb.WatchResponse, error) {
	type want struct {
		r        watchRange
		end      string
		splitter bool // the one range of a key: refused, it becomes two
	}
	var sent []want
	// requests has room for every creation: sending never blocks.
	send := func(w want) {
		sent = append(sent, w)
		requests <- &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: &pb.WatchCreateRequest{
			Key: []byte(w.r.key), RangeEnd: []byte(w.end), StartRevision: afterRev + 1,
		}}}
	}
	for _, k := range keys {
		w := want{r: watchRange{whole: k, key: k}, end: k + "0", splitter: true}
		if k == "" || strings.HasSuffix(k, "/") {
			// A prefix range is the key's exactly.
			w = want{r: watchRange{whole: k, key: prefixStart(k)}, end: prefixEnd(k)}
		}
		send(w)
	}
	var out []watchRange
	var early []*pb.WatchResponse
	for answered := 0; answered < len(sent); {
		var resp *pb.WatchResponse
		select {
		case resp = <-answers:
		case err := <-ended:
			return nil, nil, rpctypes.Error(err)
		}
		if !resp.Created {
			early = append(early, resp)
			continue
		}
		w := sent[answered]
		answered++
		if resp.Canceled {
			if !w.splitter || !strings.Contains(resp.CancelReason, rpctypes.ErrPermissionDenied.Error()) {
				return nil, nil, fmt.Errorf("watch of %q refused by etcd: %s", w.r.key, cancelReason(resp))
			}
			for _, half := range planReads([]string{w.r.key}) {
				h := want{r: watchRange{key: half.from}}
				if half.prefix {
					h.r.key, h.end = prefixStart(half.from), prefixEnd(half.from)
				}
				send(h)
			}
			continue
		}
		w.r.id = resp.WatchId
		out = append(out, w.r)
		// From afterRev: a creation answered below it means etcd is
		// behind what was already delivered.
		*seen = append(*seen, afterRev)
		if err := seen.check(len(out)-1, resp.GetHeader().GetRevision()); err != nil {
			return nil, nil, err
		}
	}
	return out, early, nil
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
