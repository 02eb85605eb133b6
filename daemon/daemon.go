// Package daemon is confd's scheduling policy: which resources to process
// when. -onetime processes everything once; -watch follows one etcd watch
// stream, routes each change to the groups of resources whose keys it
// touches, waits for quiescence, retries failures with backoff and at once
// on a new event, and re-reads everything after a restore, a compaction, a
// SIGHUP or every -resync; -interval re-reads conf.d and processes
// everything every interval. The write path itself is resource's.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kelseyhightower/memkv"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
	"github.com/keysync/confd/resource"
)

// Processor is one template resource as the daemon drives it;
// *resource.Resource is one.
type Processor interface {
	Name() string // the resource file: orders resources and names them
	StoreKeys() []string
	Quiescence() (waitspec.Spec, bool) // the resource's own wait, if set
	ReloadPending() bool
	Process(ctx context.Context, store resource.Getter) (resource.Result, error)
}

// WatchStore is a store that can be watched (etcd).
type WatchStore interface {
	resource.Getter
	Revision(ctx context.Context, key string) (int64, error)
	Watch(ctx context.Context, keys []string, afterRev int64, fn func(backends.WatchEvent)) error
}

// Diagnoser names the cause of a failing connection (an expired client
// certificate, a refused handshake); a WatchStore may offer it.
type Diagnoser interface {
	Diagnose(ctx context.Context) error
}

// Plan is what a (re-)load of the configuration yields.
type Plan struct {
	Procs  []Processor
	Wait   waitspec.Spec // default quiescence; a resource's own wait wins
	Resync time.Duration // full reconcile every Resync; 0: never
	// Keep: nothing could be re-read (the loader logged why); everything
	// stays as it was.
	Keep bool
}

// ErrNothingToProcess is returned by Run when no resource loaded.
var ErrNothingToProcess = errors.New("nothing to process")

// Clock is time as the daemon sees it.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Options configure a Daemon.
type Options struct {
	// Load reads the resources and settings; it is called at start, on
	// Reload (SIGHUP, full: confd.toml too) and, in interval mode, before
	// every pass. It logs what failed to load.
	Load  func(full bool) Plan
	Store resource.Getter
	// Watch, when set, selects watch mode; otherwise Interval mode.
	Watch    WatchStore
	Interval time.Duration
	Log      logrus.FieldLogger
	Observer Observer // nil: none
	Clock    Clock    // nil: the real one
	// Commands is the context resources run under. It outlives Run's: the
	// first SIGTERM stops new passes, and only the second (ending
	// Commands) cuts a running command short.
	Commands context.Context
}

// Daemon runs passes until its context ends.
type Daemon struct {
	o    Options
	hup  chan struct{}
	wake chan struct{}
}

// New returns a daemon; Run starts it.
func New(o Options) *Daemon {
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Commands == nil {
		o.Commands = context.Background()
	}
	return &Daemon{o: o, hup: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
}

// Reload asks Run to re-read the configuration and process everything
// (SIGHUP); unchanged files are left alone by resource.
func (d *Daemon) Reload() {
	select {
	case d.hup <- struct{}{}:
	default:
	}
}

// Run processes until ctx ends: no new pass starts after that, a running
// one finishes (see Options.Commands). It returns ErrNothingToProcess when
// the first load finds no resource.
func (d *Daemon) Run(ctx context.Context) error {
	log, clock := d.o.Log, d.o.Clock
	plan := d.o.Load(true)
	if len(plan.Procs) == 0 {
		return ErrNothingToProcess
	}
	if d.o.Watch == nil {
		plan.Resync = d.o.Interval
	}
	s := newSched(plan.Procs, plan.Wait)
	s.all(clock.Now())
	var w *watcher
	if d.o.Watch != nil {
		w = newWatcher(d.o.Watch, log, d.o.Observer, clock, d.signal)
		// The watch starts at the revision etcd had before the first
		// reads, so that nothing between a read and the watch is missed.
		// If etcd cannot say now, the watcher re-reads all once it can.
		if keys := s.keys(); len(keys) > 0 {
			if rev, err := d.o.Watch.Revision(ctx, keys[0]); err == nil {
				w.pos, w.current = rev, rev
			}
		}
		w.start(ctx, s.keys())
		defer w.stop()
	}
	resyncAt := clock.Now().Add(plan.Resync)
	wasReady := false
	for {
		if w != nil {
			w.apply(s)
		}
		if ctx.Err() != nil {
			return nil
		}
		now := clock.Now()
		if plan.Resync > 0 && !now.Before(resyncAt) {
			if d.o.Watch == nil {
				// confd 0.16 re-read conf.d before every interval pass.
				if p := d.o.Load(false); len(p.Procs) > 0 {
					p.Resync = plan.Resync
					s, plan = carry(s, p), p
				}
			} else {
				log.Infof("Periodic full reconcile (-resync %s)", plan.Resync)
			}
			s.all(now)
			resyncAt = now.Add(plan.Resync)
		}
		due := s.due(now)
		d.passes(ctx, s, due)
		if len(due) > 0 {
			d.report(s, w, &wasReady)
			continue
		}
		d.report(s, w, &wasReady)
		var timer <-chan time.Time
		next, ok := s.next()
		if plan.Resync > 0 && (!ok || resyncAt.Before(next)) {
			next, ok = resyncAt, true
		}
		if ok {
			timer = clock.After(next.Sub(now))
		}
		select {
		case <-ctx.Done():
		case <-d.wake:
		case <-timer:
		case <-d.hup:
			p := d.o.Load(true)
			if p.Keep {
				continue
			}
			if len(p.Procs) == 0 {
				log.Error("SIGHUP: no template resource loaded; keeping the previous ones")
				continue
			}
			if d.o.Watch == nil {
				p.Resync = d.o.Interval
			}
			log.Infof("SIGHUP: configuration re-read, %d resources; processing them all", len(p.Procs))
			s, plan = carry(s, p), p
			s.all(clock.Now())
			resyncAt = clock.Now().Add(plan.Resync)
			if w != nil {
				w.restart(ctx, s.keys())
			}
		}
	}
}

// carry builds the schedule for a new plan, keeping what the old one knew
// of resources that are still there (the revision read, readiness).
func carry(old *sched, p Plan) *sched {
	s := newSched(p.Procs, p.Wait)
	known := map[string]*group{}
	for _, g := range old.groups {
		for _, m := range g.members {
			known[m.Name()] = g
		}
	}
	for _, g := range s.groups {
		g.rendered = true
		for _, m := range g.members {
			o, ok := known[m.Name()]
			g.rendered = g.rendered && ok && o.rendered
		}
	}
	return s
}

func (d *Daemon) signal() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// maxParallel is how many groups are processed at once.
const maxParallel = 8

// passes processes the due groups, up to maxParallel at once. Groups share
// no keys and no destination (newSched), so their order is no one's
// contract (confd 0.16 ran every resource at once), and what a pass mostly
// does is wait: on etcd, on fsync, on commands. At start-up with 1000
// resources the waits overlap instead of adding up. Members of one group
// still go one after another, in file-name order. After ctx ends no
// further group starts.
func (d *Daemon) passes(ctx context.Context, s *sched, due []*group) {
	if len(due) == 1 {
		d.pass(ctx, s, due[0])
		return
	}
	slots := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for _, g := range due {
		slots <- struct{}{}
		if ctx.Err() != nil {
			<-slots
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			d.pass(ctx, s, g)
		}()
	}
	wg.Wait()
}

// pass reads g's keys once, or takes them from what it follows of the
// watch, and processes its members in file-name order. After ctx ends no
// further member starts. Passes of other groups run beside it: it touches
// only g, and s's budget.
func (d *Daemon) pass(ctx context.Context, s *sched, g *group) {
	// A pass owed to changes the watch delivered (not start-up, SIGHUP,
	// resync or a retry alone) times them from the first one's arrival.
	byChange, changedAt := g.dirty && !g.immediate, g.first
	mustRead := g.start()
	var snap snapshot
	var err error
	fromWatch := g.fed.on && !mustRead
	d.o.Observer.Snapshot(fromWatch)
	if fromWatch {
		snap = snapshot{pairs: g.fed.pairs, rev: g.fed.rev}
	} else {
		gen := s.gen // before the read: see follow
		snap.pairs, snap.rev, err = resource.GetPairs(d.o.Commands, d.o.Store, g.keys)
		if err == nil {
			snap.pairs = g.fed.start(snap.pairs, snap.rev, gen, s.budget)
		} else {
			g.fed.drop(s.budget)
		}
	}
	rev := snap.rev
	if err != nil {
		err = fmt.Errorf("%s: read keys: %w", names(g), err)
		d.o.Log.Error(err.Error())
		for _, m := range g.members {
			d.o.Observer.Processed(m.Name(), resource.Result{}, err, m.ReloadPending())
		}
		g.finish(0, false, d.o.Clock.Now())
		return
	}
	ok := true
	for _, m := range g.members {
		if ctx.Err() != nil {
			d.o.Log.Warnf("%s: not processed: confd is stopping", m.Name())
			ok = false
			break
		}
		res, err := m.Process(d.o.Commands, snap)
		if err != nil {
			d.o.Log.Error(err.Error())
			ok = false
		}
		if byChange && !res.Replaced.IsZero() {
			d.o.Observer.Landed(max(res.Replaced.Sub(changedAt), 0))
		}
		d.o.Observer.Processed(m.Name(), res, err, m.ReloadPending())
	}
	g.finish(rev, ok, d.o.Clock.Now())
	if !ok {
		at, _ := g.readyAt()
		d.o.Log.Warnf("%s: will retry in %s, or at once on a change of its keys", names(g), at.Sub(d.o.Clock.Now()).Round(time.Millisecond))
	}
}

// report publishes readiness: every resource rendered since start and,
// in watch mode, the watch live.
func (d *Daemon) report(s *sched, w *watcher, was *bool) {
	ready := true
	processed := int64(-1)
	for _, g := range s.groups {
		ready = ready && g.rendered
		if processed < 0 || g.rev < processed {
			processed = g.rev
		}
	}
	if w != nil {
		ready = ready && w.isUp()
		d.o.Observer.Revisions(processed, w.currentRevision())
	}
	if ready != *was {
		d.o.Observer.Ready(ready)
		*was = ready
	}
}

func names(g *group) string {
	ns := make([]string, len(g.members))
	for i, m := range g.members {
		ns[i] = m.Name()
	}
	return strings.Join(ns, ", ")
}

// snapshot serves each member of a group its keys from the group's one read.
type snapshot struct {
	pairs []memkv.KVPair // as the store gave them
	rev   int64
}

// GetPairs is a fresh list (members index theirs in place) of the pairs
// under keys.
func (s snapshot) GetPairs(_ context.Context, keys []string) ([]memkv.KVPair, int64, error) {
	out := make([]memkv.KVPair, 0, len(s.pairs))
	for _, kv := range s.pairs {
		if underAny(kv.Key, keys) {
			out = append(out, kv)
		}
	}
	return out, s.rev, nil
}

func (s snapshot) GetValues(ctx context.Context, keys []string) (map[string]string, int64, error) {
	pairs, rev, _ := s.GetPairs(ctx, keys)
	out := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		out[kv.Key] = kv.Value
	}
	return out, rev, nil
}

// Once processes every resource in file-name order and returns every
// failure joined, one error per failed resource. Resources that share keys
// (a group, as in Run) take them from one read, at one revision, made when
// the first of them is processed: a flags file and the bundle it names
// never come from two revisions. A resource alone in its group reads for
// itself, as confd 0.16 did for every resource. Once ctx ends no further
// resource starts.
func Once(ctx context.Context, rs []Processor, store resource.Getter, log logrus.FieldLogger) error {
	var errs []error
	fail := func(err error) {
		log.Error(err.Error())
		errs = append(errs, err)
	}
	s := newSched(rs, waitspec.Spec{})
	groupOf := map[string]*group{}
	left := map[*group]int{} // members not yet processed
	for _, g := range s.groups {
		for _, m := range g.members {
			groupOf[m.Name()] = g
		}
		left[g] = len(g.members)
	}
	type read struct {
		snap snapshot
		err  error
	}
	reads := map[*group]read{} // held until the group's last member is done
	rs = append([]Processor(nil), rs...)
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].Name() < rs[j].Name() })
	for _, r := range rs {
		if ctx.Err() != nil {
			fail(fmt.Errorf("%s: not processed: confd is stopping", r.Name()))
			continue
		}
		g := groupOf[r.Name()]
		if len(g.members) == 1 {
			if _, err := r.Process(ctx, store); err != nil {
				fail(err)
			}
			continue
		}
		rd, ok := reads[g]
		if !ok {
			rd.snap.pairs, rd.snap.rev, rd.err = resource.GetPairs(ctx, store, g.keys)
			if rd.err != nil {
				rd.err = fmt.Errorf("read keys: %w", rd.err)
			}
			reads[g] = rd
		}
		if rd.err != nil {
			fail(fmt.Errorf("%s: %w", r.Name(), rd.err))
		} else if _, err := r.Process(ctx, rd.snap); err != nil {
			fail(err)
		}
		if left[g]--; left[g] == 0 {
			delete(reads, g)
		}
	}
	return errors.Join(errs...)
}

// Observer is told what the daemon does, for metrics and readiness. Its
// methods are called concurrently: by passes of independent groups and by
// the watch.
type Observer interface {
	Processed(resource string, res resource.Result, err error, reloadPending bool)
	WatchUp(up bool)
	WatchReconnect()
	// Snapshot: a group's pass took its keys from a read of etcd, or
	// from what it follows of the watch (fromWatch).
	Snapshot(fromWatch bool)
	Revisions(processed, current int64)
	Ready(ready bool)
	// Landed: a change the watch delivered is in place in a destination it
	// changed, d after it arrived (quiescence and check_cmd included).
	Landed(d time.Duration)
}

// Observers fans out to several observers.
func Observers(os ...Observer) Observer {
	if len(os) == 0 {
		return nopObserver{}
	}
	return multi(os)
}

type multi []Observer

func (m multi) Processed(r string, res resource.Result, err error, p bool) {
	for _, o := range m {
		o.Processed(r, res, err, p)
	}
}
func (m multi) WatchUp(up bool) {
	for _, o := range m {
		o.WatchUp(up)
	}
}
func (m multi) WatchReconnect() {
	for _, o := range m {
		o.WatchReconnect()
	}
}
func (m multi) Snapshot(w bool) {
	for _, o := range m {
		o.Snapshot(w)
	}
}
func (m multi) Revisions(p, c int64) {
	for _, o := range m {
		o.Revisions(p, c)
	}
}
func (m multi) Ready(r bool) {
	for _, o := range m {
		o.Ready(r)
	}
}
func (m multi) Landed(d time.Duration) {
	for _, o := range m {
		o.Landed(d)
	}
}

type nopObserver struct{}

func (nopObserver) Processed(string, resource.Result, error, bool) {}
func (nopObserver) WatchUp(bool)                                   {}
func (nopObserver) WatchReconnect()                                {}
func (nopObserver) Snapshot(bool)                                  {}
func (nopObserver) Revisions(int64, int64)                         {}
func (nopObserver) Ready(bool)                                     {}
func (nopObserver) Landed(time.Duration)                           {}
