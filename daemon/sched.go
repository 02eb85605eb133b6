package daemon

import (
	"sort"
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
}

// sched decides which groups to process when. It does no I/O and reads no
// clock: callers pass the time, so tests drive it without sleeping.
type sched struct {
	groups []*group
	budget *budget // the memory groups may keep their reads in
	gen    int64   // the watch stream events come from now; 0: none
}

// newSched groups procs: two resources whose keys overlap (one equal to or
// below the other, as a path), or that write the same file, are in one
// group, transitively.
func newSched(procs []Processor, def waitspec.Spec) *sched {
	ps := append([]Processor(nil), procs...)
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Name() < ps[j].Name() })
	parent := make([]int, len(ps))
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
	for i := range ps {
		for j := i + 1; j < len(ps); j++ {
			if overlap(ps[i].StoreKeys(), ps[j].StoreKeys()) || sameDestination(ps[i], ps[j]) {
				parent[find(j)] = find(i)
			}
		}
	}
	byRoot := map[int]*group{}
	s := &sched{budget: newBudget(followBudget)}
	for i, p := range ps {
		g, ok := byRoot[find(i)]
		if !ok {
			g = &group{wait: def}
			byRoot[find(i)] = g
			s.groups = append(s.groups, g) // in the order of first members
		}
		g.members = append(g.members, p)
		for _, k := range p.StoreKeys() {
			if !contains(g.keys, k) {
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

// destined is a Processor that names the file it writes (resource's do).
type destined interface{ Destination() string }

// sameDestination: groups run concurrently, so two resources writing one
// file go in one group, where file-name order decides which is left on it.
func sameDestination(a, b Processor) bool {
	da, ok1 := a.(destined)
	db, ok2 := b.(destined)
	return ok1 && ok2 && da.Destination() != "" && da.Destination() == db.Destination()
}

func overlap(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if backends.KeyUnder(x, y) || backends.KeyUnder(y, x) {
				return true
			}
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// keys is every key any group reads.
func (s *sched) keys() []string {
	var out []string
	for _, g := range s.groups {
		for _, k := range g.keys {
			if !contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// event routes a change to the groups whose keys it touches and that have
// not read its revision already. Those following the watch (follow) take
// its changes, or stop following when it cannot be followed.
func (s *sched) event(e timedEvent) {
	for _, g := range s.groups {
		touched := false
		for _, k := range e.keys {
			if underAny(k, g.keys) {
				touched = true
				break
			}
		}
		if !touched {
			continue
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

// due returns the groups to process at now, in file-name order.
func (s *sched) due(now time.Time) []*group {
	var out []*group
	for _, g := range s.groups {
		if at, ok := g.readyAt(); ok && !at.After(now) {
			out = append(out, g)
		}
	}
	return out
}

// next is the earliest time a group becomes due; false when none is owed.
func (s *sched) next() (time.Time, bool) {
	var first time.Time
	found := false
	for _, g := range s.groups {
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

func underAny(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if backends.KeyUnder(key, p) {
			return true
		}
	}
	return false
}
