// Package metrics serves what the confd daemon does as Prometheus metrics
// (names confd_...), plus /healthz (the process answers) and /readyz (every
// resource rendered since start and the watch live).
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/promserve"
)

// Metrics is a daemon.Observer that keeps its own registry.
type Metrics struct {
	reg *prometheus.Registry

	lastSuccess  *prometheus.GaugeVec
	passes       *prometheus.CounterVec
	writes       *prometheus.CounterVec
	checks       *prometheus.CounterVec
	reloads      *prometheus.CounterVec
	pending      *prometheus.GaugeVec
	watchUp      prometheus.Gauge
	reconnects   prometheus.Counter
	snapshots    *prometheus.CounterVec
	processedRev prometheus.Gauge
	currentRev   prometheus.Gauge
	lagRevisions prometheus.Gauge
	readyGauge   prometheus.Gauge
	landed       prometheus.Histogram
	ready        atomic.Bool
}

// New registers every metric, with every series of the resources known at
// start at zero: an alert on a count can then tell "never happened" from
// "not exported" before the first event.
func New(resources ...string) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	res := []string{"resource"}
	m.lastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "confd_resource_last_success_timestamp_seconds",
		Help: "When the resource last processed without error (Unix time)."}, res)
	m.passes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "confd_resource_renders_total",
		Help: "Passes over the resource (read, render, compare), by result (ok, error)."}, []string{"resource", "result"})
	m.writes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "confd_resource_writes_total",
		Help: "Times the resource's destination was replaced (or, with -noop, would have been)."}, res)
	m.checks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "confd_resource_check_total",
		Help: "Results of passes that changed the file at the check stage: ok (check_cmd passed, or none is set) or failed."}, []string{"resource", "result"})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "confd_resource_reload_total",
		Help: "reload_cmd results (ok, failed)."}, []string{"resource", "result"})
	m.pending = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "confd_resource_reload_pending",
		Help: "1 while a reload_cmd is owed: its file was replaced but the reload failed."}, res)
	m.watchUp = prometheus.NewGauge(prometheus.GaugeOpts{Name: "confd_watch_up",
		Help: "1 while the etcd watch is live."})
	m.reconnects = prometheus.NewCounter(prometheus.CounterOpts{Name: "confd_watch_reconnects_total",
		Help: "Times the etcd watch was opened again after it broke or was restarted."})
	m.snapshots = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "confd_group_snapshots_total",
		Help: "Where a pass of a group of resources took its keys from: etcd (a read), or watch (the last read plus the changes the watch delivered since; see the README)."}, []string{"source"})
	m.processedRev = prometheus.NewGauge(prometheus.GaugeOpts{Name: "confd_watch_processed_revision",
		Help: "The etcd revision every resource has been read at, at least."})
	m.currentRev = prometheus.NewGauge(prometheus.GaugeOpts{Name: "confd_watch_etcd_revision",
		Help: "The newest etcd revision the watch has seen."})
	m.lagRevisions = prometheus.NewGauge(prometheus.GaugeOpts{Name: "confd_watch_lag_revisions",
		Help: "confd_watch_etcd_revision minus confd_watch_processed_revision."})
	m.readyGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "confd_ready",
		Help: "1 once every resource rendered since start and the watch is live (as /readyz)."})
	// One histogram for the daemon, not one per resource: 1000 resources
	// times the buckets would be 17,000 series for one question, how long
	// a change takes to reach the files.
	m.landed = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "confd_watch_change_to_file_seconds",
		Help:    "Seconds from a change's arrival on the watch to the new content in place in a destination it changed (quiescence and check_cmd included); one observation per file replaced.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}})
	m.reg.MustRegister(m.lastSuccess, m.passes, m.writes, m.checks, m.reloads, m.pending, m.watchUp,
		m.reconnects, m.snapshots, m.processedRev, m.currentRev, m.lagRevisions, m.readyGauge, m.landed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range resources {
		m.resource(r)
	}
	for _, s := range []string{"etcd", "watch"} {
		m.snapshots.WithLabelValues(s)
	}
	return m
}

// resource creates name's labelled series at zero, every value of the
// result label, those of a resource a SIGHUP added too. Not the last-success timestamp: 0 would claim 1970;
// renders_total{result="ok"} at 0 says it never succeeded.
func (m *Metrics) resource(name string) {
	for _, r := range []string{"ok", "error"} {
		m.passes.WithLabelValues(name, r)
	}
	m.writes.WithLabelValues(name)
	for _, r := range []string{"ok", "failed"} {
		m.checks.WithLabelValues(name, r)
		m.reloads.WithLabelValues(name, r)
	}
	m.pending.WithLabelValues(name)
}

// Processed records one resource pass.
func (m *Metrics) Processed(name string, res apply.Result, err error, reloadPending bool) {
	m.resource(name)
	result := "ok"
	if err != nil {
		result = "error"
	} else {
		m.lastSuccess.WithLabelValues(name).SetToCurrentTime()
	}
	m.passes.WithLabelValues(name, result).Inc()
	// A failed pass that leaves a reload pending replaced its file (the
	// check passed) or had replaced it before; the reload failed.
	replaced := res.Changed && (err == nil || reloadPending)
	if replaced {
		m.writes.WithLabelValues(name).Inc()
		m.checks.WithLabelValues(name, "ok").Inc()
	}
	if err != nil && reloadPending {
		m.reloads.WithLabelValues(name, "failed").Inc()
	}
	if _, failed := errors.AsType[*apply.CommandError](err); res.Changed && !replaced && failed {
		// A command failed before the file was replaced: the check.
		m.checks.WithLabelValues(name, "failed").Inc()
	}
	if res.Reloaded {
		m.reloads.WithLabelValues(name, "ok").Inc()
	}
	m.pending.WithLabelValues(name).Set(promserve.Bool(reloadPending))
}

// Landed records how long a change took to reach a file.
func (m *Metrics) Landed(d time.Duration) { m.landed.Observe(d.Seconds()) }

// WatchUp records the watch's state.
func (m *Metrics) WatchUp(up bool) { m.watchUp.Set(promserve.Bool(up)) }

// WatchReconnect counts a reopened watch.
func (m *Metrics) WatchReconnect() { m.reconnects.Inc() }

// Snapshot counts where a group's pass took its keys from.
func (m *Metrics) Snapshot(fromWatch bool) {
	source := "etcd"
	if fromWatch {
		source = "watch"
	}
	m.snapshots.WithLabelValues(source).Inc()
}

// Revisions records how far processing is behind etcd.
func (m *Metrics) Revisions(processed, current int64) {
	m.processedRev.Set(float64(processed))
	m.currentRev.Set(float64(current))
	m.lagRevisions.Set(float64(max(current-processed, 0)))
}

// Ready records readiness for /readyz.
func (m *Metrics) Ready(ready bool) {
	m.ready.Store(ready)
	m.readyGauge.Set(promserve.Bool(ready))
}

// Handler serves /metrics, /healthz and /readyz.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not ready: a resource has not rendered since start, or the etcd watch is down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Server is a running metrics endpoint.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Serve listens on addr at once, so that a taken port fails confd's start,
// and serves Handler in the background.
func (m *Metrics) Serve(addr string, log logrus.FieldLogger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, srv: &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Errorf("metrics server on %s: %v", addr, err)
		}
	}()
	return s, nil
}

// Addr is the address listened on (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server, letting requests in flight finish briefly.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
