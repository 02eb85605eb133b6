package daemon

import (
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
)

// Retry backoff of a failed group; a new event for its keys retries it
// sooner.
const (
	minBackoff = 500 * time.Millisecond
	maxBackoff = 30 * time.Second
)

// group is resources that share keys: read once, at one revision, and
// processed in file-name order, so that a bundle is written before the
// flag file checked against it.
type group struct {
	members []Processor
	dests   []string // members' destinations ("" when one does not say)
	keys    []string // the members' store keys, duplicates removed
	wait    waitspec.Spec
	rev     int64 // revision of the last successful read

	dirty       bool
	immediate   bool      // start, resync or reload: no quiescence
	first, last time.Time // first and last event since the last pass began
	failed      bool
	retryAt     time.Time
	backoff     time.Duration
	rendered    bool // every member succeeded once since start

	fed follow // the last read, and the watch's changes since

	// Set while the group's worker runs a pass (see Daemon.dispatch): a
	// group has at most one pass at a time, and what arrives meanwhile is
	// merged into the fields above, one pending pass however long the
	// running one takes.
	busy    bool
	reading bool  // the running pass reads etcd and has not said at which revision
	missed  int64 // the newest revision of a change that arrived while it read
	// held: a pass of a group of the configuration before a SIGHUP, on one
	// of this group's resources or files, still runs; this group waits
	// for it (Daemon.hold).
	held bool
}

// sched decides which groups to process when. It does no I/O and reads no
// clock: callers pass the time, so tests drive it without sleeping.
type sched struct {
	groups []*group
	budget *budget // the memory groups may keep their reads in
	gen    int64   // the watch stream events come from now; 0: none
	// epoch counts forget calls: a pass that began before one must not
	// record the revision it read, which a restore made meaningless.
	epoch int64
}

// newSched groups procs: two resources whose keys overlap (one equal to or
// below the other, as a path), or that write the same file, are in one
// group, transitively.
func newSched(procs []Processor, def waitspec.Spec) *sched {
	ps := slices.SortedStableFunc(slices.Values(procs), byName)
	keys := make([][]string, len(ps)) // StoreKeys builds its list anew on every call
	dests := make([]string, len(ps))
	for i, p := range ps {
		keys[i], dests[i] = p.StoreKeys(), p.Destination()
	}
	root := unite(keys, dests)
	byRoot := map[int]*group{}
	seen := map[*group]map[string]bool{}
	s := &sched{budget: &budget{left: followBudget}}
	for i, p := range ps {
		g, ok := byRoot[root[i]]
		if !ok {
			g = &group{wait: def}
			byRoot[root[i]] = g
			seen[g] = map[string]bool{}
			s.groups = append(s.groups, g) // in the order of first members
		}
		g.members = append(g.members, p)
		g.dests = append(g.dests, dests[i])
		for _, k := range keys[i] {
			if !seen[g][k] {
				seen[g][k] = true
				g.keys = append(g.keys, k)
			}
		}
	}
	// A group waits as long as its most patient member asks.
	for _, g := range s.groups {
		own := false
		for _, m := range g.members {
			if w, ok := m.Quiescence(); ok {
				if !own {
					g.wait, own = w, true
				}
				g.wait.Min, g.wait.Max = max(g.wait.Min, w.Min), max(g.wait.Max, w.Max)
			}
		}
	}
	return s
}

func byName(a, b Processor) int { return strings.Compare(a.Name(), b.Name()) }

// unite joins i and j, transitively, when a key of keys[i] is equal to or
// below one of keys[j] as a path, or when dests[i] == dests[j] != "". It
// returns each index's representative.
//
// Comparing every pair took half a second at 1,000 resources. A key under
// another has it as a string prefix, so in sorted order it comes after it
// and before the first key without that prefix: each key is compared with
// its run of extensions only.
func unite(keys [][]string, dests []string) []int {
	parent := make([]int, len(keys))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		if parent[i] != i {
			parent[i] = find(parent[i])
		}
		return parent[i]
	}
	join := func(i, j int) {
		if ri, rj := find(i), find(j); ri != rj {
			parent[max(ri, rj)] = min(ri, rj)
		}
	}
	type owned struct {
		key string
		i   int
	}
	var all []owned
	for i, ks := range keys {
		for _, k := range ks {
			all = append(all, owned{k, i})
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a].key < all[b].key })
	// Resources on one key join at once, and the key is scanned once: a
	// thousand resources on one key are not a million comparisons.
	uniq := all[:0]
	for _, x := range all {
		if n := len(uniq); n > 0 && uniq[n-1].key == x.key {
			join(uniq[n-1].i, x.i)
			continue
		}
		uniq = append(uniq, x)
	}
	for a, x := range uniq {
		for _, y := range uniq[a+1:] {
			if !strings.HasPrefix(y.key, x.key) {
				break
			}
			if backends.KeyUnder(y.key, x.key) {
				join(x.i, y.i)
			}
		}
	}
	first := map[string]int{}
	for i, d := range dests {
		if d == "" {
			continue
		}
		if j, ok := first[d]; ok {
			join(j, i)
		} else {
			first[d] = i
		}
	}
	for i := range parent {
		find(i) // leaves parent[i] at i's representative
	}
	return parent
}

// keys is every key any group reads, each once: resources that share a
// key are in one group (unite), whose keys are listed once.
func (s *sched) keys() []string {
	var out []string
	for _, g := range s.groups {
		out = append(out, g.keys...)
	}
	return out
}

// event routes a change to the groups whose keys it touches and that have
// not read its revision already. Those following the watch (follow) take
// its changes, or stop following when it cannot be followed.
func (s *sched) event(e timedEvent) {
	for _, g := range s.groups {
		if !slices.ContainsFunc(e.keys, func(k string) bool { return backends.KeyUnderAny(k, g.keys) }) {
			continue
		}
		if g.reading {
			// Not known yet whether the running pass's read holds it.
			g.missed = max(g.missed, e.rev)
			// A change that cannot be followed (from a key watched as two
			// ranges, whose changes may come in either order) must keep
			// the read from being followed at all, as it would have
			// dropped a follow already in place.
			if e.rev <= 0 || !followable(e, g.keys) {
				g.missed = math.MaxInt64
			}
		}
		g.fed.take(e, g.keys, s.budget)
		if e.rev > 0 && e.rev <= g.rev {
			continue
		}
		g.mark(e.at, false)
	}
}

// watching says which watch stream events come from now (0: none, the
// watch is down): groups following an older one must read again, since
// what a stream delivers starts where it was opened.
func (s *sched) watching(gen int64) {
	if gen == s.gen {
		return
	}
	s.gen = gen
	for _, g := range s.groups {
		if g.fed.gen != gen {
			g.fed.drop(s.budget)
		}
	}
}

// all marks every group for a pass without quiescence.
func (s *sched) all(at time.Time) {
	for _, g := range s.groups {
		g.mark(at, true)
	}
}

// forget drops the revisions read: after a restore, revisions lower than
// them are new again.
func (s *sched) forget() {
	s.epoch++
	for _, g := range s.groups {
		g.rev = 0
		g.fed.drop(s.budget)
	}
}

func (g *group) mark(at time.Time, immediate bool) {
	if !g.dirty {
		g.first = at
	}
	g.dirty, g.last = true, at
	g.immediate = g.immediate || immediate
}

// readyAt is when g is due, and false when nothing is owed.
func (g *group) readyAt() (time.Time, bool) {
	var at time.Time
	ok := false
	if g.dirty {
		at, ok = g.last.Add(g.wait.Min), true
		if g.immediate {
			at = g.first
		} else if deadline := g.first.Add(g.wait.Max); g.wait.Max > 0 && deadline.Before(at) {
			at = deadline
		}
	}
	if g.failed && (!ok || g.retryAt.Before(at)) {
		at, ok = g.retryAt, true
	}
	return at, ok
}

// due returns the groups to process at now, in file-name order: those
// owed a pass whose time came, unless a pass of theirs (or, after a
// SIGHUP, of the groups they replace) still runs.
func (s *sched) due(now time.Time) []*group {
	var out []*group
	for _, g := range s.groups {
		if g.busy || g.held {
			continue
		}
		if at, ok := g.readyAt(); ok && !at.After(now) {
			out = append(out, g)
		}
	}
	return out
}

// next is the earliest time a group becomes due; false when none is owed.
// A busy or held group is left out: the end of a pass wakes the loop.
func (s *sched) next() (time.Time, bool) {
	var first time.Time
	found := false
	for _, g := range s.groups {
		if g.busy || g.held {
			continue
		}
		if at, ok := g.readyAt(); ok && (!found || at.Before(first)) {
			first, found = at, true
		}
	}
	return first, found
}

// start is called as g's pass begins: events from now on need another
// pass. It says whether the pass must read (start, resync, SIGHUP).
func (g *group) start() (read bool) {
	read = g.immediate
	g.dirty, g.immediate = false, false
	return read
}

// finish records a pass: rev is the revision read (0 when the read
// failed), ok whether every member succeeded.
func (g *group) finish(rev int64, ok bool, now time.Time) {
	if rev > 0 {
		g.rev = rev
	}
	if ok {
		g.failed, g.backoff, g.rendered = false, 0, true
		return
	}
	g.backoff = min(max(2*g.backoff, minBackoff), maxBackoff)
	g.failed, g.retryAt = true, now.Add(g.backoff)
}
