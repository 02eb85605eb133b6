package store

import (
	"fmt"
	"testing"

	"github.com/kelseyhightower/memkv"
)

// dirKeys is target 2's shape: dirs directories of 100 keys.
func dirKeys(dirs int) map[string]string {
	kvs := make(map[string]string, dirs*100)
	for d := 0; d < dirs; d++ {
		for k := 0; k < 100; k++ {
			kvs[fmt.Sprintf("/svc/d%05d/k%03d", d, k)] = "10.0.0.1:443"
		}
	}
	return kvs
}

// BenchmarkIndex measures the template lookups (allocations included) on
// the index and, where it finishes in reasonable time, on memkv: the
// directory loop (lsdir, then gets per directory) is linear on the index
// and quadratic on memkv.
func BenchmarkIndex(b *testing.B) {
	for _, dirs := range []int{10, 100, 1000} {
		kvs := dirKeys(dirs)
		b.Run(fmt.Sprintf("new/keys=%d", len(kvs)), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				New(kvs)
			}
		})
		ix := New(kvs)
		ix.dirs()
		b.Run(fmt.Sprintf("gets-all/keys=%d", len(kvs)), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if ks, _ := ix.GetAll("/svc/*/*"); len(ks) != len(kvs) {
					b.Fatal(len(ks))
				}
			}
		})
		b.Run(fmt.Sprintf("get/keys=%d", len(kvs)), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := ix.Get("/svc/d00001/k042"); err != nil {
					b.Fatal(err)
				}
			}
		})
		loop := func(b *testing.B, lsdir func(string) []string, gets func(string) (memkv.KVPairs, error)) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				n := 0
				for _, d := range lsdir("/svc") {
					ks, _ := gets("/svc/" + d + "/*")
					n += len(ks)
				}
				if n != len(kvs) {
					b.Fatal(n)
				}
			}
		}
		b.Run(fmt.Sprintf("lsdir+gets/index/keys=%d", len(kvs)), func(b *testing.B) {
			loop(b, ix.ListDir, ix.GetAll)
		})
		if dirs <= 100 {
			ref := memkv.New()
			for k, v := range kvs {
				ref.Set(k, v)
			}
			b.Run(fmt.Sprintf("lsdir+gets/memkv/keys=%d", len(kvs)), func(b *testing.B) {
				loop(b, ref.ListDir, ref.GetAll)
			})
		}
	}
}

// BenchmarkDirs measures building the directory index that ls and lsdir
// use, at 100k keys in 1000 directories (target 2's shape).
func BenchmarkDirs(b *testing.B) {
	kvs := dirKeys(1000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ix := New(kvs)
		b.StartTimer()
		if len(ix.dirs()) != len(kvs) {
			b.Fatal("dirs")
		}
	}
}
