package etcdv3

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/kvload"
)

// BenchmarkGetValues reads a resource's keys at one revision from a real
// etcd on loopback: n requested keys, each a directory of 4 values, so the
// read spans several 128-operation transactions.
func BenchmarkGetValues(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			s := etcdtest.Start(b)
			cli := s.Client(b)
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("/bench/k%05d", i)
			}
			ctx := context.Background()
			for start := 0; start < n; start += 32 {
				var ops []clientv3.Op
				for _, k := range keys[start:min(start+32, n)] {
					for j := 0; j < 4; j++ {
						ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/v%d", k, j), "value"))
					}
				}
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					b.Fatal(err)
				}
			}
			c, err := New(ctx, Config{Nodes: []string{s.Endpoint}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				vals, _, err := c.GetValues(ctx, keys)
				if err != nil || len(vals) != 4*n {
					b.Fatalf("got %d values, %v", len(vals), err)
				}
			}
		})
	}
}

// BenchmarkGetValuesPrefix reads target 1's shape: n keys under one
// prefix, which comes in pages at one revision; page=0 is the default
// pageKeys, the others show what the page size trades (each page makes etcd
// count the rest of the range; a bigger page is a bigger response held at
// once).
func BenchmarkGetValuesPrefix(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		for _, page := range []int{0, 1000, 20_000, 1 << 30} {
			if n < 100_000 && page != 0 {
				continue
			}
			benchPrefix(b, n, page)
		}
	}
}

func benchPrefix(b *testing.B, n, page int) {
	b.Run(fmt.Sprintf("keys=%d/page=%d", n, page), func(b *testing.B) {
		s := etcdtest.Start(b)
		ctx := context.Background()
		if _, err := kvload.Load(ctx, s.Client(b), n, func(i int) (string, string) {
			return fmt.Sprintf("/flat/k%07d", i), fmt.Sprintf("value-%08d-%049d", i, 0)
		}); err != nil {
			b.Fatal(err)
		}
		c, err := New(ctx, Config{Nodes: []string{s.Endpoint}})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.pageKeys = page
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			vals, _, err := c.GetValues(ctx, []string{"/flat"})
			if err != nil || len(vals) != n {
				b.Fatalf("got %d values, %v", len(vals), err)
			}
		}
	})
}
