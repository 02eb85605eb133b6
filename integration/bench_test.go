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
func BenchmarkWatchPutToReload(b *testing.B) {
	s := etcdtest.Start(b)
	s.Put(b, "/bench/v", "start")
	c, ev := newConfdir(b), newEvents(b)
	c.reporting(ev, "bench", "/bench/v")
	log := startReporting(b, ev, "start", append(nodeArgs(b, s), "-watch", "-confdir", c.Dir)...)
	cli := s.Client(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		want := strconv.Itoa(i)
		if _, err := cli.Put(b.Context(), "/bench/v", want); err != nil {
			b.Fatal(err)
		}
		if got := ev.next(b, 20*time.Second, log); got != want {
			b.Fatalf("render %q, want %q", got, want)
		}
	}
}
