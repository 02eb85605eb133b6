package apply

import (
	"context"
	"strconv"
	"testing"
)

// BenchmarkProcess measures one pass over a resource: in sync (render and
// compare, nothing written) and changed (stage, fsync, rename, directory
// fsync), without commands.
func BenchmarkProcess(b *testing.B) {
	for _, changed := range []bool{false, true} {
		b.Run("changed="+strconv.FormatBool(changed), func(b *testing.B) {
			f := newFixture(b, "")
			r := f.load()
			ctx := context.Background()
			if _, err := r.Process(ctx, f.store); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if changed {
					f.store.kvs["/app/name"] = strconv.Itoa(i)
				}
				res, err := r.Process(ctx, f.store)
				if err != nil || res.Changed != changed {
					b.Fatalf("pass %d: %+v, %v", i, res, err)
				}
			}
		})
	}
}
