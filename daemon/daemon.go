// Package daemon is confd's scheduling policy: which resources to process
// when. -onetime processes everything once, one resource at a time in
// file-name order, as confd 0.16 did; -watch follows one etcd watch
// stream, routes each change to the groups of resources whose keys it
// touches, waits for quiescence, retries failures with backoff and at once
// on a new event, and re-reads everything after a restore, a compaction, a
// SIGHUP or every -resync; -interval re-reads conf.d and processes
// everything every interval. Groups are independent: each pass runs in a
// worker of its own, so a reload that takes 30 minutes delays no other
// group, and at most -max-commands commands run at once (Limits). The
// write path itself is apply's.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kelseyhightower/memkv"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/backends"
	"github.com/keysync/confd/internal/waitspec"
)

// Processor is one template resource as the daemon drives it;
// *resource.Resource is one.
type Processor interface {
	Name() string // the resource file: orders resources and names them
	StoreKeys() []string
	Quiescence() (waitspec.Spec, bool) // the resource's own wait, if set
	// Destination is the file it writes ("" when it does not say): groups
	// run concurrently, so two resources writing one file go in one group,
	// where file-name order decides which is left on it.
	Destination() string
	ReloadPending() bool
	Process(ctx context.Context, store apply.Getter) (apply.Result, error)
}

// WatchStore is a store that can be watched (etcd).
type WatchStore interface {
	apply.Getter
	Revision(ctx context.Context, key string) (int64, error)
	Watch(ctx context.Context, keys []string, afterRev int64, fn func(backends.WatchEvent)) error
	// Diagnose names the cause of a failing connection (an expired client
	// certificate, a refused handshake); nil when it finds none.
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

// Options configure a Daemon.
type Options struct {
	// Load reads the resources and settings; it is called at start, on
	// Reload (SIGHUP, full: confd.toml too) and, in interval mode, before
	// every pass. It logs what failed to load.
	Load  func(full bool) Plan
	Store apply.Getter
	// Watch, when set, selects watch mode; otherwise Interval mode.
	Watch    WatchStore
	Interval time.Duration
	Log      logrus.FieldLogger
	Observer Observer         // nil: none
	Now      func() time.Time // nil: time.Now
	// Commands is the context resources run under. It outlives Run's: the
	// first SIGTERM stops new passes, and only the second (ending
	// Commands) cuts a running command short.
	Commands context.Context
	// Limits bounds passes and commands at once; the resources' Runner
	// should be its Runner, so that a pass lends its slot while a command
	// runs. nil: DefaultMaxCommands, for this daemon alone.
	Limits *Limits
}

// Daemon runs passes until its context ends.
type Daemon struct {
	o    Options
	hup  chan struct{}
	wake chan struct{}

	// Run's loop alone touches these.
	reports  chan passReport // from the groups' workers
	running  int             // workers that have not reported their end
	retiring map[*group]bool // running groups of a configuration replaced
}

// New returns a daemon; Run starts it.
func New(o Options) *Daemon {
	if o.Observer == nil {
		o.Observer = NopObserver{}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Commands == nil {
		o.Commands = context.Background()
	}
	if o.Limits == nil {
		o.Limits = NewLimits(DefaultMaxCommands, nil, o.Log)
	}
	return &Daemon{o: o, hup: make(chan struct{}, 1), wake: make(chan struct{}, 1),
		reports: make(chan passReport), retiring: map[*group]bool{}}
}

// Reload asks Run to re-read the configuration and process everything
// (SIGHUP); unchanged files are left alone by resource.
func (d *Daemon) Reload() { poke(d.hup) }

// poke wakes ch's reader once, however often it is called meanwhile.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run processes until ctx ends: no new pass starts after that, and Run
// returns once the running ones finished (see Options.Commands). It
// returns ErrNothingToProcess when the first load finds no resource.
//
// Run's loop owns the schedule and never waits on a pass: each group's
// pass runs in a worker goroutine of its own (dispatch), which reports its
// read and its end back to the loop (settle). Meanwhile the loop goes on
// routing the watch's changes, re-reading the configuration on SIGHUP,
// resyncing and publishing readiness; a group's changes that arrive while
// its pass runs merge into one pending pass (sched.event), so that
// nothing queues however long a reload takes.
func (d *Daemon) Run(ctx context.Context) error {
	log, clock := d.o.Log, d.o.Now
	load := func(full bool) Plan {
		p := d.o.Load(full)
		if d.o.Watch == nil {
			p.Resync = d.o.Interval // a pass every interval is a resync
		}
		return p
	}
	plan := load(true)
	if len(plan.Procs) == 0 {
		return ErrNothingToProcess
	}
	s := newSched(plan.Procs, plan.Wait)
	s.all(clock())
	var w *watcher
	if d.o.Watch != nil {
		w = &watcher{store: d.o.Watch, log: log, obs: d.o.Observer, now: clock, notify: func() { poke(d.wake) }}
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
	// Passes still running when Run returns: let them finish and report.
	defer func() {
		for d.running > 0 {
			d.settle(s, <-d.reports)
		}
	}()
	resyncAt := clock().Add(plan.Resync)
	wasReady := false
	for {
		if w != nil {
			w.apply(s)
		}
		if ctx.Err() != nil {
			return nil
		}
		now := clock()
		if plan.Resync > 0 && !now.Before(resyncAt) {
			if d.o.Watch == nil {
				// confd 0.16 re-read conf.d before every interval pass.
				if p := load(false); len(p.Procs) > 0 {
					s, plan = d.regroup(s, p), p
				}
			} else {
				log.Infof("Periodic full reconcile (-resync %s)", plan.Resync)
			}
			s.all(now)
			resyncAt = now.Add(plan.Resync)
		}
		d.dispatch(ctx, s, now)
		d.report(s, w, &wasReady)
		var timer <-chan time.Time
		next, ok := s.next()
		if plan.Resync > 0 && (!ok || resyncAt.Before(next)) {
			next, ok = resyncAt, true
		}
		if ok {
			timer = time.After(next.Sub(now))
		}
		select {
		case <-ctx.Done():
		case <-d.wake:
		case <-timer:
		case r := <-d.reports:
			d.settle(s, r)
		case <-d.hup:
			p := load(true)
			if p.Keep {
				continue
			}
			if len(p.Procs) == 0 {
				log.Error("SIGHUP: no template resource loaded; keeping the previous ones")
				continue
			}
			log.Infof("SIGHUP: configuration re-read, %d resources; processing them all", len(p.Procs))
			s, plan = d.regroup(s, p), p
			s.all(clock())
			resyncAt = clock().Add(plan.Resync)
			if w != nil {
				// Other keys, from where the old watch stopped.
				w.stop()
				w.start(ctx, s.keys())
			}
		}
	}
}

// regroup replaces old with the schedule of a new plan; a new group is
// rendered (readiness) when all its resources were already.
// Old groups whose pass still runs retire: they finish, but their results
// no longer count, and each new group on one of their resources or files
// is held until they have (hold), so that no two passes ever write one
// file at once.
func (d *Daemon) regroup(old *sched, p Plan) *sched {
	s := newSched(p.Procs, p.Wait)
	known := map[string]*group{}
	for _, g := range old.groups {
		for _, m := range g.members {
			known[m.Name()] = g
		}
		if g.busy {
			d.retiring[g] = true
		}
	}
	for _, g := range s.groups {
		g.rendered = true
		for _, m := range g.members {
			o, ok := known[m.Name()]
			g.rendered = g.rendered && ok && o.rendered
		}
	}
	d.hold(s)
	return s
}

// hold marks the groups of s that share a resource or a destination with
// a retiring group still running.
func (d *Daemon) hold(s *sched) {
	covered := map[string]bool{}
	for g := range d.retiring {
		for i, m := range g.members {
			covered["r:"+m.Name()] = true
			if dest := g.dests[i]; dest != "" {
				covered["d:"+dest] = true
			}
		}
	}
	for _, g := range s.groups {
		g.held = false
		for i, m := range g.members {
			g.held = g.held || covered["r:"+m.Name()] || covered["d:"+g.dests[i]] // "d:" alone is never covered
		}
	}
}

// job is one pass of a group, as its worker runs it.
type job struct {
	g *group
	// A pass owed to changes the watch delivered (not start-up, SIGHUP,
	// resync or a retry alone) times them from the first one's arrival.
	byChange  bool
	changedAt time.Time
	read      bool     // read etcd; otherwise render snap
	snap      snapshot // what the group follows of the watch
	gen       int64    // the watch stream when the pass began: see follow
	epoch     int64    // sched.epoch when the pass began
}

// passReport is what a worker tells the loop: that its pass read (read,
// with the list it reads from, prepared for follow), or that it ended.
type passReport struct {
	j     *job
	read  bool
	pairs []memkv.KVPair
	size  int64
	rev   int64 // the revision read; 0 when the read failed
	ok    bool  // every member succeeded
	at    time.Time
	// stopped: confd stopped before the pass could begin.
	stopped bool
}

// dispatch starts a worker for each due group, each with the pass it owes;
// after ctx ends none starts.
func (d *Daemon) dispatch(ctx context.Context, s *sched, now time.Time) {
	if ctx.Err() != nil {
		return
	}
	for _, g := range s.due(now) {
		j := &job{g: g, byChange: g.dirty && !g.immediate, changedAt: g.first, gen: s.gen, epoch: s.epoch}
		j.read = g.start() || !g.fed.on
		if j.read {
			g.fed.drop(s.budget)
			g.reading, g.missed = true, 0
		} else {
			j.snap = snapshot{pairs: g.fed.pairs, rev: g.fed.rev}
			g.fed.lend()
		}
		g.busy = true
		d.running++
		go d.work(ctx, j)
	}
}

// settle applies a worker's report to the schedule.
func (d *Daemon) settle(s *sched, r passReport) {
	g := r.j.g
	if !r.read {
		d.running--
		g.busy, g.reading = false, false
	}
	if d.retiring[g] {
		// A group of the configuration before a SIGHUP: the new groups
		// process its resources again; they only waited for it to end.
		if !r.read {
			delete(d.retiring, g)
			d.hold(s)
		}
		return
	}
	current := r.j.epoch == s.epoch
	if r.read {
		g.reading = false
		// Follow from this read only when no change arrived meanwhile
		// that it may lack, and from the stream it was read beside.
		if current && r.j.gen == s.gen && g.missed <= r.rev {
			g.fed.install(r.pairs, r.rev, r.j.gen, r.size, s.budget)
			g.fed.lend() // the pass renders from the same list
		}
		return
	}
	g.fed.back()
	rev := r.rev
	if !current {
		rev = 0 // read before a restore: revisions start over
	}
	if r.stopped {
		g.mark(r.at, true) // still owed
		return
	}
	g.finish(rev, r.ok, r.at)
	if !r.ok {
		at, _ := g.readyAt()
		d.o.Log.Warnf("%s: will retry in %s, or at once on a change of its keys", names(g), at.Sub(r.at).Round(time.Millisecond))
	}
}

// work is a group's worker: it runs one pass, reads g's keys once (or
// takes them from what it follows of the watch) and processes its members
// in file-name order, then reports. After ctx ends no further member
// starts. It touches no schedule state: the loop does (settle).
func (d *Daemon) work(ctx context.Context, j *job) {
	g := j.g
	r := passReport{j: j}
	defer func() {
		r.at = d.o.Now()
		d.reports <- r
	}()
	pctx, release, ok := d.o.Limits.pass(ctx, d.o.Commands)
	if !ok {
		for _, m := range g.members {
			d.o.Log.Warnf("%s: not processed: confd is stopping", m.Name())
		}
		r.stopped = true
		return
	}
	defer release()
	d.o.Observer.Snapshot(!j.read)
	snap := j.snap
	if j.read {
		var err error
		snap.pairs, snap.rev, err = apply.GetPairs(d.o.Commands, d.o.Store, g.keys)
		if err != nil {
			err = fmt.Errorf("%s: read keys: %w", names(g), err)
			d.o.Log.Error(err.Error())
			for _, m := range g.members {
				d.o.Observer.Processed(m.Name(), apply.Result{}, err, m.ReloadPending())
			}
			return
		}
		if j.gen != 0 {
			var size int64
			snap.pairs, size = prepare(snap.pairs)
			d.reports <- passReport{j: j, read: true, pairs: snap.pairs, size: size, rev: snap.rev}
		}
	}
	r.rev, r.ok = snap.rev, true
	for _, m := range g.members {
		if ctx.Err() != nil {
			d.o.Log.Warnf("%s: not processed: confd is stopping", m.Name())
			r.ok = false
			break
		}
		res, err := m.Process(pctx, snap)
		if err != nil {
			d.o.Log.Error(err.Error())
			r.ok = false
		}
		if j.byChange && !res.Replaced.IsZero() {
			d.o.Observer.Landed(max(res.Replaced.Sub(j.changedAt), 0))
		}
		d.o.Observer.Processed(m.Name(), res, err, m.ReloadPending())
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
		up, current := w.state()
		ready = ready && up
		d.o.Observer.Revisions(processed, current)
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
		if backends.KeyUnderAny(kv.Key, keys) {
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
func Once(ctx context.Context, rs []Processor, store apply.Getter, log logrus.FieldLogger) error {
	var errs []error
	fail := func(err error) {
		log.Error(err.Error())
		errs = append(errs, err)
	}
	s := newSched(rs, waitspec.Spec{})
	groupOf := map[string]*group{}
	for _, g := range s.groups {
		for _, m := range g.members {
			groupOf[m.Name()] = g
		}
	}
	type read struct {
		snap snapshot
		err  error
	}
	reads := map[*group]read{} // held until the group's last member is done
	// In file-name order, as newSched orders each group's members.
	for _, r := range slices.SortedStableFunc(slices.Values(rs), byName) {
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
			rd.snap.pairs, rd.snap.rev, rd.err = apply.GetPairs(ctx, store, g.keys)
			reads[g] = rd
		}
		if rd.err != nil {
			fail(fmt.Errorf("%s: read keys: %w", r.Name(), rd.err))
		} else if _, err := r.Process(ctx, rd.snap); err != nil {
			fail(err)
		}
		if r.Name() == g.members[len(g.members)-1].Name() {
			delete(reads, g)
		}
	}
	return errors.Join(errs...)
}

// Observer is told what the daemon does, for metrics and readiness. Its
// methods are called concurrently: by passes of independent groups and by
// the watch.
type Observer interface {
	Processed(resource string, res apply.Result, err error, reloadPending bool)
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

// NopObserver hears nothing; embedded, it leaves an observer only the
// methods it needs.
type NopObserver struct{}

func (NopObserver) Processed(string, apply.Result, error, bool) {}
func (NopObserver) WatchUp(bool)                                {}
func (NopObserver) WatchReconnect()                             {}
func (NopObserver) Snapshot(bool)                               {}
func (NopObserver) Revisions(int64, int64)                      {}
func (NopObserver) Ready(bool)                                  {}
func (NopObserver) Landed(time.Duration)                        {}
