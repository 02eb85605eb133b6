package daemon

import (
	"cmp"
	"slices"
	"strings"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/backends"
)

// followBudget bounds the memory all groups together keep to follow the
// watch: keys and values plus a slice entry each. A group whose read does
// not fit reads on every change, as it did before it could follow; 32 MiB
// holds a group of 200k keys with 100-byte values.
const followBudget = 32 << 20

// follow is what a group knows of its keys without reading them: its last
// read, with every change the watch delivered since applied to it. While
// all the group's keys are below one watched key whose changes come in one
// ordered range (backends.WatchEvent.Whole), that is the keys' state at the
// last change's revision, exactly what a read at that revision returns, so
// a change is rendered without waiting on a read (most of the time from a
// put to the file). Any doubt drops it and the next pass reads: a change
// from a key watched as two ranges, from another watch stream, a watch
// down, a restore.
type follow struct {
	on    bool
	pairs []memkv.KVPair // sorted by key, one per key
	rev   int64          // the revision pairs are at
	gen   int64          // the watch stream whose changes apply to them
	size  int64          // taken from the budget
	// shared: a running pass renders from pairs (lend), so they are
	// copied before they change.
	shared bool
}

// prepare puts a read's pairs in the order follow keeps them, in place,
// and says what keeping them costs. A group's worker calls it on the list
// it just read, before the daemon's loop installs it.
func prepare(pairs []memkv.KVPair) ([]memkv.KVPair, int64) {
	byKey := func(x, y memkv.KVPair) int { return strings.Compare(x.Key, y.Key) }
	if !slices.IsSortedFunc(pairs, byKey) {
		slices.SortFunc(pairs, byKey)
	}
	// A group's keys may overlap ("/a" and "/a/b"), so a read may list a
	// pair twice; at one revision both copies are the same.
	pairs = slices.CompactFunc(pairs, func(x, y memkv.KVPair) bool { return x.Key == y.Key })
	var size int64
	for _, kv := range pairs {
		size += pairSize(kv.Key, kv.Value)
	}
	return pairs, size
}

// install follows from prepared pairs, read at rev while gen was the
// stream, when the budget allows.
func (f *follow) install(pairs []memkv.KVPair, rev, gen, size int64, b *budget) {
	f.drop(b)
	if gen != 0 && b.take(size) {
		*f = follow{on: true, pairs: pairs, rev: rev, gen: gen, size: size}
	}
}

// lend marks pairs as read by a running pass: the next change copies
// them before it applies, so the pass renders from one revision while the
// watch's changes go on being followed. back ends the loan.
func (f *follow) lend() { f.shared = true }
func (f *follow) back() { f.shared = false }

// own makes pairs f's alone before a change is applied to them. The copy
// is of the slice (a key and a value string header per pair), not of the
// strings; the lent list lives until its pass ends.
func (f *follow) own() {
	if f.shared {
		f.pairs, f.shared = slices.Clone(f.pairs), false
	}
}

// drop stops following: the next pass reads.
func (f *follow) drop(b *budget) {
	b.give(f.size)
	*f = follow{}
}

// followable says whether a group on keys can follow e: its changes come
// in one ordered range (whole) that holds every one of keys, values
// included.
func followable(e timedEvent, keys []string) bool {
	return e.whole != "" && len(e.changes) == len(e.keys) &&
		!slices.ContainsFunc(keys, func(k string) bool { return !backends.KeyUnder(k, e.whole) })
}

// take applies e's changes to keys, or drops f when e cannot be followed.
func (f *follow) take(e timedEvent, keys []string, b *budget) {
	if !f.on {
		return
	}
	if e.gen != f.gen || !followable(e, keys) {
		f.drop(b)
		return
	}
	// A change at or before the read is in it already. An answer holds
	// every change of its revisions, so compare with where f was before
	// it: several changes may share a revision.
	base := f.rev
	for _, c := range e.changes {
		if c.Rev <= base || !backends.KeyUnderAny(c.Key, keys) {
			continue
		}
		i, found := slices.BinarySearchFunc(f.pairs, c.Key, func(kv memkv.KVPair, k string) int { return cmp.Compare(kv.Key, k) })
		delta := int64(0)
		if found || !c.Deleted {
			f.own()
		}
		switch {
		case c.Deleted && found:
			delta = -pairSize(f.pairs[i].Key, f.pairs[i].Value)
			f.pairs = slices.Delete(f.pairs, i, i+1)
		case c.Deleted:
		case found:
			delta = int64(len(c.Value) - len(f.pairs[i].Value))
			f.pairs[i].Value = c.Value
		default:
			delta = pairSize(c.Key, c.Value)
			f.pairs = slices.Insert(f.pairs, i, memkv.KVPair{Key: c.Key, Value: c.Value})
		}
		f.rev = c.Rev
		if delta > 0 && !b.take(delta) {
			f.drop(b)
			return
		}
		b.give(-min(delta, 0))
		f.size += delta
	}
}

// pairSize is what a kept pair costs: its strings and its slice entry.
func pairSize(k, v string) int64 { return int64(len(k) + len(v) + 32) }

// budget is the memory left for the groups' follows. Only Run's loop
// takes and gives (dispatch, settle, the watch's events), so it needs no
// lock.
type budget struct{ left int64 }

func (b *budget) take(n int64) bool {
	if n > b.left {
		return false
	}
	b.left -= n
	return true
}

func (b *budget) give(n int64) { b.left += n }
