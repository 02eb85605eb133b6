// Package daemon drives resources: once, on an interval, or on every etcd
// change of their keys. It decides when to process, never how.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keysync/confd/resource"
	"github.com/sirupsen/logrus"
)

// Processor is one resource as the loop sees it.
type Processor interface {
	Process(ctx context.Context, store resource.Getter) (resource.Result, error)
	StoreKeys() []string
}

// Watcher is a store that can wait for changes.
type Watcher interface {
	resource.Getter
	WatchPrefix(ctx context.Context, prefix string, keys []string, afterRev int64) (int64, error)
}

// Once processes every resource in order and returns every failure joined,
// one error per failed resource.
func Once(ctx context.Context, rs []Processor, store resource.Getter, log logrus.FieldLogger) error {
	var errs []error
	for _, r := range rs {
		if _, err := r.Process(ctx, store); err != nil {
			log.Error(err.Error())
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Interval processes every resource, then again every interval, until ctx
// ends. load is called before every pass, so that resource files added or
// changed since the last pass are picked up, as confd 0.16's interval mode
// did. A pass in progress finishes (its commands have their own timeouts):
// killing a reload half way is worse than a late exit.
func Interval(ctx context.Context, load func() []Processor, store resource.Getter, every time.Duration, log logrus.FieldLogger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		_ = Once(context.WithoutCancel(ctx), load(), store, log)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Watch processes every resource once, then waits on etcd for changes to
// each resource's keys and processes it again. The watch resumes from the
// revision the last successful pass rendered, so no change is missed and a
// burst of changes is rendered once at its newest revision.
func Watch(ctx context.Context, rs []Processor, store Watcher, log logrus.FieldLogger) {
	done := make(chan struct{})
	for _, r := range rs {
		go func(r Processor) {
			defer func() { done <- struct{}{} }()
			watchOne(ctx, r, store, log, minBackoff)
		}(r)
	}
	for range rs {
		<-done
	}
}

const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 30 * time.Second
)

func watchOne(ctx context.Context, r Processor, store Watcher, log logrus.FieldLogger, firstBackoff time.Duration) {
	backoff := firstBackoff
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
		return true
	}
	var rev int64
	// processed reports whether a pass succeeded; until one does, retry
	// with backoff rather than watch from a revision never rendered.
	process := func() bool {
		res, err := r.Process(context.WithoutCancel(ctx), store)
		if err != nil {
			log.Error(err.Error())
			return false
		}
		rev, backoff = res.Revision, firstBackoff
		return true
	}
	for !process() {
		if !wait() {
			return
		}
	}
	for ctx.Err() == nil {
		_, err := store.WatchPrefix(ctx, commonPrefix(r.StoreKeys()), r.StoreKeys(), rev)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Warn(fmt.Sprintf("watch %v from revision %d: %v; re-reading", r.StoreKeys(), rev, err))
			if !wait() {
				return
			}
		}
		for !process() {
			if !wait() {
				return
			}
		}
	}
}

// commonPrefix is the longest string all keys start with: the narrowest
// etcd range one watch can cover.
func commonPrefix(keys []string) string {
	if len(keys) == 0 {
		return "/"
	}
	p := keys[0]
	for _, k := range keys[1:] {
		for !strings.HasPrefix(k, p) {
			p = p[:len(p)-1]
		}
	}
	if p == "" {
		return "/"
	}
	return p
}
