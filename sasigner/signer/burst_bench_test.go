package signer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
)

// BenchmarkPublishBurst: every host of a fleet publishes its key at once
// (64 concurrent writers) to a real etcd that the signer follows. The
// signer has converged when it serves every key (served-s) and its cache
// file holds them (cached-s, after the writer's quiet period of 1 s). It
// reports this process's CPU seconds (the signer's follower, log and
// cache, and the writers' etcd client; etcd is another process), the
// bytes logged and the cache writes.
//
// hosts=5000 is the signer as it handles changes (ChangeWriter);
// per-change/hosts=1000 is the handler it replaced, for comparison: each
// change logged every key ID and rewrote the whole cache.
//
//	go test -run '^$' -bench PublishBurst -benchtime 1x ./sasigner/signer/
func BenchmarkPublishBurst(b *testing.B) {
	b.Run("hosts=5000", func(b *testing.B) { publishBurst(b, 5000, false) })
	b.Run("per-change/hosts=1000", func(b *testing.B) { publishBurst(b, 1000, true) })
}

type countWriter struct{ n atomic.Int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

func publishBurst(b *testing.B, hosts int, perChange bool) {
	e := etcdtest.Start(b)
	cli := e.Client(b)
	pems := make([]string, hosts)
	for i := range pems {
		pems[i] = string(keytest.PublicPEM(b, &keytest.EC(b).PublicKey))
	}
	logged := &countWriter{}
	log := logrus.New()
	log.SetFormatter(&logrus.JSONFormatter{})
	log.SetOutput(logged)
	ks := NewKeySet(nil, mustSigningKey(b, keytest.EC(b)))
	path := filepath.Join(b.TempDir(), "keys.json")
	var writes atomic.Int64
	served := make(chan struct{}, 1)
	want := atomic.Int64{}
	notify := func(n int) {
		if int64(n) == want.Load() {
			select {
			case served <- struct{}{}:
			default:
			}
		}
	}
	if perChange {
		ks.OnDiff = func(Change) {
			s := ks.Snapshot()
			log.WithField("kids", s.IDs()).WithField("signing", s.Signing).Info("key set changed")
			if err := ks.Cache().Write(path); err != nil {
				b.Error(err)
			}
			writes.Add(1)
			notify(len(s.Keys))
		}
	} else {
		w := &ChangeWriter{Keys: ks, CacheFile: path, Quiet: time.Second, Log: log, Metrics: NewMetrics()}
		ks.OnDiff = func(c Change) {
			w.Changed(c)
			notify(c.Keys)
		}
	}
	f := &Follower{
		Connect: connectOnce(b, e.Endpoint),
		Prefix:  "/keys/", Keys: ks, Log: log, RequestTimeout: 10 * time.Second, Probe: time.Minute, Metrics: NewMetrics(),
	}
	ctx, cancel := context.WithCancel(context.Background())
	synced, done := make(chan struct{}), make(chan struct{})
	go func() { f.Run(ctx, func() { close(synced) }); close(done) }()
	defer func() { cancel(); <-done }()
	<-synced

	var servedS, cachedS, cpuS float64
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if _, err := cli.Delete(ctx, "/keys/", clientv3.WithPrefix()); err != nil {
			b.Fatal(err)
		}
		for len(ks.Snapshot().Keys) != 1 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond) // the previous round's cache write
		before, _ := os.Stat(path)
		want.Store(int64(hosts + 1))
		logged.n.Store(0)
		writes.Store(0)
		cpu0 := cpuTime()
		b.StartTimer()

		start := time.Now()
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range 64 {
			wg.Go(func() {
				for j := int(next.Add(1)) - 1; j < hosts; j = int(next.Add(1)) - 1 {
					if _, err := cli.Put(ctx, fmt.Sprintf("/keys/r%d-h%d", i, j), pems[j]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		select {
		case <-served:
		case <-time.After(5 * time.Minute):
			b.Fatalf("not converged: serving %d keys", len(ks.Snapshot().Keys))
		}
		servedS += time.Since(start).Seconds()
		for {
			if fi, err := os.Stat(path); err == nil && (before == nil || !os.SameFile(fi, before)) {
				if c, err := ReadCache(path); err == nil && len(c.IDs) == hosts+1 {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		cachedS += time.Since(start).Seconds()
		cpuS += cpuTime() - cpu0
	}
	n := float64(b.N)
	b.ReportMetric(servedS/n, "served-s")
	b.ReportMetric(cachedS/n, "cached-s")
	b.ReportMetric(cpuS/n, "cpu-s")
	b.ReportMetric(float64(logged.n.Load())/(1<<20), "log-MiB")
	if perChange {
		b.ReportMetric(float64(writes.Load()), "cache-writes")
	}
}

// cpuTime is this process's user and system CPU seconds.
func cpuTime() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
