package resource

import (
	"path"
	"strings"
	"testing"
)

// TestTemplateKeyIsConfdsJoin pins templateKey to what confd computes,
// path.Join("/", strings.TrimPrefix(key, prefix)), on keys that are and are
// not already clean.
func TestTemplateKeyIsConfdsJoin(t *testing.T) {
	keys := []string{
		"/app/name", "/app", "/app/", "/app//x", "/app/a/../b", "/app/./c", "/app/d/",
		"/apple", "app/x", "", "/", "//app/x", "/app/a b/ü", "/app/..", "/app/.hidden",
	}
	for _, prefix := range []string{"/app", "/app/", "", "/"} {
		for _, k := range keys {
			want := path.Join("/", strings.TrimPrefix(k, prefix))
			if got := templateKey(k, prefix); got != want {
				t.Errorf("templateKey(%q, %q) = %q, want %q", k, prefix, got, want)
			}
		}
	}
}

// TestIndexKeepsOneValuePerTemplateKey: store keys that become one template
// key ("/p/a" and "/p/a/") leave one pair, the same one whatever order the
// map gives them in.
func TestIndexKeepsOneValuePerTemplateKey(t *testing.T) {
	r := &Resource{Prefix: "/p"}
	kvs := map[string]string{"/p/a": "2", "/p/a/": "1", "/p//a": "3", "/p/b": "x"}
	for i := 0; i < 50; i++ {
		ix := r.index(kvs)
		if ix.Len() != 2 {
			t.Fatalf("index holds %d keys, want 2 (/a, /b)", ix.Len())
		}
		if v, err := ix.GetValue("/a"); err != nil || v != "3" {
			t.Fatalf("/a = %q, %v; want the greatest value, 3, every time", v, err)
		}
	}
}
