package keywatch

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/keysync/confd/internal/etcdrestore"
	"github.com/keysync/confd/internal/promserve"
)

// Repair reasons: why a reconcile wrote what it wrote. Each is a value of
// the repairs counter's reason label.
const (
	// ValueMissing: the host's value was gone (deleted, or a restore
	// from before its first publish).
	ValueMissing = "value-missing"
	// ValueInvalid: the value did not parse as public keys.
	ValueInvalid = "value-invalid"
	// CurrentMissing: a key of the host's key files, published before
	// by this publisher, was missing from the value.
	CurrentMissing = "current-missing"
	// SupersededMissing: a superseded key (in the key record) was
	// missing from the value.
	SupersededMissing = "superseded-missing"
	// RetiredPresent: a retired key was back in a value.
	RetiredPresent = "retired-present"
	// TombstoneMissing: a tombstone this master had seen was missing
	// from a key record (any host's).
	TombstoneMissing = "tombstone-missing"
)

// Reconcile triggers: the reconciles counter's trigger label.
const (
	TriggerStart    = "start"
	TriggerInterval = "interval"
	TriggerFile     = "file"
	TriggerWatch    = "watch"
	TriggerRestore  = "restore"
)

// Error kinds: the errors counter's kind label.
const (
	ErrSource   = "source"    // the key files refused or unreadable
	ErrEtcd     = "etcd"      // a read or write failed
	ErrStateDir = "state-dir" // the tombstone file unreadable or unwritable
	ErrAlive    = "alive"     // the alive record could not be written
	// ErrStaleTokens: a sample of the apiserver's /metrics by the
	// stale-token sampler the publisher runs failed.
	ErrStaleTokens = "stale-tokens"
	// ErrFleetState: a read of the fleet state for the fleet gauges
	// (package fleetstate) failed.
	ErrFleetState = "fleet-state"
)

// Metrics counts what the publisher does
// (kube_apiserver_safe_restart_publisher_...), every series initialised
// so that rate() and absent() work from the first scrape.
type Metrics struct {
	Registry   *prometheus.Registry
	repairs    *prometheus.CounterVec
	reconciles *prometheus.CounterVec
	errors     *prometheus.CounterVec
	restores   *prometheus.CounterVec
	keys       *prometheus.GaugeVec
	alive      prometheus.Gauge
	lastOK     prometheus.Gauge
}

// NewMetrics registers every metric in a registry of its own.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		repairs: counterVec("repairs_total", "reason", []string{ValueMissing, ValueInvalid, CurrentMissing, SupersededMissing, RetiredPresent, TombstoneMissing},
			"Published values and key records repaired, by reason (value-missing, value-invalid, current-missing, superseded-missing, retired-present, tombstone-missing)."),
		reconciles: counterVec("reconciles_total", "trigger", []string{TriggerStart, TriggerInterval, TriggerFile, TriggerWatch, TriggerRestore},
			"Reconciles run, by trigger (start, interval, file, watch, restore)."),
		errors: counterVec("errors_total", "kind", []string{ErrSource, ErrEtcd, ErrStateDir, ErrAlive, ErrStaleTokens, ErrFleetState},
			"Errors, by kind (source: key files refused; etcd; state-dir: the tombstone file; alive: the alive record; stale-tokens: a failed sample of the apiserver's /metrics; fleet-state: a failed read of the fleet state from etcd)."),
		restores: counterVec("etcd_restores_total", "evidence", []string{string(etcdrestore.RevisionBack), string(etcdrestore.ClusterChanged), string(etcdrestore.Compacted)},
			"etcd restores noticed, by evidence (revision, cluster, compacted)."),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: ns + "keys",
			Help: "This host's keys after the last reconcile, by state (current, superseded, retired)."}, []string{"state"}),
		alive: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "alive_record",
			Help: "1 while this host's alive record is in etcd."}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "last_reconcile_timestamp_seconds",
			Help: "When the last reconcile succeeded (Unix time)."}),
	}
	m.Registry.MustRegister(m.repairs, m.reconciles, m.errors, m.restores, m.keys, m.alive, m.lastOK,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.setKeys(0, 0, 0)
	return m
}

const ns = "kube_apiserver_safe_restart_publisher_"

// counterVec is a counter with one label, every value of it initialised.
func counterVec(name, label string, values []string, help string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + name, Help: help}, []string{label})
	for _, v := range values {
		c.WithLabelValues(v)
	}
	return c
}

func (m *Metrics) repair(reason string) { m.repairs.WithLabelValues(reason).Inc() }

// SampleFailed counts a failed stale-token sample (the sampler runs
// beside the loop, as one of its Runners).
func (m *Metrics) SampleFailed() { m.fail(ErrStaleTokens) }

// FleetStateFailed counts a failed read of the fleet state (its collector
// reads at scrape time, beside the loop).
func (m *Metrics) FleetStateFailed() { m.fail(ErrFleetState) }

func (m *Metrics) fail(kind string) { m.errors.WithLabelValues(kind).Inc() }

func (m *Metrics) restore(e etcdrestore.Evidence) { m.restores.WithLabelValues(string(e)).Inc() }

func (m *Metrics) setKeys(current, superseded, retired int) {
	m.keys.WithLabelValues("current").Set(float64(current))
	m.keys.WithLabelValues("superseded").Set(float64(superseded))
	m.keys.WithLabelValues("retired").Set(float64(retired))
}

func (m *Metrics) setAlive(up bool) { m.alive.Set(promserve.Bool(up)) }
