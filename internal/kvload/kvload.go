// Package kvload writes generated data sets into etcd quickly: puts go in
// transactions of etcd's default maximum size, several in flight, so that
// 100k keys load in seconds rather than in 100k round trips.
package kvload

import (
	"context"
	"errors"
	"fmt"

	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TxnOps is etcd's default --max-txn-ops: a larger transaction is refused.
const TxnOps = 128

// inFlight is how many transactions are sent at once: enough to keep the
// server busy while the client builds the next one.
const inFlight = 4

// KV returns the i-th key and value of a data set.
type KV func(i int) (key, value string)

// Load puts n generated pairs and returns the revision of the last
// transaction that committed.
func Load(ctx context.Context, kv clientv3.KV, n int, gen KV) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	slots := make(chan struct{}, inFlight)
	revs := make([]int64, (n+TxnOps-1)/TxnOps)
	errs := make([]error, len(revs))
	for b := range revs {
		if ctx.Err() != nil {
			break
		}
		start := b * TxnOps
		ops := make([]clientv3.Op, 0, min(TxnOps, n-start))
		for i := start; i < min(start+TxnOps, n); i++ {
			k, v := gen(i)
			ops = append(ops, clientv3.OpPut(k, v))
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			resp, err := kv.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				errs[b] = fmt.Errorf("load keys %d-%d of %d: %w", start, start+len(ops)-1, n, err)
				cancel() // the first failure stops the rest
				return
			}
			revs[b] = resp.Header.Revision
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var last int64
	for _, r := range revs {
		last = max(last, r)
	}
	return last, nil
}
