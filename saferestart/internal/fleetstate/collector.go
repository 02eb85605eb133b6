package fleetstate

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
)

// DefaultTimeout bounds one read of the fleet state: below Prometheus'
// default scrape timeout (10 s), so that a scrape answers, with
// fleet_state_up 0, while etcd does not.
const DefaultTimeout = 5 * time.Second

const ns = "kube_apiserver_safe_restart_"

var (
	descPublished = prometheus.NewDesc(ns+"published_keys",
		"Key IDs in the host's published value (--keys-prefix).", []string{"host"}, nil)
	descSuperseded = prometheus.NewDesc(ns+"superseded_keys",
		"Superseded, not yet retired keys of the host (its key record under --rotation-prefix).", []string{"host"}, nil)
	descRetirementDue = prometheus.NewDesc(ns+"key_retirement_due_seconds",
		"Seconds until a superseded key's retire_after; negative once past due (retire-keys retires it).", []string{"host", "kid"}, nil)
	descUntrusted = prometheus.NewDesc(ns+"untrusted_keys",
		"Published keys (every host's, as `trust` counts them) that the host's trust record does not list as trusted; with no trust record, every published key; 0 for a host forget-host removed.", []string{"host"}, nil)
	descLastRestart = prometheus.NewDesc(ns+"last_restart_timestamp_seconds",
		"When the host's apiserver last passed a safe restart's health gate (its trust record's time, Unix seconds); absent with no trust record.", []string{"host"}, nil)
	descHoldActive = prometheus.NewDesc(ns+"hold_active",
		"1 while a hold (or an orphaned restart intent) stops every restart; 0 otherwise.", nil, nil)
	descHoldInfo = prometheus.NewDesc(ns+"hold_info",
		"1 for the host that set the active hold; absent when there is none.", []string{"host"}, nil)
	descLockHeld = prometheus.NewDesc(ns+"lock_held",
		"1 while the restart lock (--lock-name) is held; 0 otherwise.", nil, nil)
	descLockAge = prometheus.NewDesc(ns+"lock_holder_age_seconds",
		"Seconds the restart lock's current holder has held it, from the acquired time the helper records; for a holder that records none (etcdctl lock), since this publisher first saw it. 0 when the lock is free.", nil, nil)
	descLockInfo = prometheus.NewDesc(ns+"lock_holder_info",
		"1 for the host holding the restart lock (\"unknown\" for a holder that records no host); absent when free.", []string{"host"}, nil)
	descPhase = prometheus.NewDesc(ns+"rotation_phase",
		"1 for the phase of the host's rotation record, 0 for every other phase (generated, published, installing, installed, retired, rolling-back, none: no rotation record); every phase 0 when the record is unreadable.", []string{"host", "phase"}, nil)
	descPhaseAge = prometheus.NewDesc(ns+"rotation_phase_age_seconds",
		"Seconds since the host's rotation record was last written (its updated time; each phase change writes it); absent for a host with no rotation record.", []string{"host"}, nil)
	descStaleTokens = prometheus.NewDesc(ns+"stale_tokens",
		"The host's kube-apiserver serviceaccount_stale_tokens_total as last sampled into its stale-token record.", []string{"host"}, nil)
	descUp = prometheus.NewDesc(ns+"fleet_state_up",
		"1 when the last read of the fleet state from etcd succeeded; while 0, the other fleet gauges show the last successful read.", nil, nil)
	descTimestamp = prometheus.NewDesc(ns+"fleet_state_timestamp_seconds",
		"When the fleet state was last read from etcd successfully (Unix seconds); 0 before the first.", nil, nil)
)

// Collector exports the fleet state, read from etcd at each scrape.
//
// It reads at scrape time, not in the publisher's loop: the values are as
// fresh as the scrape (a hold shows at the next scrape), the publisher's
// loop stays about its own keys, and nothing reads etcd when nobody
// scrapes. Each read is bounded by Timeout, so a scrape on a cut etcd
// answers fleet_state_up 0 instead of hanging.
type Collector struct {
	// Read reads the state; Read with the publisher's etcd client in
	// production.
	Read    func(ctx context.Context) (*Snapshot, error)
	Timeout time.Duration      // DefaultTimeout when 0
	Log     logrus.FieldLogger // required
	// Failed counts a failed read (publisher_errors_total{kind="fleet-state"}).
	Failed func()
	Now    func() time.Time // time.Now when nil

	mu      sync.Mutex
	last    *Snapshot
	lastOK  time.Time
	failing bool
	// holder and holderSeen: the holder this collector last saw (key and
	// create revision) and when it first saw it, for a holder that records
	// no acquired time.
	holder     string
	holderSeen time.Time
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPublished, descSuperseded, descRetirementDue, descUntrusted, descLastRestart,
		descHoldActive, descHoldInfo, descLockHeld, descLockAge, descLockInfo, descPhase, descPhaseAge, descStaleTokens,
		descUp, descTimestamp} {
		ch <- d
	}
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	// Read outside the lock: concurrent scrapes each wait for their own
	// bounded read, never for another's in a queue.
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(c.Timeout, DefaultTimeout))
	s, err := c.Read(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	up := 0.0
	if err != nil {
		if !c.failing {
			c.Log.WithError(err).Warn("publish-key --watch: cannot read the fleet state from etcd; the fleet metrics show the last read until it recovers")
		}
		c.failing = true
		if c.Failed != nil {
			c.Failed()
		}
	} else {
		if c.failing {
			c.Log.Info("publish-key --watch: reading the fleet state from etcd again")
		}
		c.failing = false
		c.last, c.lastOK, up = s, now, 1
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descUp, up)
	ts := 0.0
	if !c.lastOK.IsZero() {
		ts = float64(c.lastOK.UnixNano()) / 1e9
	}
	gauge(descTimestamp, ts)
	c.fleet(gauge, now)
	c.hosts(gauge, now)
}

type gaugeFunc func(d *prometheus.Desc, v float64, labels ...string)

// fleet sends the fleet-wide gauges: hold and lock, present before the
// first successful read too.
func (c *Collector) fleet(gauge gaugeFunc, now time.Time) {
	s := c.last
	if s == nil {
		s = &Snapshot{}
	}
	if h := s.Hold; h != nil {
		gauge(descHoldActive, 1)
		gauge(descHoldInfo, 1, cmp.Or(h.Host, "unknown"))
	} else {
		gauge(descHoldActive, 0)
	}
	e := s.Holder
	if e == nil {
		c.holder = ""
		gauge(descLockHeld, 0)
		gauge(descLockAge, 0)
		return
	}
	id := fmt.Sprintf("%s@%d", e.Key, e.CreateRevision)
	if id != c.holder {
		c.holder, c.holderSeen = id, now
	}
	since := c.holderSeen
	host := ""
	if e.Info != nil {
		host = e.Info.Host
		if e.Info.Acquired != nil {
			since = *e.Info.Acquired
		}
	}
	gauge(descLockHeld, 1)
	gauge(descLockAge, max(0, now.Sub(since).Seconds()))
	gauge(descLockInfo, 1, cmp.Or(host, "unknown"))
}

// hosts sends the per-host gauges, every one for every host.
func (c *Collector) hosts(gauge gaugeFunc, now time.Time) {
	s := c.last
	if s == nil || s.Trust == nil {
		return
	}
	all := s.hosts()
	for _, host := range slices.Sorted(maps.Keys(all)) {
		h, k := all[host], s.Trust.Lifecycle[host]
		gauge(descPublished, float64(h.published), host)
		gauge(descSuperseded, float64(len(k.Superseded)), host)
		for _, sk := range k.Superseded {
			gauge(descRetirementDue, sk.RetireAfter.Sub(now).Seconds(), host, sk.KID)
		}
		// The published keys (every host's, forgotten hosts' superseded ones
		// included, as trust.Wait and `trust` count them) that h's trust
		// record does not list; with no record, every one. A host
		// forget-host removed must trust nothing (no wait waits for it): 0.
		// A host wait-trusted waits on counts as `trust` shows it: its
		// apiserver trusts the keys once restarted.
		untrusted := 0
		for _, kid := range s.Trust.Published {
			if !k.Gone() && !h.record.Trusts(kid) {
				untrusted++
			}
		}
		gauge(descUntrusted, float64(untrusted), host)
		// No time without a trust record (the helper writes it after its
		// health gate): 0 would claim 1970, and a host forget-host removed
		// would look unrestarted for good; untrusted_keys says that a host
		// has no record.
		if h.record != nil && !h.record.Time.IsZero() {
			gauge(descLastRestart, float64(h.record.Time.UnixNano())/1e9, host)
		}
		current := PhaseNone
		switch r := h.rotation; {
		case r.StateError != "":
			current = ""
		case r.State != nil:
			current = string(r.State.Phase)
			if !r.State.Updated.IsZero() {
				gauge(descPhaseAge, max(0, now.Sub(r.State.Updated).Seconds()), host)
			}
		}
		for _, p := range Phases {
			v := 0.0
			if p == current {
				v = 1
			}
			gauge(descPhase, v, host, p)
		}
	}
	for host, r := range s.StaleTokens {
		gauge(descStaleTokens, r.Counter, host)
	}
}
