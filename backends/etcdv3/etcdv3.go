// Package etcdv3 reads and watches keys in etcd through the v3 API: every
// read is a snapshot at one revision, and watches resume from a revision so
// that no change between a read and the watch is missed.
package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/internal/etcdclient"
)

// maxTxnOps is etcd's default --max-txn-ops; a larger transaction is refused.
const maxTxnOps = 128

// pageKeys bounds the keys one response carries: a prefix of 100k keys is
// read in pages at one revision instead of one response that the client
// holds whole, beside the list it fills, at its peak. Each page request makes
// etcd count the rest of the range, so pages too small cost server time.
// Measured on 100k keys of 80 bytes (confd -onetime, median of 12
// interleaved runs): 5000 a page took 0.35 s and 56 MB peak RSS, 10000
// 0.31 s and 58 MB, 20000 0.30 s and 62 MB.
const pageKeys = 10000

// pageBytes bounds the keys and values of one response after the first, as
// pageKeys bounds its keys: pages of 10000 keys of 2 kB values are 20 MB,
// each held whole while decoded beside everything read before. etcd has no
// byte limit on a range, so each request asks for as many keys as fit
// pageBytes at the size the response before it had. The first asks for
// pageKeys: a smaller first page would cost a request more, and so one
// more count of the whole range, on every large read (and a first page of
// 2500 did not lower the peak: 20k keys of 2 kB, 15 interleaved runs, 136
// -> 134 MB). Keys of short values never reach the bound (10000 keys of
// 64 bytes are under 1 MB). Measured on 20k keys of 2 kB (confd -onetime,
// interleaved runs of builds differing only here, median peak RSS and
// time, three rounds of 15): 8 MiB 136 / 136 / 139 MB and 0.39 / 0.43 /
// 0.52 s; 4 MiB 124 / 123 / 125 MB and 0.41 / 0.43 / 0.55 s; 2 MiB 118 MB
// and 0.59 s, too slow, as etcd counts the rest of the range for every
// page. 100k keys of 64 bytes: 48.2 / 47.8 MB, 0.78 / 0.80 s (no effect).
const pageBytes = 4 << 20

// restShare is how a long range's pages grow: a page after the first asks
// for at least the rest of the range over restShare (within pageBytes).
// For every page etcd visits the whole rest of the range to count it, limit
// or not (issue etcd-io/etcd#16510), so pages of pageKeys alone made a read
// of n keys visit n²/(2·pageKeys): 50 million keys at a million, 9.6 s of
// etcd's CPU against 2.7 s for the same keys in one response, and the read
// took 20× the time of a tenth of the keys. Pages of a share of what is left
// visit about restShare·n. A page then holds at most an eighth of what the
// read holds in the end; below restShare·pageKeys keys (80k) the pages are
// pageKeys as before.
const restShare = 8

// readAttempts bounds how often GetValues starts over when the revision it
// reads at is compacted between two of its transactions.
const readAttempts = 3

// Client is a connected etcd v3 client.
type Client struct {
	cli   *clientv3.Client
	where string       // "etcd ENDPOINTS", as errors name it
	close func() error // the client's Close, once
	cfg   Config
	// StallTimeout is how long a watch waits for any answer before it
	// ends with backends.ErrStalled; zero means DefaultStallTimeout.
	StallTimeout time.Duration
	// The package's maxRanges, pageKeys and pageBytes (New), which tests
	// change.
	maxRanges, pageKeys, pageBytes int

	// afterBatch, when set by tests, runs after each request (transaction
	// or page) of one GetValues, to provoke what can happen between them;
	// counted is the keys etcd counted for it (its ranges' counts).
	afterBatch func(attempt, batch int, counted int64)

	// afterProbe, when set by tests, runs after each progress request of
	// a watch.
	afterProbe func()
}

// Config is how to reach etcd; see etcdclient.Config.
type Config = etcdclient.Config

// New connects to etcd through etcdclient.New, which proves the connection
// and names the cause when it fails.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = etcdclient.DefaultRequestTimeout
	}
	cli, err := etcdclient.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Client{cli: cli, where: "etcd " + strings.Join(cli.Endpoints(), ", "), cfg: cfg,
		close: sync.OnceValue(cli.Close), maxRanges: maxRanges, pageKeys: pageKeys, pageBytes: pageBytes}, nil
}

// GetValues returns every key equal to or below (as a path) one of keys,
// all read at one revision, and that revision; see GetPairs.
func (c *Client) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	pairs, rev, err := c.GetPairs(ctx, keys)
	if err != nil {
		return nil, 0, err
	}
	vals := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		vals[kv.Key] = kv.Value
	}
	return vals, rev, nil
}

// GetPairs is GetValues as a list, in no guaranteed order: the keys of one
// requested key come in etcd's order (by key), but pages of several
// requested keys interleave; a store key covered by two requested keys
// appears twice. Keys are read in transactions
// of at most maxTxnOps gets, each answering about pageKeys keys at most;
// the first fixes the revision, and the others, and the further pages of
// ranges that did not fit, read at it. A render of 100k keys needs no map
// on the way, nor a sort of what etcd already sorted.
func (c *Client) GetPairs(ctx context.Context, keys []string) ([]memkv.KVPair, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	reads := planReads(keys)
	for attempt := 1; ; attempt++ {
		pairs, rev, err := c.readAt(rctx, reads, attempt)
		if err == nil {
			return pairs, rev, nil
		}
		// Only a compaction between our own transactions is worth a fresh
		// start; the first transaction reads the newest revision.
		if attempt == readAttempts || !errors.Is(err, rpctypes.ErrCompacted) || rctx.Err() != nil {
			return nil, 0, c.withCause(ctx, fmt.Errorf("%s: read %s: %w", c.where, describe(keys), err))
		}
	}
}

// diagnoseBudget bounds the look for a cause behind a failed request.
const diagnoseBudget = 2 * time.Second

// withCause adds to a request that found no etcd (the client library says
// only "context deadline exceeded" while it redials) what a connection of
// our own finds: refused, a TLS refusal, an expired client certificate.
// Nothing is added when the caller gave up or every endpoint looks fine.
func (c *Client) withCause(ctx context.Context, err error) error {
	if ctx.Err() != nil || !(errors.Is(err, context.DeadlineExceeded) || etcdclient.IsUnavailable(err)) {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, diagnoseBudget)
	defer cancel()
	if cause := c.Diagnose(dctx); cause != nil {
		return fmt.Errorf("%w (cause: %v)", err, cause)
	}
	return err
}

// read is one range request: the key from, or with prefix every key that
// starts with it.
type read struct {
	from   string
	prefix bool
}

// planReads turns each key into the ranges that cover exactly it: "/foo"
// becomes "/foo" itself plus the prefix "/foo/", so that "/foobar" is never
// fetched (a plain prefix get of "/foo" would transfer it just to drop it).
func planReads(keys []string) []read {
	seen := make(map[string]bool, len(keys))
	var reads []read
	for _, k := range keys {
		if seen[k] {
			continue
		}
		seen[k] = true
		if k == "" || strings.HasSuffix(k, "/") {
			reads = append(reads, read{from: k, prefix: true})
			continue
		}
		reads = append(reads, read{from: k}, read{from: k + "/", prefix: true})
	}
	return reads
}

// rangeReply is what one range answered, for the paging that follows.
type rangeReply struct {
	more  bool
	count int64  // keys in the whole rest of the range, beyond the limit
	kvs   int    // keys returned
	bytes int    // their keys' and values' bytes
	last  string // the last key returned, where the next page starts
}

// appendRange appends what r returned to pairs. The ranges planReads makes
// hold exactly the keys of the key they were requested for, so nothing is
// filtered here.
func appendRange(pairs []memkv.KVPair, r *pb.RangeResponse) ([]memkv.KVPair, rangeReply) {
	rr := rangeReply{more: r.GetMore(), count: r.GetCount(), kvs: len(r.GetKvs())}
	for _, kv := range r.GetKvs() {
		rr.bytes += len(kv.Key) + len(kv.Value)
		pairs = append(pairs, memkv.KVPair{Key: string(kv.Key), Value: string(kv.Value)})
	}
	if n := len(r.GetKvs()); n > 0 {
		rr.last = string(r.Kvs[n-1].Key)
	}
	return pairs, rr
}

// maxGrow bounds how many pairs a count from etcd reserves room for.
const maxGrow = 1 << 22

// errNoRevision is a response without the revision it was read at.
var errNoRevision = errors.New("response carries no revision")

func (c *Client) readAt(ctx context.Context, reads []read, attempt int) ([]memkv.KVPair, int64, error) {
	var pairs []memkv.KVPair
	var rev int64 // 0: the first transaction reads the newest revision
	// byBytes is the keys that fit pageBytes at the size of the last
	// response's: kvs keys of bytes bytes.
	byBytes := c.pageKeys
	resize := func(kvs, bytes int) {
		if kvs > 0 {
			byBytes = max(c.pageBytes/max(bytes/kvs, 1), 1)
		}
	}
	// next is the limit of a range's next page, when rr left keys of it.
	next := func(rr rangeReply) int {
		rest := max(rr.count-int64(rr.kvs), 0)
		return min(max(int(min(rest/restShare, math.MaxInt32)), c.pageKeys), byBytes)
	}
	requests := 0
	after := func(counted int64) {
		if c.afterBatch != nil {
			c.afterBatch(attempt, requests, counted)
		}
		requests++
	}
	atRev := func(err error) error {
		if rev != 0 {
			return fmt.Errorf("at revision %d: %w", rev, err)
		}
		return err
	}
	for start := 0; start < len(reads) || requests == 0; start += maxTxnOps {
		part := reads[start:min(start+maxTxnOps, len(reads))]
		// One transaction answers at most about one page of keys: each
		// range gets an equal share, and a range that has more continues
		// in pages of its own below.
		share := int64(max(min(byBytes, c.pageKeys)/max(len(part), 1), 1))
		ops := make([]clientv3.Op, len(part))
		for i, r := range part {
			key, opts := r.from, []clientv3.OpOption{clientv3.WithRev(rev), clientv3.WithLimit(share)}
			if r.prefix {
				key, opts = prefixStart(r.from), append(opts, clientv3.WithRange(prefixEnd(r.from)))
			}
			ops[i] = clientv3.OpGet(key, opts...)
		}
		// An empty transaction still answers with the current revision.
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, 0, atRev(err)
		}
		if resp.Header.GetRevision() == 0 {
			return nil, 0, errNoRevision
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		if len(resp.Responses) != len(part) {
			return nil, 0, fmt.Errorf("etcd answered %d of %d reads", len(resp.Responses), len(part))
		}
		// Ranges that did not fit: their ends, with the reply each one had.
		type rest struct {
			end string
			rr  rangeReply
		}
		var more []rest
		var counted, left int64
		var kvs, bytes int
		// Replies come in the order of the ops of this batch; index
		// within the batch, never within all reads.
		for i, op := range resp.Responses {
			var rr rangeReply
			pairs, rr = appendRange(pairs, op.GetResponseRange())
			kvs += rr.kvs
			bytes += rr.bytes
			counted += rr.count
			if rr.more && rr.kvs > 0 {
				more = append(more, rest{prefixEnd(part[i].from), rr})
				left += rr.count - int64(rr.kvs)
			}
		}
		after(counted)
		resize(kvs, bytes)
		// The pages to come hold the rest of each range etcd counted
		// (left): the list grows once, not by doubling (with the copies
		// beside the pages at the peak of a large read). Bounded, as a
		// count is only what etcd says.
		pairs = slices.Grow(pairs, int(min(left, maxGrow)))
		for _, m := range more {
			for rr := m.rr; rr.more && rr.kvs > 0; {
				resp, err := c.cli.Get(ctx, rr.last+"\x00", clientv3.WithRange(m.end), clientv3.WithRev(rev), clientv3.WithLimit(int64(next(rr))))
				if err != nil {
					return nil, 0, atRev(err)
				}
				pairs, rr = appendRange(pairs, (*pb.RangeResponse)(resp))
				resize(rr.kvs, rr.bytes)
				after(rr.count)
			}
		}
	}
	return pairs, rev, nil
}

// prefixStart is the first key WithPrefix(from) reads: etcd refuses an
// empty key, so every key is "\x00" on, as in clientv3.
func prefixStart(from string) string {
	if from == "" {
		return "\x00"
	}
	return from
}

// prefixEnd is the end of the range WithPrefix(from) reads: every key
// from "from" on when from is empty, as in clientv3.
func prefixEnd(from string) string {
	if from == "" {
		return "\x00"
	}
	return clientv3.GetPrefixRangeEnd(from)
}

// Close releases the connection; later calls fail. It may be called more
// than once.
func (c *Client) Close() error {
	return c.close()
}

// describe names keys for an error message without flooding it.
func describe(keys []string) string {
	const show = 3
	switch {
	case len(keys) == 0:
		return "no keys"
	case len(keys) <= show:
		return fmt.Sprintf("keys %q", keys)
	default:
		return fmt.Sprintf("keys %q and %d more", keys[:show], len(keys)-show)
	}
}
