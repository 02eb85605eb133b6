package etcdv3

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keysync/confd/backends"
)

// watchKeysPairwise is watchKeys by its definition: every pair compared.
func watchKeysPairwise(keys []string) []string {
	var out []string
	for i, k := range keys {
		covered := false
		for j, o := range keys {
			if (j < i && k == o) || (k != o && backends.KeyUnder(k, o)) {
				covered = true
			}
		}
		if !covered {
			out = append(out, k)
		}
	}
	return out
}

// TestWatchKeysIsThePairwiseCover draws keys that are string prefixes of
// one another without being paths below them, nest, repeat, end in "/",
// hold "//", and include "" and "/".
func TestWatchKeysIsThePairwiseCover(t *testing.T) {
	pool := []string{"", "/", "//", "/a", "/a/", "/a//", "/a//b", "/a/b", "/a/b/", "/a/b/c", "/a-b", "/ab", "/ab/c", "/b", "/b/a", "a", "a/b", "/a/bc"}
	rnd := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 5000; round++ {
		keys := make([]string, 1+rnd.IntN(6))
		for i := range keys {
			keys[i] = pool[rnd.IntN(len(pool))]
			if round%3 != 0 && (keys[i] == "" || keys[i] == "/") {
				keys[i] = "/z" // most rounds without a key that covers all
			}
		}
		if got, want := watchKeys(keys), watchKeysPairwise(keys); !slices.Equal(got, want) {
			t.Fatalf("watchKeys(%q) = %q, want %q", keys, got, want)
		}
	}
}

// BenchmarkWatchKeys: target 4's shape, 1,000 resources on as many prefixes.
func BenchmarkWatchKeys(b *testing.B) {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("/idle/p%04d/v", i)
	}
	b.ReportAllocs()
	for b.Loop() {
		if n := len(watchKeys(keys)); n != len(keys) {
			b.Fatal(n)
		}
	}
}

// TestPlanRanges: up to the limit each key is a range of its own; beyond
// it keys share the deepest directory that brings the ranges under the
// limit, never "/"; a merged range routes each key to the requested key it
// is below and drops the others.
func TestPlanRanges(t *testing.T) {
	type plan struct {
		key  string
		keys int
	}
	summary := func(rs []watchRange) []plan {
		var out []plan
		for _, r := range rs {
			out = append(out, plan{r.key, len(r.keys)})
		}
		return out
	}
	keys := []string{"/app/b/y", "/app/a/x/", "/app/a/deep/er/z"}
	for i := 0; i < 10; i++ {
		keys = append(keys, fmt.Sprintf("/app/a/x%d", i))
	}
	if got := summary(planRanges(keys, len(keys))); len(got) != len(keys) {
		t.Errorf("at the limit: %v", got)
	}
	// "/app/a/deep/er/" merges into "/app/a/deep/" first (deepest), then
	// the keys of "/app/a/" and "/app/b/" into theirs: 2 ranges.
	rs := planRanges(keys, 3)
	if got, want := summary(rs), []plan{{"/app/b/y", 1}, {"/app/a/", 12}}; !slices.Equal(got, want) {
		t.Fatalf("planRanges(limit 3) = %v, want %v", got, want)
	}
	if rs[1].end != "/app/a0" || !rs[1].whole || !rs[0].whole || rs[0].end != "/app/b/y0" {
		t.Errorf("ranges %+v", rs)
	}
	for k, want := range map[string]string{
		"/app/a/x1": "/app/a/x1", "/app/a/x1/sub": "/app/a/x1", "/app/a/x/q": "/app/a/x/",
		"/app/a/deep/er/z/1": "/app/a/deep/er/z", "/app/a/x10": "", "/app/a/other": "", "/app/a/x": "",
	} {
		if got, ok := rs[1].keyOf(k); got != want || ok != (want != "") {
			t.Errorf("keyOf(%q) = %q, %v; want %q", k, got, ok, want)
		}
	}
	// Top-level directories are never merged into "/".
	if got := summary(planRanges([]string{"/a/1", "/b/1", "/c/1"}, 1)); len(got) != 3 {
		t.Errorf("top-level keys merged: %v", got)
	}
	// Refused, a directory splits into its keys, a key into its halves.
	more, ok := rs[1].split()
	if !ok || len(more) != 12 {
		t.Fatalf("split of a directory: %v, %v", more, ok)
	}
	halves, ok := rs[0].split()
	if !ok || len(halves) != 2 || halves[0].whole || halves[1].key != "/app/b/y/" {
		t.Errorf("split of a key: %+v, %v", halves, ok)
	}
	if _, ok := halves[1].split(); ok {
		t.Error("a half splits")
	}
}
