package apply

import (
	"path"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/resource"
	kvstore "github.com/keysync/confd/store"
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

// TestTemplateKeyCopiesNoCleanKey: under confd's default prefix "/" (and
// any prefix ending in "/") a clean key's template key is the store key's
// own bytes, as it is under "/app".
func TestTemplateKeyCopiesNoCleanKey(t *testing.T) {
	for _, c := range []struct{ key, prefix string }{
		{"/app/name", "/"}, {"/app/name", "/app/"}, {"/app/name", "/app"}, {"/", "/"},
	} {
		var got string
		if n := testing.AllocsPerRun(100, func() { got = templateKey(c.key, c.prefix) }); n != 0 {
			t.Errorf("templateKey(%q, %q) allocates %v times", c.key, c.prefix, n)
		}
		if unsafe.StringData(got) != unsafe.StringData(c.key[len(c.key)-len(got):]) {
			t.Errorf("templateKey(%q, %q) = %q is a copy", c.key, c.prefix, got)
		}
	}
}

// TestIndexKeepsOneValuePerTemplateKey: store keys that become one template
// key ("/p/a" and "/p/a/") leave one pair, the same one whatever order the
// map gives them in.
func TestIndexKeepsOneValuePerTemplateKey(t *testing.T) {
	r := &File{Resource: &resource.Resource{Prefix: "/p"}}
	kvs := map[string]string{"/p/a": "2", "/p/a/": "1", "/p//a": "3", "/p/b": "x"}
	for i := 0; i < 50; i++ {
		ix := r.index(kvstore.PairsOf(kvs))
		if indexLen(ix) != 2 {
			t.Fatalf("index holds %d keys, want 2 (/a, /b)", indexLen(ix))
		}
		if v, err := ix.GetValue("/a"); err != nil || v != "3" {
			t.Fatalf("/a = %q, %v; want the greatest value, 3, every time", v, err)
		}
	}
}

// TestIndexPairsAsIndexOfMap: a snapshot given as a list (sorted or not,
// with a store key repeated, as GetPairs may give it) indexes as the same
// snapshot given as a map.
func TestIndexPairsAsIndexOfMap(t *testing.T) {
	r := &File{Resource: &resource.Resource{Prefix: "/p"}}
	kvs := map[string]string{"/p/a": "1", "/p/b/c": "2", "/p//d": "3", "/p/b/": "4", "/p/e/./f": "5"}
	want, err := r.index(kvstore.PairsOf(kvs)).GetAll("/*")
	if err != nil {
		t.Fatal(err)
	}
	wantDeep, _ := r.index(kvstore.PairsOf(kvs)).GetAll("/*/*")
	lists := [][]memkv.KVPair{
		{{Key: "/p//d", Value: "3"}, {Key: "/p/a", Value: "1"}, {Key: "/p/b/", Value: "4"}, {Key: "/p/b/c", Value: "2"}, {Key: "/p/e/./f", Value: "5"}},
		{{Key: "/p/e/./f", Value: "5"}, {Key: "/p/b/c", Value: "2"}, {Key: "/p/a", Value: "1"}, {Key: "/p//d", Value: "3"}, {Key: "/p/b/", Value: "4"}, {Key: "/p/a", Value: "1"}},
	}
	for i, pairs := range lists {
		ix := r.index(pairs)
		got, _ := ix.GetAll("/*")
		gotDeep, _ := ix.GetAll("/*/*")
		if !slices.Equal(got, want) || !slices.Equal(gotDeep, wantDeep) {
			t.Errorf("list %d: /* = %v, /*/* = %v; want %v, %v", i, got, gotDeep, want, wantDeep)
		}
		if indexLen(ix) != len(want)+len(wantDeep) {
			t.Errorf("list %d: %d keys, want %d", i, indexLen(ix), len(want)+len(wantDeep))
		}
	}
}

// indexLen is the number of keys ix holds.
func indexLen(ix *kvstore.Index) (n int) {
	ix.Pairs(func(string, string) { n++ })
	return n
}
