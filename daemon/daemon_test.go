package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kelseyhightower/memkv"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
)

// fakeProc records its passes; it fails while fail is set.
type fakeProc struct {
	name string
	keys []string
	wait *waitspec.Spec
	fail bool
	log  *[]string // shared pass log: name@revision
	mu   *sync.Mutex
}

func (p *fakeProc) Name() string        { return p.name }
func (p *fakeProc) StoreKeys() []string { return p.keys }
func (p *fakeProc) ReloadPending() bool { return false }
func (p *fakeProc) Destination() string { return "" }
func (p *fakeProc) Quiescence() (waitspec.Spec, bool) {
	if p.wait == nil {
		return waitspec.Spec{}, false
	}
	return *p.wait, true
}

func (p *fakeProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	_, rev, err := g.GetValues(ctx, p.keys)
	if p.mu != nil {
		p.mu.Lock()
		*p.log = append(*p.log, p.name)
		p.mu.Unlock()
	}
	if err != nil {
		return apply.Result{}, err
	}
	if p.fail {
		return apply.Result{Revision: rev}, errors.New(p.name + ": render failed")
	}
	return apply.Result{Revision: rev}, nil
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func groupNames(gs []*group) [][]string {
	var out [][]string
	for _, g := range gs {
		var ns []string
		for _, m := range g.members {
			ns = append(ns, m.Name())
		}
		out = append(out, ns)
	}
	return out
}

// TestGroupsShareKeysInFileNameOrder: resources on the same (or nested)
// keys form one group in file-name order; others stay apart, and a key
// that is only a string prefix ("/ab" vs "/a") does not join them.
func TestGroupsShareKeysInFileNameOrder(t *testing.T) {
	s := newSched([]Processor{
		&fakeProc{name: "20-flags.toml", keys: []string{"/k/sa"}},
		&fakeProc{name: "30-other.toml", keys: []string{"/other"}},
		&fakeProc{name: "10-bundle.toml", keys: []string{"/k/sa"}},
		&fakeProc{name: "40-nested.toml", keys: []string{"/k/sa/m1"}},
		&fakeProc{name: "50-sibling.toml", keys: []string{"/k/sa-old"}},
	}, waitspec.Spec{})
	want := [][]string{{"10-bundle.toml", "20-flags.toml", "40-nested.toml"}, {"30-other.toml"}, {"50-sibling.toml"}}
	if got := groupNames(s.groups); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("groups = %v, want %v", got, want)
	}
	if got := s.keys(); !slices.Equal(got, []string{"/k/sa", "/k/sa/m1", "/other", "/k/sa-old"}) {
		t.Errorf("keys = %v", got)
	}
}

// TestEventsRouteOnlyToTheirGroups, and not to groups that read them already.
func TestEventsRouteOnlyToTheirGroups(t *testing.T) {
	s := newSched([]Processor{
		&fakeProc{name: "a", keys: []string{"/a"}},
		&fakeProc{name: "b", keys: []string{"/b"}},
	}, waitspec.Spec{})
	s.event(timedEvent{keys: []string{"/a/x", "/ab"}, rev: 5, at: t0})
	if got := groupNames(s.due(t0)); !slices.EqualFunc(got, [][]string{{"a"}}, slices.Equal) {
		t.Fatalf("due = %v, want only a", got)
	}
	g := s.groups[0]
	g.start()
	g.finish(7, true, t0)
	s.event(timedEvent{keys: []string{"/a/x"}, rev: 6, at: t0}) // older than the read at 7: covered
	if got := s.due(t0); len(got) != 0 {
		t.Fatalf("an event the read covered woke %v", groupNames(got))
	}
	s.event(timedEvent{keys: []string{"/a/x"}, rev: 8, at: t0})
	if len(s.due(t0)) != 1 {
		t.Fatal("a newer event did not wake a")
	}
	s.forget() // a restore: revision 3 is new again
	g.start()
	s.event(timedEvent{keys: []string{"/a/x"}, rev: 3, at: t0})
	if len(s.due(t0)) != 1 {
		t.Fatal("after forget, a lower revision did not wake a")
	}
}

// TestQuiescence: MIN after the last event, never later than MAX after
// the first; start-up and resync passes do not wait.
func TestQuiescence(t *testing.T) {
	s := newSched([]Processor{&fakeProc{name: "a", keys: []string{"/a"}}}, waitspec.Spec{Min: 2 * time.Second, Max: 5 * time.Second})
	g := s.groups[0]
	s.all(t0)
	if len(s.due(t0)) != 1 {
		t.Fatal("the first pass waited")
	}
	g.start()
	g.finish(1, true, t0)
	// Events every second: MIN never passes quietly, MAX fires at first+5s.
	for i := 0; i <= 6; i++ {
		s.event(timedEvent{keys: []string{"/a"}, rev: int64(10 + i), at: at(time.Duration(10+i) * time.Second)})
		now := at(time.Duration(10+i) * time.Second)
		due := len(s.due(now)) == 1
		if want := i >= 5; due != want {
			t.Fatalf("event %d at %s: due %v, want %v", i, now, due, want)
		}
		if due {
			break
		}
	}
	g.start()
	g.finish(20, true, at(15*time.Second))
	// One event, then quiet: due at exactly +MIN, and next() says so.
	s.event(timedEvent{keys: []string{"/a"}, rev: 21, at: at(20 * time.Second)})
	if len(s.due(at(21*time.Second))) != 0 {
		t.Fatal("due before MIN")
	}
	if next, ok := s.next(); !ok || !next.Equal(at(22*time.Second)) {
		t.Fatalf("next = %v, %v; want +22s", next, ok)
	}
	if len(s.due(at(22*time.Second))) != 1 {
		t.Fatal("not due at MIN")
	}
	// An event during the pass gives exactly one more pass.
	g.start()
	s.event(timedEvent{keys: []string{"/a"}, rev: 23, at: at(22 * time.Second)})
	g.finish(22, true, at(23*time.Second))
	if len(s.due(at(24*time.Second))) != 1 {
		t.Fatal("event during the pass dropped")
	}
	g.start()
	g.finish(23, true, at(24*time.Second))
	if _, ok := s.next(); ok {
		t.Fatal("a second extra pass is owed")
	}
}

// TestResourceWaitOverridesDefault: a resource's own wait wins.
func TestResourceWaitOverridesDefault(t *testing.T) {
	own := waitspec.Spec{Min: time.Second, Max: time.Second}
	s := newSched([]Processor{&fakeProc{name: "a", keys: []string{"/a"}, wait: &own}}, waitspec.Spec{Min: time.Minute, Max: time.Hour})
	if s.groups[0].wait != own {
		t.Fatalf("wait = %v, want %v", s.groups[0].wait, own)
	}
}

// TestRetriesListen: a failed group retries on backoff, and sooner on a
// new event for its keys.
func TestRetriesListen(t *testing.T) {
	s := newSched([]Processor{&fakeProc{name: "a", keys: []string{"/a"}}}, waitspec.Spec{})
	g := s.groups[0]
	g.start()
	g.finish(1, false, t0)
	g.start()
	g.finish(1, false, at(time.Second)) // second failure: backoff 1s
	if next, _ := s.next(); !next.Equal(at(2 * time.Second)) {
		t.Fatalf("retry at %v, want +2s", next)
	}
	s.event(timedEvent{keys: []string{"/a"}, rev: 2, at: at(1100 * time.Millisecond)})
	if len(s.due(at(1100*time.Millisecond))) != 1 {
		t.Fatal("an event did not retry the failed group at once")
	}
	g.start()
	g.finish(2, true, at(1200*time.Millisecond))
	if _, ok := s.next(); ok {
		t.Fatal("still owed after success")
	}
}

// fakeWatch is a WatchStore whose revision and events the test sets.
type fakeWatch struct {
	mu       sync.Mutex
	rev      int64
	starts   []int64
	watching chan chan backends.WatchEvent // one per Watch call
	errs     chan error
}

func (f *fakeWatch) GetValues(context.Context, []string) (map[string]string, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return map[string]string{}, f.rev, nil
}

func (f *fakeWatch) Diagnose(context.Context) error { return nil }

func (f *fakeWatch) Revision(context.Context, string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rev, nil
}

func (f *fakeWatch) setRev(r int64) {
	f.mu.Lock()
	f.rev = r
	f.mu.Unlock()
}

func (f *fakeWatch) Watch(ctx context.Context, _ []string, after int64, fn func(backends.WatchEvent)) error {
	f.mu.Lock()
	f.starts = append(f.starts, after)
	f.mu.Unlock()
	ch := make(chan backends.WatchEvent)
	f.watching <- ch
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-f.errs:
			return err
		case ev := <-ch:
			fn(ev)
		}
	}
}

// TestRunRoutesRestoresAndCompactions drives Run with a fake etcd: the
// group renders in file-name order at start, on an event, and after a
// restore (revision lower than processed) the watch resumes from etcd's
// new revision after a full re-read.
func TestRunRoutesRestoresAndCompactions(t *testing.T) {
	var mu sync.Mutex
	var passes []string
	f := &fakeWatch{rev: 10, watching: make(chan chan backends.WatchEvent), errs: make(chan error)}
	procs := []Processor{
		&fakeProc{name: "20-flags", keys: []string{"/k"}, log: &passes, mu: &mu},
		&fakeProc{name: "10-bundle", keys: []string{"/k"}, log: &passes, mu: &mu},
		&fakeProc{name: "30-other", keys: []string{"/o"}, log: &passes, mu: &mu},
	}
	log, hook := test.NewNullLogger()
	d := New(Options{Load: func(bool) Plan { return Plan{Procs: procs} }, Store: f, Watch: f, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	waitPasses := func(n int) []string {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			mu.Lock()
			if len(passes) >= n {
				got := append([]string(nil), passes...)
				passes = nil
				mu.Unlock()
				return got
			}
			mu.Unlock()
			select {
			case <-deadline:
				t.Fatalf("passes %v, want %d", passes, n)
			case <-time.After(time.Millisecond):
			}
		}
	}
	w := <-f.watching
	// 30-other is a group of its own, processed beside the other one.
	inOrder := func(got []string) bool {
		return len(got) == 3 && slices.Contains(got, "30-other") &&
			slices.Equal(slices.DeleteFunc(got, func(n string) bool { return n == "30-other" }), []string{"10-bundle", "20-flags"})
	}
	if got := waitPasses(3); !inOrder(got) {
		t.Fatalf("first passes %v", got)
	}
	f.setRev(12)
	w <- backends.WatchEvent{Keys: []string{"/k/m1"}, Revision: 12, Resume: 12}
	if got := waitPasses(2); !slices.Equal(got, []string{"10-bundle", "20-flags"}) {
		t.Fatalf("passes after /k event %v", got)
	}
	// A restore: etcd comes back at revision 5.
	f.setRev(5)
	f.errs <- errors.New("connection lost")
	w = <-f.watching
	if got := waitPasses(3); !inOrder(got) {
		t.Fatalf("passes after restore %v", got)
	}
	// Revision 6 after the restore is new, though lower than 12.
	f.setRev(6)
	w <- backends.WatchEvent{Keys: []string{"/o/x"}, Revision: 6, Resume: 6}
	if got := waitPasses(1); !slices.Equal(got, []string{"30-other"}) {
		t.Fatalf("passes after post-restore event %v", got)
	}
	f.mu.Lock()
	starts := append([]int64(nil), f.starts...)
	f.mu.Unlock()
	if !slices.Equal(starts, []int64{10, 5}) {
		t.Errorf("watch starts %v, want [10 5]", starts)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var broke, back, restored bool
	for _, e := range hook.AllEntries() {
		broke = broke || strings.HasPrefix(e.Message, "etcd watch broken")
		back = back || strings.HasPrefix(e.Message, "etcd watch back")
		restored = restored || strings.Contains(e.Message, "lower than revision 12")
	}
	if !broke || !back || !restored {
		t.Errorf("logged broken %v, back %v, restore %v", broke, back, restored)
	}
}

// TestNothingToProcess: Run refuses to idle with no resource.
func TestNothingToProcess(t *testing.T) {
	log, _ := test.NewNullLogger()
	d := New(Options{Load: func(bool) Plan { return Plan{} }, Log: log, Interval: time.Second})
	if err := d.Run(context.Background()); !errors.Is(err, ErrNothingToProcess) {
		t.Fatalf("Run = %v, want ErrNothingToProcess", err)
	}
}

// gatedProc is a resource whose Process waits at a gate, to see how many
// passes run at once.
type gatedProc struct {
	fakeProc
	dest string
	in   func() // called as Process starts
	gate <-chan struct{}
	out  func()
}

func (p *gatedProc) Destination() string { return p.dest }

func (p *gatedProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	p.in()
	defer p.out()
	select {
	case <-p.gate:
	case <-ctx.Done():
		return apply.Result{}, ctx.Err()
	}
	return p.fakeProc.Process(ctx, g)
}

// TestIndependentGroupsRunConcurrently: groups that share neither keys nor
// a destination are processed at once, at most maxParallel at a time, while
// resources that write one file stay one group.
func TestIndependentGroupsRunConcurrently(t *testing.T) {
	const n = 3 * maxParallel
	var mu sync.Mutex
	running, most := 0, 0
	full := make(chan struct{}) // closed when maxParallel passes run at once
	gate := make(chan struct{})
	in := func() {
		mu.Lock()
		defer mu.Unlock()
		running++
		most = max(most, running)
		if running == maxParallel && most == running {
			select {
			case <-full:
			default:
				close(full)
			}
		}
	}
	out := func() { mu.Lock(); running--; mu.Unlock() }
	var procs []Processor
	for i := 0; i < n; i++ {
		procs = append(procs, &gatedProc{
			fakeProc: fakeProc{name: fmt.Sprintf("r%02d", i), keys: []string{fmt.Sprintf("/k%02d", i)}},
			dest:     fmt.Sprintf("/out/%02d", i),
			gate:     gate, in: in, out: out,
		})
	}
	// Two resources on other keys that write one file: one group.
	procs = append(procs,
		&gatedProc{fakeProc: fakeProc{name: "x1", keys: []string{"/x1"}}, dest: "/out/same", gate: gate, in: in, out: out},
		&gatedProc{fakeProc: fakeProc{name: "x2", keys: []string{"/x2"}}, dest: "/out/same", gate: gate, in: in, out: out})
	s := newSched(procs, waitspec.Spec{})
	if len(s.groups) != n+1 {
		t.Fatalf("%d groups, want %d (x1 and x2 write one file)", len(s.groups), n+1)
	}
	f := &fakeWatch{rev: 1}
	log, _ := test.NewNullLogger()
	obs := &countingObserver{processed: make(chan string, len(procs))}
	d := New(Options{Load: func(bool) Plan { return Plan{Procs: procs} }, Store: f, Log: log, Interval: time.Hour, Observer: obs})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-full:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d passes never ran at once (one at a time?)", maxParallel)
	}
	close(gate)
	for range procs {
		<-obs.processed
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if most != maxParallel {
		t.Errorf("at most %d passes ran at once, want %d", most, maxParallel)
	}
}

// countingObserver passes on the resources processed.
type countingObserver struct {
	NopObserver
	processed chan string
}

func (o *countingObserver) Processed(name string, _ apply.Result, _ error, _ bool) {
	o.processed <- name
}

// TestSnapshotServesEachMemberItsKeys: a group's one read, served to each
// member as the keys under its own (as paths), in a list of its own.
func TestSnapshotServesEachMemberItsKeys(t *testing.T) {
	snap := snapshot{rev: 7, pairs: []memkv.KVPair{{Key: "/a", Value: "1"}, {Key: "/a/x", Value: "2"}, {Key: "/ab", Value: "3"}, {Key: "/b", Value: "4"}}}
	got, rev, _ := snap.GetPairs(context.Background(), []string{"/a"})
	if rev != 7 || !slices.Equal(got, []memkv.KVPair{{Key: "/a", Value: "1"}, {Key: "/a/x", Value: "2"}}) {
		t.Fatalf("GetPairs(/a) = %v at %d", got, rev)
	}
	got[0].Key = "/changed"
	if snap.pairs[0].Key != "/a" {
		t.Fatal("a member's list shares the group's")
	}
	vals, _, _ := snap.GetValues(context.Background(), []string{"/b", "/ab"})
	if len(vals) != 2 || vals["/b"] != "4" || vals["/ab"] != "3" {
		t.Fatalf("GetValues(/b, /ab) = %v", vals)
	}
}

// fixedNow stands still at t0: every arrival and every replacement is
// then timed exactly.
func fixedNow() time.Time { return t0 }

// landingObserver records what Landed is told.
type landingObserver struct {
	NopObserver
	landed chan time.Duration
}

func (o landingObserver) Landed(d time.Duration) { o.landed <- d }

// replacingProc replaces its file on every pass, 1.5 s after t0.
type replacingProc struct {
	fakeProc
	passes chan struct{}
}

func (p *replacingProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	_, rev, err := g.GetValues(ctx, p.keys)
	p.passes <- struct{}{}
	return apply.Result{Revision: rev, Changed: true, Replaced: t0.Add(1500 * time.Millisecond)}, err
}

// TestLandedTimesChangesFromTheirArrival: a pass owed to a change the watch
// delivered reports, per file replaced, the time from the change's arrival
// to the replacement; the start-up pass, owed to no change, reports none.
func TestLandedTimesChangesFromTheirArrival(t *testing.T) {
	f := &fakeWatch{rev: 10, watching: make(chan chan backends.WatchEvent), errs: make(chan error)}
	p := &replacingProc{fakeProc: fakeProc{name: "a", keys: []string{"/k"}}, passes: make(chan struct{}, 10)}
	obs := landingObserver{landed: make(chan time.Duration, 10)}
	log, _ := test.NewNullLogger()
	d := New(Options{Load: func(bool) Plan { return Plan{Procs: []Processor{p}} }, Store: f, Watch: f, Log: log,
		Observer: obs, Now: fixedNow})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	defer stop()

	w := <-f.watching
	<-p.passes // start-up
	f.setRev(11)
	w <- backends.WatchEvent{Keys: []string{"/k/a"}, Revision: 11, Resume: 11}
	<-p.passes
	select {
	case got := <-obs.landed:
		if got != 1500*time.Millisecond {
			t.Errorf("Landed(%s), want 1.5s: the change arrived at t0, the file was replaced at t0+1.5s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Landed for a pass owed to a change")
	}
	stop() // every pass has reported
	if n := len(obs.landed); n != 0 {
		t.Errorf("%d more Landed calls: the start-up pass was timed", n)
	}
}
