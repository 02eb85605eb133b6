// Package store is the key/value store that templates query: memkv v0.1.1's
// behaviour (function names, result order, quirks, error values) found
// through sorted indexes instead of a scan of every key on every call, so a
// template that calls gets or lsdir once per directory stays linear in keys.
package store

import (
	"cmp"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kelseyhightower/memkv"
)

// Index is a read-only snapshot of keys and values, built once per render;
// it is safe for concurrent use.
type Index struct {
	// byKey holds every pair in key order: a glob's literal head selects one
	// contiguous run, and the run is already in the order memkv sorts to; a
	// single key is found by binary search. No map beside it: at 100k keys
	// a map would add a third of the render's memory for lookups that a
	// search of 17 steps answers.
	byKey []memkv.KVPair
	// dirs is every key in the order of path.Dir(key): memkv's ls and
	// lsdir select keys by the cleaned directory, not by the raw key, so a
	// key such as "/x/../a/b" belongs to "/a". Built on the first ls or
	// lsdir: a template that only calls gets never pays for it.
	dirs func() []dirEntry
}

type dirEntry struct {
	dir string // path.Dir(key)
	key string
}

// New indexes kvs; the map is not kept.
func New(kvs map[string]string) *Index { return FromPairs(PairsOf(kvs)) }

// PairsOf is kvs as a list, in no order.
func PairsOf(kvs map[string]string) []memkv.KVPair {
	pairs := make([]memkv.KVPair, 0, len(kvs))
	for k, v := range kvs {
		pairs = append(pairs, memkv.KVPair{Key: k, Value: v})
	}
	return pairs
}

// FromPairs indexes pairs. It sorts them in place (a list already in order,
// as etcd sends one, is only checked) and keeps the slice: the caller must
// not use it afterwards. A key given twice keeps its greatest value, so
// that the outcome does not depend on the list's order (a map behind it
// would have kept a random one): values sort greatest first, and
// CompactFunc keeps the first of each key.
func FromPairs(pairs []memkv.KVPair) *Index {
	if !slices.IsSortedFunc(pairs, byKeyValue) {
		slices.SortFunc(pairs, byKeyValue)
	}
	ix := &Index{byKey: slices.CompactFunc(pairs, func(a, b memkv.KVPair) bool { return a.Key == b.Key })}
	ix.dirs = sync.OnceValue(ix.byDir)
	return ix
}

func byKeyValue(a, b memkv.KVPair) int {
	return cmp.Or(strings.Compare(a.Key, b.Key), strings.Compare(b.Value, a.Value))
}

// Pairs calls fn with every pair in key order.
func (ix *Index) Pairs(fn func(key, value string)) {
	for _, kv := range ix.byKey {
		fn(kv.Key, kv.Value)
	}
}

func (ix *Index) lookup(key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(ix.byKey, key, func(kv memkv.KVPair, k string) int { return strings.Compare(kv.Key, k) })
	if !ok {
		return "", false
	}
	return ix.byKey[i].Value, true
}

// byDir builds dirs' list: every key in the order of path.Dir(key).
func (ix *Index) byDir() []dirEntry {
	d := make([]dirEntry, len(ix.byKey))
	for i, kv := range ix.byKey {
		d[i] = dirEntry{dir: path.Dir(kv.Key), key: kv.Key}
	}
	// Keys break ties so the order is total and runs are deterministic
	// without a stable sort (Go's is O(n log² n) in moves).
	slices.SortFunc(d, func(a, b dirEntry) int {
		return cmp.Or(strings.Compare(a.dir, b.dir), strings.Compare(a.key, b.key))
	})
	return d
}

// Exists reports whether key is in the store (memkv Exists).
func (ix *Index) Exists(key string) bool {
	_, ok := ix.lookup(key)
	return ok
}

// Get returns the pair of key, or a *memkv.KeyError wrapping
// memkv.ErrNotExist (memkv Get).
func (ix *Index) Get(key string) (memkv.KVPair, error) {
	v, ok := ix.lookup(key)
	if !ok {
		return memkv.KVPair{}, &memkv.KeyError{Key: key, Err: memkv.ErrNotExist}
	}
	return memkv.KVPair{Key: key, Value: v}, nil
}

// GetValue returns the value of key; when key is missing it returns the
// first default if one is given, else Get's error (memkv GetValue).
func (ix *Index) GetValue(key string, v ...string) (string, error) {
	kv, err := ix.Get(key)
	if err != nil && len(v) > 0 {
		return v[0], nil
	}
	return kv.Value, err
}

// GetAll returns the pairs whose key matches pattern (path.Match syntax),
// sorted by key (memkv GetAll): a list of the caller's own. A malformed
// pattern is an error only when the store holds a key, because memkv
// learns of it from path.Match.
func (ix *Index) GetAll(pattern string) (memkv.KVPairs, error) {
	ks, shared, err := ix.getAll(pattern)
	if shared {
		ks = slices.Clone(ks)
	}
	return ks, err
}

// GetAllShared is GetAll for a caller that never writes to the list: when
// every key of the pattern's literal head matches (as "/*" over a flat
// prefix does), the list is the index's own run of them, not a copy. A
// template that only ranges over gets "/*" then holds its 100k pairs once.
func (ix *Index) GetAllShared(pattern string) (memkv.KVPairs, error) {
	ks, _, err := ix.getAll(pattern)
	return ks, err
}

// getAll is GetAll, and whether the list is a run of byKey.
func (ix *Index) getAll(pattern string) (ks memkv.KVPairs, shared bool, err error) {
	if len(ix.byKey) == 0 {
		return make(memkv.KVPairs, 0), false, nil
	}
	// path.Match checks the whole pattern whatever the name, so one call
	// tells a malformed pattern as every call in memkv's scan would.
	if _, err := path.Match(pattern, ix.byKey[0].Key); err != nil {
		return nil, false, err
	}
	// Only keys that start with the pattern's literal head can match: one
	// run of byKey.
	head := literalHead(pattern)
	lo := sort.Search(len(ix.byKey), func(i int) bool { return ix.byKey[i].Key >= head })
	run := ix.byKey[lo:]
	run = run[:sort.Search(len(run), func(i int) bool { return !strings.HasPrefix(run[i].Key, head) })]
	if head == pattern {
		// No meta characters: only the key itself matches, first in the run.
		if len(run) > 0 && run[0].Key == pattern {
			return run[:1:1], true, nil
		}
		return make(memkv.KVPairs, 0), false, nil
	}
	match := func(key string) bool {
		ok, _ := path.Match(pattern, key)
		return ok
	}
	if pattern[len(head):] == "*" {
		// "HEAD*", the usual pattern: path.Match compares the literal head
		// (every key of the run starts with it) and then lets '*' take any
		// bytes but '/'. Asking just that skips a path.Match per key, a
		// tenth of a flat 100k render.
		match = func(key string) bool { return strings.IndexByte(key[len(head):], '/') < 0 }
	}
	// The run itself while every key matches; a list of the matches from
	// the first key that does not, sized for the rest of the run ("/*/x"
	// over 100k keys would otherwise copy the list over and over as it
	// grows).
	for i, kv := range run {
		if match(kv.Key) {
			continue
		}
		ks = make(memkv.KVPairs, i, len(run)-1)
		copy(ks, run[:i])
		for _, kv := range run[i+1:] {
			if match(kv.Key) {
				ks = append(ks, kv)
			}
		}
		return ks, false, nil
	}
	return run[:len(run):len(run)], true, nil
}

// literalHead is the part of pattern before its first meta character.
func literalHead(pattern string) string {
	if i := strings.IndexAny(pattern, `*?[\`); i >= 0 {
		return pattern[:i]
	}
	return pattern
}

// GetAllValues returns the values of GetAll(pattern), sorted by value
// (memkv GetAllValues); on error the slice is empty, not nil.
func (ix *Index) GetAllValues(pattern string) ([]string, error) {
	ks, _, err := ix.getAll(pattern) // nil on error
	vs := make([]string, len(ks))
	for i, kv := range ks {
		vs[i] = kv.Value
	}
	slices.Sort(vs)
	return vs, err
}

// List returns the sorted, distinct names of the keys and directories
// directly below filePath, and the base name of filePath itself when it is
// a key (memkv List, quirks included: ls "/" names only top-level keys).
func (ix *Index) List(filePath string) []string {
	names := make(map[string]bool)
	if _, ok := ix.lookup(filePath); ok {
		names[path.Base(filePath)] = true
	}
	// memkv takes a key when the terms of path.Dir(key) start with the
	// terms of path.Clean(filePath): the directory is that path or lies
	// below it.
	c := path.Clean(filePath)
	for _, run := range [][]dirEntry{ix.dirRange(c), ix.dirPrefixRange(c + "/")} {
		for _, e := range run {
			if e.key != filePath {
				name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(e.key, filePath), "/"), "/")
				names[name] = true
			}
		}
	}
	return sortedNames(names)
}

// ListDir returns the sorted, distinct names of the directories directly
// below filePath that hold keys starting with filePath (memkv ListDir,
// quirks included: lsdir "/" lists nothing).
func (ix *Index) ListDir(filePath string) []string {
	names := make(map[string]bool)
	under := path.Clean(filePath) + "/"
	// The name comes from the directory alone, and entries come grouped
	// by directory: once a directory gave its name, its other keys are
	// skipped (1,000 map writes for 1,000 directories, not one per key).
	named := ""
	for _, e := range ix.dirPrefixRange(under) {
		if e.dir == named || !strings.HasPrefix(e.key, filePath) {
			continue
		}
		name, _, _ := strings.Cut(e.dir[len(under):], "/")
		names[name] = true
		named = e.dir
	}
	return sortedNames(names)
}

// dirRange is the entries whose directory is exactly dir.
func (ix *Index) dirRange(dir string) []dirEntry {
	d := ix.dirs()
	lo := sort.Search(len(d), func(i int) bool { return d[i].dir >= dir })
	hi := lo
	for hi < len(d) && d[hi].dir == dir {
		hi++
	}
	return d[lo:hi]
}

// dirPrefixRange is the entries whose directory starts with prefix.
func (ix *Index) dirPrefixRange(prefix string) []dirEntry {
	d := ix.dirs()
	lo := sort.Search(len(d), func(i int) bool { return d[i].dir >= prefix })
	hi := lo + sort.Search(len(d)-lo, func(i int) bool {
		return !strings.HasPrefix(d[lo+i].dir, prefix)
	})
	return d[lo:hi]
}

func sortedNames(set map[string]bool) []string {
	vs := slices.AppendSeq(make([]string, 0, len(set)), maps.Keys(set))
	slices.Sort(vs)
	return vs
}
