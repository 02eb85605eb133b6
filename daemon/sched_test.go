package daemon

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
)

// destProc is a fakeProc that names its destination.
type destProc struct {
	fakeProc
	dest string
}

func (p *destProc) Destination() string { return p.dest }

// pairwiseGroups is the grouping by its definition: every pair compared,
// then the connected components of what joins. unite must give the same
// partition without comparing every pair.
func pairwiseGroups(keys [][]string, dests []string) [][]int {
	n := len(keys)
	joins := func(i, j int) bool {
		if dests[i] != "" && dests[i] == dests[j] {
			return true
		}
		for _, x := range keys[i] {
			for _, y := range keys[j] {
				if backends.KeyUnder(x, y) || backends.KeyUnder(y, x) {
					return true
				}
			}
		}
		return false
	}
	component := make([]int, n)
	for i := range component {
		component[i] = -1
	}
	for i := 0; i < n; i++ {
		if component[i] >= 0 {
			continue
		}
		component[i] = i // the lowest index names the component, as unite does
		for todo := []int{i}; len(todo) > 0; {
			a := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			for b := 0; b < n; b++ {
				if component[b] < 0 && joins(a, b) {
					component[b] = i
					todo = append(todo, b)
				}
			}
		}
	}
	return partition(n, func(i int) int { return component[i] })
}

func partition(n int, root func(int) int) [][]int {
	byRoot := map[int][]int{}
	var order []int
	for i := 0; i < n; i++ {
		r := root(i)
		if _, ok := byRoot[r]; !ok {
			order = append(order, r)
		}
		byRoot[r] = append(byRoot[r], i)
	}
	out := make([][]int, len(order))
	for i, r := range order {
		out[i] = byRoot[r]
	}
	return out
}

// TestUniteIsThePairwiseGrouping draws resources whose keys are string
// prefixes of one another without being paths below them ("/a", "/a-b",
// "/ab", "/a/"), nest, repeat, and include "" and "/", and checks the
// grouping against every pair compared.
func TestUniteIsThePairwiseGrouping(t *testing.T) {
	pool := []string{"", "/", "/a", "/a/", "/a/b", "/a/b/c", "/a-b", "/a.b", "/ab", "/ab/c", "/b", "/b/a", "/ba", "/c/", "/c/d", "/a/bc", "/a/b-c"}
	dpool := []string{"", "", "/etc/x", "/etc/y", "/etc/z"}
	rnd := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2000; round++ {
		n := 1 + rnd.IntN(8)
		keys := make([][]string, n)
		dests := make([]string, n)
		for i := range keys {
			for range 1 + rnd.IntN(3) {
				k := pool[rnd.IntN(len(pool))]
				if round%2 == 0 && (k == "" || k == "/") {
					k = "/z" // most rounds without keys covering all
				}
				keys[i] = append(keys[i], k)
			}
			dests[i] = dpool[rnd.IntN(len(dpool))]
		}
		root := unite(keys, dests)
		got := partition(n, func(i int) int { return root[i] })
		if want := pairwiseGroups(keys, dests); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("round %d: keys %q dests %q: groups %v, want %v", round, keys, dests, got, want)
		}
	}
}

// TestSameDestinationJoinsGroups: two resources writing one file are one
// group even when their keys are apart.
func TestSameDestinationJoinsGroups(t *testing.T) {
	s := newSched([]Processor{
		&destProc{fakeProc{name: "a.toml", keys: []string{"/a"}}, "/etc/out"},
		&destProc{fakeProc{name: "b.toml", keys: []string{"/b"}}, "/etc/other"},
		&destProc{fakeProc{name: "c.toml", keys: []string{"/c"}}, "/etc/out"},
	}, waitspec.Spec{})
	want := [][]string{{"a.toml", "c.toml"}, {"b.toml"}}
	if got := groupNames(s.groups); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("groups = %v, want %v", got, want)
	}
}

// BenchmarkNewSched: the grouping at start-up and on SIGHUP, with target
// 4's shape (1,000 resources on as many prefixes, one directory).
func BenchmarkNewSched(b *testing.B) {
	procs := make([]Processor, 1000)
	for i := range procs {
		procs[i] = &destProc{fakeProc{name: fmt.Sprintf("r%04d.toml", i), keys: []string{fmt.Sprintf("/idle/p%04d/v", i)}}, fmt.Sprintf("/out/r%04d", i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if s := newSched(procs, waitspec.Spec{}); len(s.groups) != len(procs) {
			b.Fatalf("%d groups", len(s.groups))
		}
	}
}

// BenchmarkNewSchedOneKey: a thousand resources on one key (one group).
func BenchmarkNewSchedOneKey(b *testing.B) {
	procs := make([]Processor, 1000)
	for i := range procs {
		procs[i] = &destProc{fakeProc{name: fmt.Sprintf("r%04d.toml", i), keys: []string{"/k"}}, fmt.Sprintf("/out/r%04d", i)}
	}
	b.ReportAllocs()
	for b.Loop() {
		if s := newSched(procs, waitspec.Spec{}); len(s.groups) != 1 {
			b.Fatalf("%d groups", len(s.groups))
		}
	}
}
