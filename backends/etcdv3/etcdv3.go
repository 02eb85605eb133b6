// Package etcdv3 reads and watches keys in etcd through the v3 API: every
// read is a snapshot at one revision, and watches resume from a revision so
// that no change between a read and the watch is missed.
package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/backends/internal/keypath"
	"github.com/keysync/confd/internal/etcdclient"
)

// ErrCompacted is wrapped by WatchPrefix when etcd no longer has the
// revisions after afterRev: changes may have been missed, so the caller
// must read everything again and watch from the new revision.
var ErrCompacted = errors.New("etcd revision compacted")

// maxTxnOps is etcd's default --max-txn-ops; a larger transaction is refused.
const maxTxnOps = 128

// readAttempts bounds how often GetValues starts over when the revision it
// reads at is compacted between two of its transactions.
const readAttempts = 3

// Client is a connected etcd v3 client.
type Client struct {
	cli            *clientv3.Client
	endpoints      []string
	requestTimeout time.Duration
	closeOnce      sync.Once
	closeErr       error

	// afterBatch, when set by tests, runs between the transactions of one
	// GetValues, to provoke what can happen there.
	afterBatch func(attempt, batch int)
}

// Config is how to reach etcd; see etcdclient.Config.
type Config = etcdclient.Config

// Defaults for zero durations, and the node confd used when none was given.
const (
	DefaultDialTimeout    = etcdclient.DefaultDialTimeout
	DefaultRequestTimeout = etcdclient.DefaultRequestTimeout
	DefaultNode           = etcdclient.DefaultNode
)

// New connects to etcd through etcdclient.New, which proves the connection
// and names the cause when it fails.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	cli, err := etcdclient.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Client{cli: cli, endpoints: cli.Endpoints(), requestTimeout: cfg.RequestTimeout}, nil
}

func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// GetValues returns every key equal to or below (as a path) one of keys,
// all read at one revision, and that revision. Keys are read in
// transactions of at most maxTxnOps gets; the first fixes the revision and
// the others read at it.
func (c *Client) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	reads := planReads(keys)
	var err error
	for attempt := 1; attempt <= readAttempts; attempt++ {
		var vals map[string]string
		var rev int64
		vals, rev, err = c.readAt(ctx, reads, attempt)
		if err == nil {
			return vals, rev, nil
		}
		// Only a compaction between our own transactions is worth a fresh
		// start; the first transaction reads the newest revision.
		if !errors.Is(err, rpctypes.ErrCompacted) || ctx.Err() != nil {
			break
		}
	}
	return nil, 0, fmt.Errorf("etcd %s: read %s: %w", strings.Join(c.endpoints, ", "), describe(keys), err)
}

// read is one range request and the requested key it serves, whose path
// rule filters what the range returns.
type read struct {
	key    string // the requested key
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
			reads = append(reads, read{key: k, from: k, prefix: true})
			continue
		}
		reads = append(reads, read{key: k, from: k}, read{key: k, from: k + "/", prefix: true})
	}
	return reads
}

func (c *Client) readAt(ctx context.Context, reads []read, attempt int) (map[string]string, int64, error) {
	vals := make(map[string]string)
	var rev int64 // 0: the first transaction reads the newest revision
	for batch, start := 0, 0; start < len(reads) || batch == 0; batch, start = batch+1, start+maxTxnOps {
		part := reads[start:min(start+maxTxnOps, len(reads))]
		ops := make([]clientv3.Op, len(part))
		for i, r := range part {
			opts := []clientv3.OpOption{clientv3.WithRev(rev)}
			if r.prefix {
				opts = append(opts, clientv3.WithPrefix())
			}
			ops[i] = clientv3.OpGet(r.from, opts...)
		}
		// An empty transaction still answers with the current revision.
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			if rev != 0 {
				return nil, 0, fmt.Errorf("at revision %d: %w", rev, err)
			}
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		if len(resp.Responses) != len(part) {
			return nil, 0, fmt.Errorf("transaction answered %d of %d reads", len(resp.Responses), len(part))
		}
		// Responses come in the order of the ops of this batch; index
		// within the batch, never within all reads.
		for i, r := range resp.Responses {
			rr := r.GetResponseRange()
			if rr == nil {
				return nil, 0, fmt.Errorf("transaction answered read %q with no range", part[i].from)
			}
			for _, kv := range rr.Kvs {
				if k := string(kv.Key); keypath.Under(k, part[i].key) {
					vals[k] = string(kv.Value)
				}
			}
		}
		if c.afterBatch != nil {
			c.afterBatch(attempt, batch)
		}
	}
	return vals, rev, nil
}

// WatchPrefix watches prefix from afterRev+1 (from now when afterRev is 0)
// and returns the revision of the first change to a key equal to or below
// one of keys (any key, when keys is empty). It wraps ErrCompacted when
// etcd has compacted revisions after afterRev, and returns ctx.Err() when
// ctx ends.
func (c *Client) WatchPrefix(ctx context.Context, prefix string, keys []string, afterRev int64) (int64, error) {
	// RequireLeader: a member cut off from its cluster ends the watch with
	// an error instead of keeping it open and silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel() // ends the server-side watch as well
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if afterRev > 0 {
		opts = append(opts, clientv3.WithRev(afterRev+1))
	}
	where := func() string {
		return fmt.Sprintf("etcd %s: watch %q after revision %d", strings.Join(c.endpoints, ", "), prefix, afterRev)
	}
	for resp := range c.cli.Watch(wctx, prefix, opts...) {
		if resp.CompactRevision != 0 {
			return 0, fmt.Errorf("%s: %w (oldest revision kept is %d): %w", where(), ErrCompacted, resp.CompactRevision, resp.Err())
		}
		if err := resp.Err(); err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("%s: %w", where(), err)
		}
		for _, ev := range resp.Events {
			if k := string(ev.Kv.Key); len(keys) == 0 || keypath.UnderAny(k, keys) {
				return ev.Kv.ModRevision, nil
			}
		}
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return 0, fmt.Errorf("%s: watch closed (client closed or connection lost)", where())
}

// Close releases the connection; later calls fail. It may be called more
// than once.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.cli.Close() })
	return c.closeErr
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
