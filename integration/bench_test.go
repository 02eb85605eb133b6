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
	c := newConfdir(b)
	ev := newEvents(b)
	c.resource("bench", "[template]\nsrc = \"bench.tmpl\"\ndest = \"DEST\"\nkeys = [\"/bench/v\"]\nreload_cmd = \"cat {{.dest}} > "+ev.path+"\"\n", "{{getv \"/bench/v\"}}\n")
	log := startConfd(b, append(nodeArgs(b, s), "-watch", "-confdir", c.Dir)...)
	if got := ev.next(b, 20*time.Second, log); got != "start" {
		b.Fatalf("first render %q", got)
	}
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
