package daemon

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/runner"
)

// heldProc stands for a resource whose reload_cmd runs until the test
// lets it end: each pass says it began on began (with the revision it
// read) and waits for one token on release.
type heldProc struct {
	fakeProc
	dest    string
	began   chan int64
	release chan struct{}
	running atomic.Int32 // passes of this resource running now
	most    atomic.Int32
}

func newHeld(name, key string) *heldProc {
	return &heldProc{fakeProc: fakeProc{name: name, keys: []string{key}}, dest: "/out/" + name,
		began: make(chan int64, 100), release: make(chan struct{}, 100)}
}

func (p *heldProc) Destination() string { return p.dest }

func (p *heldProc) Process(ctx context.Context, g apply.Getter) (apply.Result, error) {
	n := p.running.Add(1)
	defer p.running.Add(-1)
	for m := p.most.Load(); n > m && !p.most.CompareAndSwap(m, n); m = p.most.Load() {
	}
	_, rev, err := g.GetValues(ctx, p.keys)
	p.began <- rev
	select {
	case <-p.release:
	case <-ctx.Done():
	}
	return apply.Result{Revision: rev}, err
}

// next awaits p's next pass and returns the revision it read.
func (p *heldProc) next(t *testing.T) int64 {
	t.Helper()
	select {
	case rev := <-p.began:
		return rev
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no pass", p.name)
		return 0
	}
}

// runWatching runs a daemon over procs with a fake etcd at revision 10
// until the test ends (every held pass released), and returns the etcd
// and its first watch stream.
func runWatching(t *testing.T, obs Observer, procs ...Processor) (*Daemon, *fakeWatch, chan backends.WatchEvent) {
	t.Helper()
	// Streams after the first (a SIGHUP opens one) are not listened to.
	f := &fakeWatch{rev: 10, watching: make(chan chan backends.WatchEvent, 10), errs: make(chan error)}
	log, _ := test.NewNullLogger()
	d := New(Options{Load: func(bool) Plan { return Plan{Procs: procs} }, Store: f, Watch: f, Log: log, Observer: obs})
	if lo, ok := obs.(*loopObserver); ok {
		lo.d.Store(d) // before Run: every state the loop publishes is seen
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for _, p := range procs {
			if h, ok := p.(*heldProc); ok {
				close(h.release)
			}
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return d, f, <-f.watching
}

// put is a change of key at rev, as the watch delivers it.
func put(f *fakeWatch, w chan backends.WatchEvent, key string, rev int64) {
	f.setRev(rev)
	w <- backends.WatchEvent{Keys: []string{key}, Revision: rev, Resume: rev}
}

// TestASlowGroupDelaysNoOther: while a's pass runs (its reload, say,
// restarting kube-apiserver), a change of b's keys is processed; a's pass
// is not waited for.
func TestASlowGroupDelaysNoOther(t *testing.T) {
	a, b := newHeld("a", "/a"), newHeld("b", "/b")
	b.release <- struct{}{}
	_, f, w := runWatching(t, nil, a, b)
	a.next(t) // a's start-up pass runs, and is not released
	b.next(t)
	b.release <- struct{}{}
	put(f, w, "/b/x", 11)
	if rev := b.next(t); rev != 11 {
		t.Fatalf("b's pass read revision %d, want 11", rev)
	}
	if a.running.Load() != 1 {
		t.Fatal("a's pass is no longer running: b was not shown to pass it")
	}
}

// TestChangesCoalesceWhileAPassRuns: a thousand changes of a's keys during
// its running pass are one pass after it, at the newest revision; the
// loop keeps routing them meanwhile (b, whose change came last, is
// processed before a's pass ends).
func TestChangesCoalesceWhileAPassRuns(t *testing.T) {
	a, b := newHeld("a", "/a"), newHeld("b", "/b")
	b.release <- struct{}{}
	b.release <- struct{}{}
	obs := &loopObserver{revs: make(chan [2]int64, 10000)}
	_, f, w := runWatching(t, obs, a, b)
	a.next(t)
	b.next(t)
	for rev := int64(11); rev <= 1010; rev++ {
		put(f, w, "/a/x", rev)
	}
	put(f, w, "/b/x", 1011)
	if rev := b.next(t); rev != 1011 {
		t.Fatalf("b read %d, want 1011", rev)
	}
	a.release <- struct{}{}
	if rev := a.next(t); rev != 1011 {
		t.Fatalf("a's pass after the burst read %d, want the newest, 1011", rev)
	}
	a.release <- struct{}{}
	// Once both groups recorded 1011, the loop has dispatched whatever was
	// owed: a third pass of a would be running.
	for {
		select {
		case r := <-obs.revs:
			if r[0] < 1011 {
				continue
			}
			if r[1] != 0 {
				t.Fatalf("%d passes run after a's second: the burst was not one pass", r[1])
			}
			return
		case <-time.After(10 * time.Second):
			t.Fatal("revision 1011 never recorded as processed")
		}
	}
}

// loopObserver records, as Run's loop publishes them, the revision every
// group processed and how many passes run then.
type loopObserver struct {
	NopObserver
	d    atomic.Pointer[Daemon]
	revs chan [2]int64
}

func (o *loopObserver) Revisions(processed, _ int64) {
	if d := o.d.Load(); d != nil {
		o.revs <- [2]int64{processed, int64(d.running)} // the loop's goroutine: d.running is its
	}
}

// TestSIGHUPDuringAPass: a SIGHUP while a's pass runs is applied at once
// (b, re-read, is processed again) but a's pass of the new configuration
// waits for the old one to end: never two passes of one resource at once.
func TestSIGHUPDuringAPass(t *testing.T) {
	a, b := newHeld("a", "/a"), newHeld("b", "/b")
	b.release <- struct{}{}
	obs := &loopObserver{revs: make(chan [2]int64, 10000)}
	d, _, _ := runWatching(t, obs, a, b)
	a.next(t)
	b.next(t)
	runningNow := func(want func(int64) bool) int64 {
		t.Helper()
		for {
			select {
			case r := <-obs.revs:
				if want(r[1]) {
					return r[1]
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the loop never published the state awaited")
			}
		}
	}
	runningNow(func(n int64) bool { return n == 1 }) // b's start-up pass ended; a's runs
	d.Reload()
	b.next(t) // SIGHUP processes everything: b at once (and its pass is held open)
	// The loop dispatched all it would on the SIGHUP: a's old pass, b's new one.
	if n := runningNow(func(n int64) bool { return n >= 2 }); n != 2 {
		t.Fatalf("%d passes run after the SIGHUP, want 2: a's new pass did not wait for its old one", n)
	}
	a.release <- struct{}{}
	a.next(t) // a's pass of the new configuration, after the old one
	a.release <- struct{}{}
	b.release <- struct{}{}
	if m := a.most.Load(); m != 1 {
		t.Fatalf("%d passes of a ran at once", m)
	}
}

// fakeRunner is a command that runs until released, counting overlap.
type fakeRunner struct {
	started chan struct{}
	release chan struct{}
	running atomic.Int32
	most    atomic.Int32
}

func (r *fakeRunner) Run(ctx context.Context, _ runner.Spec) runner.Result {
	n := r.running.Add(1)
	defer r.running.Add(-1)
	for m := r.most.Load(); n > m && !r.most.CompareAndSwap(m, n); m = r.most.Load() {
	}
	r.started <- struct{}{}
	<-r.release
	return runner.Result{}
}

// TestLimitsBoundCommands: ten commands wanted at once run three at a
// time; a waiting one gives up, unstarted, when confd begins to stop.
func TestLimitsBoundCommands(t *testing.T) {
	fr := &fakeRunner{started: make(chan struct{}, 10), release: make(chan struct{})}
	stop := make(chan struct{})
	log, hook := test.NewNullLogger()
	l := NewLimits(3, stop, log)
	run := l.Runner(fr.Run)
	var wg sync.WaitGroup
	results := make(chan runner.Result, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); results <- run(context.Background(), runner.Spec{}) }()
	}
	for i := 0; i < 3; i++ {
		<-fr.started
	}
	// Seven wait: each says so.
	for deadline := time.Now().Add(10 * time.Second); countMsg(hook, "waits for its turn") < 7; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d commands said they wait, want 7", countMsg(hook, "waits for its turn"))
		}
	}
	for i := 0; i < 4; i++ { // four more run, one after another ends
		fr.release <- struct{}{}
		<-fr.started
	}
	close(stop) // three still wait: they give up
	stopped := 0
	for i := 0; i < 7; i++ {
		if r := <-results; errors.Is(r.Err, errStopping) {
			stopped++
		}
	}
	if stopped != 3 {
		t.Errorf("%d waiting commands gave up on stop, want 3", stopped)
	}
	close(fr.release)
	wg.Wait()
	if m := fr.most.Load(); m != 3 {
		t.Errorf("at most %d commands ran at once, want 3", m)
	}
}

func countMsg(hook *test.Hook, part string) int {
	n := 0
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, part) {
			n++
		}
	}
	return n
}

// TestAPassLendsItsSlotToItsCommand: with every pass slot held by a pass
// whose command runs, another pass still begins: long reloads hold
// command slots only.
func TestAPassLendsItsSlotToItsCommand(t *testing.T) {
	fr := &fakeRunner{started: make(chan struct{}, maxParallel), release: make(chan struct{})}
	log, _ := test.NewNullLogger()
	l := NewLimits(maxParallel, nil, log)
	run := l.Runner(fr.Run)
	var wg sync.WaitGroup
	for i := 0; i < maxParallel; i++ {
		pctx, release, ok := l.pass(context.Background(), context.Background())
		if !ok {
			t.Fatal("no pass slot")
		}
		wg.Add(1)
		go func() { defer wg.Done(); defer release(); run(pctx, runner.Spec{}) }()
	}
	for i := 0; i < maxParallel; i++ {
		<-fr.started
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, release, ok := l.pass(ctx, context.Background())
	if !ok {
		t.Fatalf("no pass slot while %d commands run: their passes kept theirs", maxParallel)
	}
	release()
	close(fr.release)
	wg.Wait()
	if n := len(l.passes); n != 0 {
		t.Errorf("%d pass slots still taken after every pass ended", n)
	}
}
