package etcdv3

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keysync/confd/backends/internal/keypath"
)

// watchKeysPairwise is watchKeys by its definition: every pair compared.
func watchKeysPairwise(keys []string) []string {
	var out []string
	for i, k := range keys {
		covered := false
		for j, o := range keys {
			if (j < i && k == o) || (k != o && keypath.Under(k, o)) {
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

// TestHeadersPerRange: answers of two ranges meet in any order, so range
// 0's creation at revision 3 may come after range 1's event at 4; that is
// no restore. A range going back on itself, or below afterRev, is.
func TestHeadersPerRange(t *testing.T) {
	h := headers{2, 2}
	for _, step := range []struct {
		from int
		rev  int64
	}{{1, 3}, {1, 4}, {0, 3}, {0, 0}, {0, 5}, {1, 4}} {
		if err := h.check(step.from, step.rev); err != nil {
			t.Fatalf("range %d at %d: %v", step.from, step.rev, err)
		}
	}
	var behind *RevisionBehindError
	if err := h.check(0, 4); !errors.As(err, &behind) || behind.Current != 4 || behind.Seen != 5 {
		t.Errorf("range 0 back from 5 to 4: err = %v", err)
	}
	if err := (headers{7, 7}).check(1, 6); !errors.As(err, &behind) || behind.Seen != 7 {
		t.Errorf("creation below afterRev: err = %v", err)
	}
}
