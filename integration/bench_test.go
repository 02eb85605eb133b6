package integration

import (
	"strconv"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// BenchmarkWatchPutToReload is the end-to-end latency an operator sees:
// a put in etcd until confd -watch has rendered, replaced the file and run
// reload_cmd (a write to a FIFO).
//
// back-to-back puts again as soon as the reload ran, before confd has set
// up its next watch; etcd then serves that watch from its unsynced-watcher
// loop, which runs every 100 ms. spaced leaves 50 ms (untimed) between a
// reload and the next put, as changes to keys usually arrive.
func BenchmarkWatchPutToReload(b *testing.B) {
	for _, tc := range []struct {
		name string
		gap  time.Duration
	}{{"back-to-back", 0}, {"spaced", 50 * time.Millisecond}} {
		b.Run(tc.name, func(b *testing.B) {
			s := etcdtest.Start(b)
			s.Put(b, "/bench/v", "start")
			c, ev := newConfdir(b), newEvents(b)
			c.reporting(ev, "bench", "/bench/v")
			log := startReporting(b, ev, "start", append(nodeArgs(b, s), "-watch", "-confdir", c.Dir)...)
			cli := s.Client(b)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if tc.gap > 0 {
					b.StopTimer()
					time.Sleep(tc.gap) // pacing, not synchronisation: the reload was already awaited
					b.StartTimer()
				}
				want := strconv.Itoa(i)
				if _, err := cli.Put(b.Context(), "/bench/v", want); err != nil {
					b.Fatal(err)
				}
				if got := ev.next(b, 20*time.Second, log); got != want {
					b.Fatalf("render %q, want %q", got, want)
				}
			}
		})
	}
}
