package metrics

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/runner"
)

func get(t *testing.T, m *Metrics, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestReadyzFollowsReady(t *testing.T) {
	m := New()
	if code, _ := get(t, m, "/readyz"); code != 503 {
		t.Errorf("/readyz before ready = %d", code)
	}
	m.Ready(true)
	if code, _ := get(t, m, "/readyz"); code != 200 {
		t.Errorf("/readyz when ready = %d", code)
	}
	if code, _ := get(t, m, "/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}

func TestMetricsNames(t *testing.T) {
	m := New()
	m.Processed("a.toml", apply.Result{Changed: true, Reloaded: true}, nil, false)
	m.Processed("a.toml", apply.Result{Changed: true}, errors.New("reload failed"), true)
	m.Processed("b.toml", apply.Result{Changed: true}, &apply.CommandError{Command: "false", Result: runner.Result{Err: errors.New("exit status 1")}}, false)
	m.WatchUp(true)
	m.WatchReconnect()
	m.Revisions(7, 10)
	m.Landed(1500 * time.Microsecond)
	m.Landed(3 * time.Second)
	_, body := get(t, m, "/metrics")
	for _, want := range []string{
		`confd_resource_renders_total{resource="a.toml",result="ok"} 1`,
		`confd_resource_renders_total{resource="a.toml",result="error"} 1`,
		`confd_resource_writes_total{resource="a.toml"} 2`,
		`confd_resource_reload_total{resource="a.toml",result="ok"} 1`,
		`confd_resource_reload_total{resource="a.toml",result="failed"} 1`,
		`confd_resource_reload_pending{resource="a.toml"} 1`,
		`confd_resource_check_total{resource="b.toml",result="failed"} 1`,
		`confd_resource_last_success_timestamp_seconds{resource="a.toml"}`,
		"confd_watch_up 1",
		"confd_watch_reconnects_total 1",
		"confd_watch_processed_revision 7",
		"confd_watch_lag_revisions 3",
		`confd_watch_change_to_file_seconds_bucket{le="0.001"} 0`,
		`confd_watch_change_to_file_seconds_bucket{le="0.002"} 1`,
		`confd_watch_change_to_file_seconds_bucket{le="5"} 2`,
		"confd_watch_change_to_file_seconds_sum 3.0015",
		"confd_watch_change_to_file_seconds_count 2",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
