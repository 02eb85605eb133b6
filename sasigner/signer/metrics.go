package signer

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/keysync/confd/internal/etcdrestore"
)

// Metrics counts what the signer does (names kube_apiserver_sa_signer_...).
type Metrics struct {
	Registry   *prometheus.Registry
	signs      *prometheus.CounterVec
	signTime   prometheus.Histogram
	fetches    prometheus.Counter
	keys       prometheus.Gauge
	dataTime   prometheus.Gauge
	etcdUp     prometheus.Gauge
	rejected   prometheus.Counter
	restarts   prometheus.Counter
	restores   *prometheus.CounterVec
	cacheFails prometheus.Counter
	recordErrs *prometheus.CounterVec
	keyFile    *prometheus.CounterVec
	answer     prometheus.Gauge
	weakKeys   prometheus.Counter
}

// counters is a labelled counter with every value given at 0 from start,
// so that an alert can tell "never happened" from "not exported".
func counters(name, help, label string, values ...string) *prometheus.CounterVec {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, x := range values {
		v.WithLabelValues(x)
	}
	return v
}

// NewMetrics registers every metric in a registry of its own, every
// labelled series at 0.
func NewMetrics() *Metrics {
	const ns = "kube_apiserver_sa_signer_"
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.signs = counters(ns+"sign_total", "Sign calls by result (ok, invalid, error, unavailable: the trust barrier has not passed).",
		"result", "ok", "invalid", "error", "unavailable")
	m.signTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "sign_duration_seconds",
		Help: "Time to sign one token.", Buckets: []float64{.0005, .001, .002, .005, .01, .05}})
	m.fetches = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "fetch_keys_total", Help: "FetchKeys calls."})
	m.keys = prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "keys", Help: "Verification keys served."})
	m.dataTime = prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "keys_timestamp_seconds",
		Help: "When the served key set last changed (FetchKeys' data_timestamp, Unix time)."})
	m.etcdUp = prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "etcd_up",
		Help: "1 while the published keys are read from etcd; 0 while the last good set is served instead."})
	m.rejected = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "published_values_refused_total",
		Help: "Published values refused by the check (the host's previous keys stay served)."})
	m.restarts = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "watch_restarts_total",
		Help: "Times the etcd watch broke and the prefix was read again."})
	m.restores = counters(ns+"etcd_restores_total", "Times etcd was found restored and the whole key set read again, by evidence: revision (lower than one seen), cluster (another cluster ID), compacted (past the revisions seen: a restore with --mark-compacted, or a compaction during an outage).",
		"evidence", string(etcdrestore.RevisionBack), string(etcdrestore.ClusterChanged), string(etcdrestore.Compacted))
	m.cacheFails = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "cache_write_failures_total",
		Help: "Failed writes of the key cache file."})
	m.recordErrs = counters(ns+"trust_record_errors_total", "Trust record failures: write (etcd refused or unreachable; retried) and controller_manager_key (its key file unreadable; the record names none).",
		"what", "write", "controller_manager_key")
	m.keyFile = counters(ns+"signing_key_file_warnings_total", "Loads (start and reload) of a signing key file others may read or replace, by reason: mode (permission bits for group or others) and owner (not this process's user).",
		"reason", "mode", "owner")
	m.answer = prometheus.NewGauge(prometheus.GaugeOpts{Name: ns + "fetch_keys_response_bytes",
		Help: "Size of the last FetchKeys answer; kube-apiserver refuses one over 4194304 bytes (gRPC's default receive limit)."})
	m.weakKeys = prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "published_weak_keys_total",
		Help: "RSA public keys under 2048 bits seen published (each counted and logged once; served, since dropping one would refuse its live tokens)."})
	m.Registry.MustRegister(m.signs, m.signTime, m.fetches, m.keys, m.dataTime, m.etcdUp, m.rejected, m.restarts, m.restores, m.cacheFails, m.recordErrs, m.keyFile, m.answer, m.weakKeys,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// SetKeys records the set served: n keys, changed at t.
func (m *Metrics) SetKeys(n int, t time.Time) {
	m.keys.Set(float64(n))
	m.dataTime.Set(float64(t.UnixNano()) / 1e9)
}
