package daemon

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kelseyhightower/memkv"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
)

func change(key, value string, rev int64) backends.Change {
	return backends.Change{Key: key, Value: value, Rev: rev}
}

func deleted(key string, rev int64) backends.Change {
	return backends.Change{Key: key, Rev: rev, Deleted: true}
}

// changed is the event the watch gives for changes of one whole range.
func changed(gen int64, whole string, cs ...backends.Change) timedEvent {
	e := timedEvent{gen: gen, whole: whole, changes: cs, at: t0}
	for _, c := range cs {
		e.keys = append(e.keys, c.Key)
		e.rev = c.Rev
	}
	return e
}

// TestFollowIsTheReadAtTheLastChange: a read plus the changes after it is
// what a read at the last change's revision gives: puts, new keys,
// deletes, several changes in one revision, changes the read had already
// and changes to keys outside the group's.
func TestFollowIsTheReadAtTheLastChange(t *testing.T) {
	b := &budget{left: 1 << 20}
	keys := []string{"/a", "/a/sub"} // overlapping: the read lists /a/sub/x twice
	var f follow
	f.start([]memkv.KVPair{{Key: "/a/sub/x", Value: "x"}, {Key: "/a/2", Value: "two"}, {Key: "/a/sub/x", Value: "x"}, {Key: "/a/1", Value: "one"}}, 5, 1, b)
	if !f.on || !slices.Equal(f.pairs, []memkv.KVPair{{Key: "/a/1", Value: "one"}, {Key: "/a/2", Value: "two"}, {Key: "/a/sub/x", Value: "x"}}) {
		t.Fatalf("after the read: %+v", f)
	}
	f.take(changed(1, "/a", change("/a/1", "stale", 4), change("/a/2", "stale", 5)), keys, b) // in the read already
	f.take(changed(1, "/a", change("/a/1", "uno", 6), change("/a/0", "zero", 6), deleted("/a/2", 6), deleted("/a/none", 6)), keys, b)
	f.take(changed(1, "/", change("/b/x", "other group's", 7)), keys, b)
	f.take(changed(1, "/a", change("/a", "top", 8), deleted("/a/sub/x", 8)), keys, b)
	want := []memkv.KVPair{{Key: "/a", Value: "top"}, {Key: "/a/0", Value: "zero"}, {Key: "/a/1", Value: "uno"}}
	if !f.on || f.rev != 8 || !slices.Equal(f.pairs, want) {
		t.Fatalf("followed to %d: %v, want %v at 8", f.rev, f.pairs, want)
	}
	var size int64
	for _, kv := range want {
		size += pairSize(kv.Key, kv.Value)
	}
	if f.size != size || b.left != 1<<20-size {
		t.Errorf("size %d, budget left %d; want %d taken", f.size, b.left, size)
	}
}

// TestFollowModel: random changes to a few keys, in random batches per
// revision, followed from a read at a random revision, agree with a map of
// the keys at every revision.
func TestFollowModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"/m", "/m/a", "/m/b", "/m/b/c", "/m/d"}
	for round := 0; round < 200; round++ {
		state := map[string]string{}
		var history []map[string]string // state after each revision, from 1
		var events []timedEvent
		for rev := int64(1); rev <= 40; rev++ {
			var cs []backends.Change
			for n := 1 + r.IntN(3); n > 0; n-- {
				k := names[r.IntN(len(names))]
				if r.IntN(3) == 0 {
					delete(state, k)
					cs = append(cs, deleted(k, rev))
				} else {
					v := string(rune('a' + r.IntN(26)))
					state[k] = v
					cs = append(cs, change(k, v, rev))
				}
			}
			history = append(history, maps.Clone(state))
			events = append(events, changed(1, "/m", cs...))
		}
		readAt := r.IntN(len(history))
		var read []memkv.KVPair
		for k, v := range history[readAt] {
			read = append(read, memkv.KVPair{Key: k, Value: v})
		}
		var f follow
		b := &budget{left: 1 << 20}
		f.start(read, int64(readAt+1), 1, b)
		// The watch may deliver events from before the read too.
		for _, e := range events[max(readAt-3, 0):] {
			f.take(e, []string{"/m"}, b)
			if e.rev <= int64(readAt+1) {
				continue
			}
			got := map[string]string{}
			for _, kv := range f.pairs {
				got[kv.Key] = kv.Value
			}
			if f.rev != e.rev || !maps.Equal(got, history[e.rev-1]) {
				t.Fatalf("round %d, read at %d: at %d followed %v (rev %d), want %v", round, readAt+1, e.rev, got, f.rev, history[e.rev-1])
			}
		}
	}
}

// TestFollowDropsWhatCannotBeFollowed: a change from a key watched as two
// ranges, from a range that does not cover all the group's keys, from
// another watch stream, a watch down, a restore and an exhausted budget
// each stop following, and give the budget back.
func TestFollowDropsWhatCannotBeFollowed(t *testing.T) {
	const all = 1 << 20
	read := []memkv.KVPair{{Key: "/a/x", Value: "1"}}
	for _, tc := range []struct {
		name string
		keys []string
		e    timedEvent
	}{
		{"two ranges", []string{"/a"}, changed(1, "", change("/a/x", "2", 6))},
		{"range not covering", []string{"/a", "/b"}, changed(1, "/a", change("/a/x", "2", 6))},
		{"another stream", []string{"/a"}, changed(2, "/a", change("/a/x", "2", 6))},
		{"no values", []string{"/a"}, timedEvent{keys: []string{"/a/x"}, rev: 6, gen: 1, whole: "/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &budget{left: all}
			var f follow
			f.start(read, 5, 1, b)
			f.take(tc.e, tc.keys, b)
			if f.on || b.left != all {
				t.Fatalf("still following (%v) or budget not given back (%d left)", f.on, b.left)
			}
		})
	}
	s := newSched([]Processor{&fakeProc{name: "a", keys: []string{"/a"}}}, waitspec.Spec{})
	g := s.groups[0]
	s.watching(1)
	g.fed.start(read, 5, 1, s.budget)
	s.watching(0) // the watch went down
	if g.fed.on {
		t.Error("still following with the watch down")
	}
	g.fed.start(read, 5, 1, s.budget)
	s.forget()
	if g.fed.on {
		t.Error("still following after a restore")
	}
	if got := s.budget.left; got != followBudget {
		t.Errorf("budget left %d, want all %d", got, followBudget)
	}
	b := &budget{left: pairSize("/a/x", "1")}
	var f follow
	f.start(read, 5, 1, b)
	if !f.on {
		t.Fatal("a read that fits the budget is not followed")
	}
	f.take(changed(1, "/a", change("/a/y", "2", 6)), []string{"/a"}, b)
	if f.on || b.left != pairSize("/a/x", "1") {
		t.Errorf("following beyond the budget (%v, %d left)", f.on, b.left)
	}
	f.start(read, 5, 0, b)
	if f.on {
		t.Error("following a read made with no watch stream")
	}
}

// valueStore is a fake etcd whose reads the test counts.
type valueStore struct {
	fakeWatch
	values map[string]string
	reads  int
}

func (v *valueStore) GetValues(context.Context, []string) (map[string]string, int64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.reads++
	return maps.Clone(v.values), v.rev, nil
}

// set is what etcd holds from now on, at rev.
func (v *valueStore) set(values map[string]string, rev int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.values, v.rev = values, rev
}

// seenProc records the values each pass saw.
type seenProc struct {
	fakeProc
	seen chan map[string]string
}

func (p *seenProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	vals, rev, err := g.GetValues(ctx, p.keys)
	p.seen <- vals
	return apply.Result{Revision: rev}, err
}

// runReading runs a daemon over s with one resource of the key "/k" until
// the test ends, and returns next: it awaits the next pass and checks what
// the pass saw and how many reads v (s's values) had answered by then.
func runReading(t *testing.T, s WatchStore, v *valueStore) func(want map[string]string, reads int) {
	p := &seenProc{fakeProc: fakeProc{name: "p", keys: []string{"/k"}}, seen: make(chan map[string]string)}
	log, _ := test.NewNullLogger()
	d := New(Options{Load: func(bool) Plan { return Plan{Procs: []Processor{p}} }, Store: s, Watch: s, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return func(want map[string]string, reads int) {
		t.Helper()
		select {
		case got := <-p.seen:
			v.mu.Lock()
			n := v.reads
			v.mu.Unlock()
			if !maps.Equal(got, want) || n != reads {
				t.Fatalf("pass saw %v after %d reads, want %v after %d", got, n, want, reads)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no pass")
		}
	}
}

// TestRunRendersFromTheWatch: with a change of a key watched whole, a pass
// renders the read plus the change without reading etcd again; a change
// from a key watched as two ranges, and the first change on a new watch
// stream, read.
func TestRunRendersFromTheWatch(t *testing.T) {
	f := &valueStore{fakeWatch: fakeWatch{rev: 10, watching: make(chan chan backends.WatchEvent), errs: make(chan error)},
		values: map[string]string{"/k/a": "1"}}
	next := runReading(t, f, f)
	w := <-f.watching
	next(map[string]string{"/k/a": "1"}, 1)
	// The start-up pass may have read before the watch stream opened; a
	// change read from etcd follows from this stream on.
	f.set(map[string]string{"/k/a": "1", "/k/b": "2"}, 11)
	w <- backends.WatchEvent{Keys: []string{"/k/b"}, Revision: 11, Resume: 11}
	next(map[string]string{"/k/a": "1", "/k/b": "2"}, 2)
	w <- backends.WatchEvent{Keys: []string{"/k/a", "/k/c"}, Revision: 12, Resume: 12, Whole: "/k",
		Changes: []backends.Change{deleted("/k/a", 12), change("/k/c", "3", 12)}}
	next(map[string]string{"/k/b": "2", "/k/c": "3"}, 2)
	w <- backends.WatchEvent{Keys: []string{"/k/b"}, Revision: 13, Resume: 13, Whole: "/k",
		Changes: []backends.Change{change("/k/b", "two", 13)}}
	next(map[string]string{"/k/b": "two", "/k/c": "3"}, 2)

	// A key watched as two ranges: read.
	f.set(map[string]string{"/k/b": "two", "/k/c": "three"}, 14)
	w <- backends.WatchEvent{Keys: []string{"/k/c"}, Revision: 14, Resume: 14,
		Changes: []backends.Change{change("/k/c", "three", 14)}}
	next(map[string]string{"/k/b": "two", "/k/c": "three"}, 3)
	w <- backends.WatchEvent{Keys: []string{"/k/c"}, Revision: 15, Resume: 15, Whole: "/k",
		Changes: []backends.Change{change("/k/c", "3", 15)}}
	next(map[string]string{"/k/b": "two", "/k/c": "3"}, 3)

	// A new stream: what was followed on the old one is dropped.
	f.set(map[string]string{"/k/b": "new", "/k/c": "3"}, 16)
	f.errs <- errors.New("connection lost")
	w = <-f.watching
	w <- backends.WatchEvent{Keys: []string{"/k/b"}, Revision: 16, Resume: 16, Whole: "/k",
		Changes: []backends.Change{change("/k/b", "new", 16)}}
	next(map[string]string{"/k/b": "new", "/k/c": "3"}, 4)
}

// gatedStore holds the watcher's first Revision call (Run's own comes
// first) until gate closes, so that the start-up pass reads before any
// stream opens.
type gatedStore struct {
	valueStore
	calls int
	gate  chan struct{}
}

func (g *gatedStore) Revision(ctx context.Context, key string) (int64, error) {
	g.mu.Lock()
	g.calls++
	n := g.calls
	g.mu.Unlock()
	if n == 2 {
		<-g.gate
	}
	return g.valueStore.Revision(ctx, key)
}

// TestStartUpReadFollowsTheFirstStream: the first stream opens from the
// revision taken before the start-up reads, so a change it delivers is
// rendered from the start-up read without reading etcd again, even when
// that read came before the stream opened.
func TestStartUpReadFollowsTheFirstStream(t *testing.T) {
	f := &gatedStore{valueStore: valueStore{fakeWatch: fakeWatch{rev: 10, watching: make(chan chan backends.WatchEvent), errs: make(chan error)},
		values: map[string]string{"/k/a": "1"}}, gate: make(chan struct{})}
	next := runReading(t, f, &f.valueStore)
	next(map[string]string{"/k/a": "1"}, 1) // no stream yet: the watcher waits on the gate
	close(f.gate)
	w := <-f.watching
	f.mu.Lock()
	from := f.starts[0]
	f.mu.Unlock()
	if from != 10 {
		t.Fatalf("first stream opened after revision %d, want 10 (before the start-up read)", from)
	}
	w <- backends.WatchEvent{Keys: []string{"/k/b"}, Revision: 11, Resume: 11, Whole: "/k",
		Changes: []backends.Change{change("/k/b", "2", 11)}}
	next(map[string]string{"/k/a": "1", "/k/b": "2"}, 1)

	// The stream breaks: the next stream's first change reads again.
	f.set(map[string]string{"/k/a": "1", "/k/b": "3"}, 12)
	f.errs <- errors.New("connection lost")
	w = <-f.watching
	w <- backends.WatchEvent{Keys: []string{"/k/b"}, Revision: 12, Resume: 12, Whole: "/k",
		Changes: []backends.Change{change("/k/b", "3", 12)}}
	next(map[string]string{"/k/a": "1", "/k/b": "3"}, 2)
}

// A change that cannot be followed, arriving while a group's read is in
// flight, keeps that read from being followed even when the read already
// holds it: with workers, the loop sees the change before the read's
// report, and a follow installed afterwards would never have been dropped
// by it (a key watched as two ranges then rendered from the watch).
func TestChangeDuringAReadThatCannotBeFollowed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		e       timedEvent
		follows bool
	}{
		{"one whole range, in the read", changed(1, "/a", change("/a/x", "2", 4)), true},
		{"two ranges, in the read", changed(1, "", change("/a/x", "2", 4)), false},
		{"one whole range, after the read", changed(1, "/a", change("/a/x", "2", 6)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSched([]Processor{&fakeProc{name: "a", keys: []string{"/a"}}}, waitspec.Spec{})
			g := s.groups[0]
			s.watching(1)
			g.reading, g.missed = true, 0
			s.event(tc.e)
			// What settle checks before it installs a read made at 5.
			if got := g.missed <= 5; got != tc.follows {
				t.Errorf("the read at revision 5 may be followed: %v, want %v (missed %d)", got, tc.follows, g.missed)
			}
		})
	}
}

// start, for tests, is the worker's prepare and the loop's install in one
// step: it follows from a read of keys at rev, made while gen was the watch
// stream delivering events (0: none); as far as the budget allows. It
// keeps pairs itself, in key order with one pair per key, and returns
// them so: the pass renders from the same list, with no copy.
func (f *follow) start(pairs []memkv.KVPair, rev, gen int64, b *budget) []memkv.KVPair {
	f.drop(b)
	if gen == 0 {
		return pairs
	}
	pairs, size := prepare(pairs)
	f.install(pairs, rev, gen, size, b)
	return pairs
}
