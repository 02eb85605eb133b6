package store

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kelseyhightower/memkv"
)

// The differential tests hold Index to memkv v0.1.1 itself: every function,
// every query, the same result (order, nil versus empty, error text and
// type). A change that makes Index faster but different fails here.

// segments are path pieces chosen to hit memkv's edge cases: empty segments
// (double and trailing slashes), dot segments that path.Clean rewrites,
// glob meta characters inside keys, and names that are prefixes of others.
var segments = []string{"", "a", "b", "ab", "a-b", "a.b", ".", "..", "*", "?", "[", "]", `\`, "[a]", "x y", "é", "0", "00"}

func randomKey(r *rand.Rand) string {
	n := 1 + r.Intn(4)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = segments[r.Intn(len(segments))]
	}
	k := strings.Join(parts, "/")
	switch r.Intn(10) {
	case 0: // relative key
	case 1:
		k = "/" + k + "/"
	default:
		k = "/" + k
	}
	return k
}

// queries returns paths to ask ls, lsdir and get about: every prefix of every
// key (so both "/a" and "/a/" and "/ab"), the root forms, and random paths.
func queries(r *rand.Rand, keys []string) []string {
	seen := map[string]bool{}
	var qs []string
	add := func(q string) {
		if !seen[q] {
			seen[q] = true
			qs = append(qs, q)
		}
	}
	for _, q := range []string{"", "/", ".", "..", "//", "/a", "/a/", "a", "/nonexistent", "/a/b/", "/./a", "/a/../b"} {
		add(q)
	}
	for _, k := range keys {
		for i := 0; i <= len(k); i++ {
			add(k[:i])
		}
	}
	for i := 0; i < 30; i++ {
		add(randomKey(r))
	}
	return qs
}

// patterns returns globs derived from keys (segments replaced by *, ?,
// classes, escapes) plus malformed ones.
func patterns(r *rand.Rand, keys []string) []string {
	ps := []string{"*", "/*", "/*/*", "/a*", "/a/*", "/?", "/[ab]", "/[^a]*", "/[a-b]/*", `/\*`, `/\[`, "/[", "/a/[", "[]", `\`, "/a]", "", "/", "/*/", "/a/**", "/[/]*"}
	repl := []string{"*", "?", "[ab]", "[^a]", "a*", "*b", `\a`, "[", "[!a]", "[a-]", "[]a]"}
	for _, k := range keys {
		ps = append(ps, k)
		parts := strings.Split(k, "/")
		i := r.Intn(len(parts))
		parts[i] = repl[r.Intn(len(repl))]
		ps = append(ps, strings.Join(parts, "/"))
	}
	return ps
}

func compare(t *testing.T, keys []string, r *rand.Rand) {
	t.Helper()
	ref := memkv.New()
	kvs := make(map[string]string, len(keys))
	for i, k := range keys {
		// Values out of key order, with duplicates, so getvs's own sort shows.
		v := fmt.Sprintf("v%d", (len(keys)-i)%7)
		ref.Set(k, v)
		kvs[k] = v
	}
	ix := New(kvs)
	fail := 0
	check := func(fn, arg string, got, want any) {
		if !reflect.DeepEqual(got, want) && fail < 10 {
			fail++
			t.Errorf("%s(%q) over keys %q:\n got %#v\nwant %#v", fn, arg, keys, got, want)
		}
	}
	for _, q := range queries(r, keys) {
		check("ls", q, ix.List(q), ref.List(q))
		check("lsdir", q, ix.ListDir(q), ref.ListDir(q))
		check("exists", q, ix.Exists(q), ref.Exists(q))
		gk, ge := ix.Get(q)
		wk, we := ref.Get(q)
		check("get", q, []any{gk, ge}, []any{wk, we})
		gv, ge := ix.GetValue(q)
		wv, we := ref.GetValue(q)
		check("getv", q, []any{gv, ge}, []any{wv, we})
		gv, ge = ix.GetValue(q, "default")
		wv, we = ref.GetValue(q, "default")
		check("getv+default", q, []any{gv, ge}, []any{wv, we})
	}
	for _, p := range patterns(r, keys) {
		gs, ge := ix.GetAll(p)
		ws, we := ref.GetAll(p)
		check("gets", p, []any{gs, ge}, []any{ws, we})
		gs, ge = ix.GetAllShared(p)
		check("gets (shared)", p, []any{gs, ge}, []any{ws, we})
		gvs, ge := ix.GetAllValues(p)
		wvs, we := ref.GetAllValues(p)
		check("getvs", p, []any{gvs, ge}, []any{wvs, we})
	}
}

func TestIndexMatchesMemkvRandom(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for round := 0; round < 300; round++ {
		n := r.Intn(25)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = randomKey(r)
		}
		compare(t, keys, r)
		if t.Failed() {
			return
		}
	}
}

func TestIndexMatchesMemkvAdversarial(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for _, keys := range [][]string{
		nil,
		{"/"},
		{""},
		{"/a"},
		{"/a", "/a/"},
		{"/a", "/a/b", "/a/b/c", "/ab", "/ab/c", "/a-b/c", "/a.b"},
		{"/foo", "/foobar", "/foo/bar", "/foo/bar/", "/foo//bar", "/foo/./bar", "/x/../foo/baz"},
		{"a", "a/b", "./a", "../a/b", "a//b"},
		{"/*", "/*/x", "/[", "/[a]", `/\`, "/?", "/a]"},
		{"//", "///a", "/a//", "/.", "/..", "/../a"},
		{"/app/db/user", "/app/db/pass", "/app/web/1/addr", "/app/web/2/addr", "/app/web/10/addr", "/app"},
	} {
		compare(t, keys, r)
	}
}

// TestIndexDirectoryLoop is the shape of target 2 (lsdir then gets per
// directory) at a size where a scan per call would still be fast enough
// to compare.
func TestIndexDirectoryLoop(t *testing.T) {
	ref := memkv.New()
	kvs := map[string]string{}
	for d := 0; d < 30; d++ {
		for k := 0; k < 12; k++ {
			key := fmt.Sprintf("/svc/d%d/k%d", d, k)
			ref.Set(key, key)
			kvs[key] = key
		}
	}
	ix := New(kvs)
	dirs := ix.ListDir("/svc")
	if !reflect.DeepEqual(dirs, ref.ListDir("/svc")) || len(dirs) != 30 {
		t.Fatalf("lsdir /svc = %q, memkv %q", dirs, ref.ListDir("/svc"))
	}
	for _, d := range dirs {
		p := "/svc/" + d + "/*"
		got, _ := ix.GetAll(p)
		want, _ := ref.GetAll(p)
		if !reflect.DeepEqual(got, want) || len(got) != 12 {
			t.Fatalf("gets %s = %v, memkv %v", p, got, want)
		}
	}
}

// GetAllShared hands out the index's own run when every key of it
// matches, and GetAll a copy always: a caller that sorts its list in place
// (sortKVByLength) must not reorder the index under later lookups.
func TestGetAllSharesOnlyWhenAsked(t *testing.T) {
	kvs := map[string]string{}
	for i := range 1000 {
		kvs[fmt.Sprintf("/k%04d", i)] = "v"
	}
	kvs["/nested/x"] = "v"
	ix := New(kvs)
	for _, tc := range []struct {
		pattern string
		shared  bool
	}{
		{"/k*", true},     // every key of the run "/k" matches
		{"/k0001", true},  // a key itself
		{"/k000?", true},  // a pattern matching its whole run
		{"/*", false},     // "/nested/x" is in the run and does not match
		{"/[k]*", false},  // no literal head: the run holds "/nested/x"
		{"/none*", false}, // nothing matches
	} {
		a, _ := ix.GetAllShared(tc.pattern)
		b, _ := ix.GetAllShared(tc.pattern)
		same := len(a) > 0 && &a[0] == &b[0]
		if same != tc.shared {
			t.Errorf("GetAllShared(%q): two calls share their list: %v, want %v", tc.pattern, same, tc.shared)
		}
		if len(a) > 0 && cap(a) != len(a) {
			t.Errorf("GetAllShared(%q): capacity %d beyond its %d pairs: an append would write into the index", tc.pattern, cap(a), len(a))
		}
		c, _ := ix.GetAll(tc.pattern)
		if len(c) > 0 && &c[0] == &a[0] {
			t.Errorf("GetAll(%q) shares the index's run", tc.pattern)
		}
		slices.Reverse(c)
		if d, _ := ix.GetAllShared(tc.pattern); !reflect.DeepEqual(d, b) {
			t.Errorf("GetAll(%q): reversing its list changed the index", tc.pattern)
		}
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = ix.GetAllShared("/k*") }); n != 0 {
		t.Errorf("GetAllShared(\"/k*\") allocates %v times", n)
	}
}
