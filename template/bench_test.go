package template

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkRenderGets renders a template that ranges once over n keys and
// once more per directory with gets, the shape of the kube-apiserver
// templates. The store's index keeps both linear in n (memkv's scan per
// gets made the second grow with n²).
func BenchmarkRenderGets(b *testing.B) {
	dir := b.TempDir()
	flat := filepath.Join(dir, "flat.tmpl")
	perDir := filepath.Join(dir, "perdir.tmpl")
	must(b, os.WriteFile(flat, []byte(`{{range gets "/sa/*"}}{{.Value}}{{end}}`), 0o644))
	must(b, os.WriteFile(perDir, []byte(`{{range lsdir "/svc"}}{{range gets (printf "/svc/%s/*" .)}}{{.Value}}{{end}}{{end}}`), 0o644))
	for _, n := range []int{100, 1000, 100_000} {
		kvs := make(map[string]string, 2*n)
		for i := 0; i < n; i++ {
			kvs[fmt.Sprintf("/sa/master-%04d", i)] = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
			kvs[fmt.Sprintf("/svc/s%04d/addr", i)] = "10.0.0.1"
		}
		for name, src := range map[string]string{"flat": flat, "perdir": perDir} {
			b.Run(fmt.Sprintf("%s/keys=%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				var r Renderer
				for i := 0; i < b.N; i++ {
					if _, err := r.Render(src, kvs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRenderSmall renders one key into a one-line template, the shape
// of a watch-mode pass: the cost beside the keys' is the template's.
func BenchmarkRenderSmall(b *testing.B) {
	src := filepath.Join(b.TempDir(), "small.tmpl")
	must(b, os.WriteFile(src, []byte(`{{getv "/key"}}`), 0o644))
	kvs := map[string]string{"/key": "value"}
	b.ReportAllocs()
	var r Renderer
	for i := 0; i < b.N; i++ {
		if _, err := r.Render(src, kvs); err != nil {
			b.Fatal(err)
		}
	}
}
