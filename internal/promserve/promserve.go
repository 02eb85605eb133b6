// Package promserve serves a Prometheus registry on /metrics and a
// liveness answer on /healthz: the helpers' one metrics endpoint
// (kube-apiserver-sa-signer's --metrics-addr, publish-key --watch's
// --publisher-metrics-addr). confd's -metrics-addr has readiness too and
// is its own (metrics/), but sets its gauges with Bool too.
package promserve

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Serve listens on addr (flag names the flag it came from, for the error)
// and serves reg until the returned server is closed.
func Serve(ctx context.Context, flag, addr string, reg *prometheus.Registry) (*http.Server, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }() // an error ends it with the process
	return srv, nil
}

// Bool is a gauge's value for b: 1 when true.
func Bool(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
