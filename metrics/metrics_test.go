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

// Every labelled series of the resources known at start exists at 0
// before the first pass, and those of a resource first seen later (a
// SIGHUP) once it is processed: an alert on them can tell "never happened"
// from "not exported".
func TestSeriesAtZeroFromStart(t *testing.T) {
	m := New("a.toml", "b.toml")
	_, body := get(t, m, "/metrics")
	var want []string
	for _, r := range []string{"a.toml", "b.toml"} {
		want = append(want,
			`confd_resource_renders_total{resource="`+r+`",result="ok"} 0`,
			`confd_resource_renders_total{resource="`+r+`",result="error"} 0`,
			`confd_resource_writes_total{resource="`+r+`"} 0`,
			`confd_resource_check_total{resource="`+r+`",result="ok"} 0`,
			`confd_resource_check_total{resource="`+r+`",result="failed"} 0`,
			`confd_resource_reload_total{resource="`+r+`",result="ok"} 0`,
			`confd_resource_reload_total{resource="`+r+`",result="failed"} 0`,
			`confd_resource_reload_pending{resource="`+r+`"} 0`)
	}
	want = append(want, `confd_group_snapshots_total{source="etcd"} 0`, `confd_group_snapshots_total{source="watch"} 0`)
	for _, w := range want {
		if !strings.Contains(body, w+"\n") {
			t.Errorf("fresh /metrics lacks %s", w)
		}
	}
	if strings.Contains(body, "confd_resource_last_success_timestamp_seconds{") {
		t.Error("a last-success time before any success")
	}
	m.Processed("c.toml", apply.Result{}, nil, false)
	_, body = get(t, m, "/metrics")
	for _, w := range []string{`confd_resource_reload_total{resource="c.toml",result="failed"} 0`, `confd_resource_check_total{resource="c.toml",result="failed"} 0`} {
		if !strings.Contains(body, w+"\n") {
			t.Errorf("after c.toml's first pass /metrics lacks %s", w)
		}
	}
}
