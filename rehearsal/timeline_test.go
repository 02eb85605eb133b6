//go:build rehearsal

package rehearsal

import (
	"fmt"
	"sync"
	"time"
)

// timeline records, per host, when its fake systemd stopped and started
// kube-apiserver and when the /readyz poller saw it become ready or not,
// so that outages can be checked for overlap across hosts.
type timeline struct {
	mu      sync.Mutex
	events  []event
	ready   map[string]bool
	gen     map[string]int
	failed  map[string][]time.Time // failed probes since the last good one
	changed chan struct{}
	done    bool
}

type event struct {
	host string
	at   time.Time
	kind string // stop, start, ready, notready, gone
}

func newTimeline() *timeline {
	return &timeline{ready: map[string]bool{}, gen: map[string]int{}, failed: map[string][]time.Time{}, changed: make(chan struct{})}
}

func (tl *timeline) addLocked(host, kind string, at time.Time) {
	tl.events = append(tl.events, event{host, at, kind})
	close(tl.changed)
	tl.changed = make(chan struct{})
}

// stopping is called by a host's systemd before it signals the old
// apiserver: the host is not ready from now on, and a probe started before
// this moment cannot say otherwise.
func (tl *timeline) stopping(host string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.gen[host]++
	tl.ready[host] = false
	tl.addLocked(host, "stop", time.Now())
}

func (tl *timeline) started(host string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.addLocked(host, "start", time.Now())
}

// outOfService marks host as taken out of service by its operator (to be
// reimaged): its downtime until it serves again is not a restart's, and is
// not checked for overlap. Call it before stopping the host.
func (tl *timeline) outOfService(host string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.addLocked(host, "gone", time.Now())
}

func (tl *timeline) generation(host string) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.gen[host]
}

// sample records one probe's answer; a 200 counts only if no stop happened
// since the probe began (gen), and is dated when it arrived. A running
// apiserver counts as not ready after three failed probes in a row, dated
// from the first: a single slow answer on a loaded machine is not an
// outage, an apiserver that died on its own is.
func (tl *timeline) sample(host string, gen int, ok bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if ok {
		tl.failed[host] = nil
		if !tl.ready[host] && gen == tl.gen[host] {
			tl.ready[host] = true
			tl.addLocked(host, "ready", time.Now())
		}
		return
	}
	tl.failed[host] = append(tl.failed[host], time.Now())
	if tl.ready[host] && len(tl.failed[host]) >= 3 {
		tl.ready[host] = false
		tl.addLocked(host, "notready", tl.failed[host][0])
	}
}

func (tl *timeline) isReady(host string) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.ready[host]
}

// wait returns a channel closed at the next event.
func (tl *timeline) wait() <-chan struct{} {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.changed
}

func (tl *timeline) close() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.done = true
}

func (tl *timeline) closed() bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.done
}

type interval struct {
	host       string
	start, end time.Time
	open       bool
}

func (i interval) String() string {
	end := "still down"
	if !i.open {
		end = i.end.Format("15:04:05.000")
	}
	return fmt.Sprintf("%s down %s..%s", i.host, i.start.Format("15:04:05.000"), end)
}

// outages are the intervals in which a host that had been ready was not:
// from its stop (or a failed probe) to its next ready probe. A host's first
// start, before it ever served, is not an outage.
func (tl *timeline) outages() []interval {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	served := map[string]bool{}
	down := map[string]*interval{}
	var out []interval
	for _, e := range tl.events {
		switch e.kind {
		case "ready":
			served[e.host] = true
			if d := down[e.host]; d != nil {
				d.end = e.at
				out = append(out, *d)
				delete(down, e.host)
			}
		case "gone":
			served[e.host] = false
			if d := down[e.host]; d != nil {
				d.end = e.at
				out = append(out, *d)
				delete(down, e.host)
			}
		case "stop", "notready":
			if served[e.host] && down[e.host] == nil {
				down[e.host] = &interval{host: e.host, start: e.at}
			}
		}
	}
	now := time.Now()
	for _, d := range down {
		d.end, d.open = now, true
		out = append(out, *d)
	}
	return out
}

// overlaps lists every pair of outages of different hosts that intersect.
func overlaps(all []interval) []string {
	var bad []string
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.host != b.host && a.start.Before(b.end) && b.start.Before(a.end) {
				bad = append(bad, a.String()+" overlaps "+b.String())
			}
		}
	}
	return bad
}
