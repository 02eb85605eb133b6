package staletokens

import (
	"os"
	"strings"
	"testing"
	"time"
)

// The metric as kube-apiserver v1.37.2 defines it, copied from
// pkg/serviceaccount/metrics.go (staleTokensTotal: subsystem, name, help,
// stability, no labels) and pkg/serviceaccount/claims.go (counted when a
// token is verified after its warnafter, issue + WarnOnlyBoundTokenExpirationSeconds).
var fromSource = struct {
	subsystem, name, help, stability string
	warnOnlySeconds                  int
	processStartTime                 string // component-base/metrics/processstarttime.go
}{"serviceaccount", "stale_tokens_total", "Cumulative stale projected service account tokens used", "BETA", 60*60 + 7, "process_start_time_seconds"}

func realText(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/kube-apiserver-v1.37.2.metrics")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The names this package reads are the source's, and the real text
// declares them so (HELP with the stability level, TYPE counter, no
// labels); StaleAfter is not later than the source's threshold.
func TestMetricPinnedToSource(t *testing.T) {
	if want := fromSource.subsystem + "_" + fromSource.name; CounterMetric != want {
		t.Errorf("CounterMetric %q, want %q", CounterMetric, want)
	}
	if StartTimeMetric != fromSource.processStartTime {
		t.Errorf("StartTimeMetric %q, want %q", StartTimeMetric, fromSource.processStartTime)
	}
	text := realText(t)
	for _, line := range []string{
		"# HELP " + CounterMetric + " [" + fromSource.stability + "] " + fromSource.help,
		"# TYPE " + CounterMetric + " counter",
		"\n" + CounterMetric + " 0\n",
		"# TYPE " + StartTimeMetric + " gauge",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("the real text lacks %q", line)
		}
	}
	if StaleAfter > time.Duration(fromSource.warnOnlySeconds)*time.Second {
		t.Errorf("StaleAfter %s is later than the apiserver's %ds", StaleAfter, fromSource.warnOnlySeconds)
	}
}

func TestParse(t *testing.T) {
	real := realText(t)
	start := time.Unix(1796427859, 720000000).UTC() // process_start_time_seconds 1.79642785972e+09
	noCounter := strings.Replace(real, "# HELP "+CounterMetric+" [BETA] Cumulative stale projected service account tokens used\n"+
		"# TYPE "+CounterMetric+" counter\n"+CounterMetric+" 0\n", "", 1)
	for _, tc := range []struct {
		name    string
		text    string
		want    Sample
		wantErr string
	}{
		{"real, fresh apiserver", real, Sample{Present: true, Value: 0, StartTime: start}, ""},
		{"real, used stale", strings.Replace(real, "\n"+CounterMetric+" 0\n", "\n"+CounterMetric+" 42\n", 1), Sample{Present: true, Value: 42, StartTime: start}, ""},
		{"real without the counter (absent)", noCounter, Sample{Present: false, StartTime: start}, ""},
		{"no start time", "# TYPE " + CounterMetric + " counter\n" + CounterMetric + " 3\n", Sample{Present: true, Value: 3}, ""},
		{"labelled series: not the known metric", "# TYPE " + CounterMetric + " counter\n" + CounterMetric + "{a=\"1\"} 3\n" + CounterMetric + "{a=\"2\"} 3\n", Sample{}, "2 series"},
		{"a gauge: not the known metric", "# TYPE " + CounterMetric + " gauge\n" + CounterMetric + " 3\n", Sample{}, "want one counter"},
		{"not exposition text", "<html>login</html>\n", Sample{}, "parse the metrics text"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "real without the counter (absent)" && strings.Contains(tc.text, CounterMetric) {
				t.Fatal("the counter is still in the text")
			}
			got, err := Parse(strings.NewReader(tc.text))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Present != tc.want.Present || got.Value != tc.want.Value || got.StartTime.Sub(tc.want.StartTime).Abs() > time.Millisecond {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Growth is measured against the same apiserver process; a restart (a new
// start time, or a counter that went down) measures against 0.
func TestObserve(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := t0.Add(2 * time.Hour)
	earlier := t0.Add(-time.Hour)
	s1, s2 := t0.Add(-24*time.Hour), t0.Add(time.Hour) // apiserver start times
	prev := func(counter float64, start time.Time) *Record {
		return &Record{Host: "m1", Counter: counter, StartTime: start, LastGrowth: earlier, LastSample: t0}
	}
	for _, tc := range []struct {
		name string
		prev *Record
		s    Sample
		want time.Time // LastGrowth
	}{
		{"first sample, 0", nil, Sample{Present: true, StartTime: s1}, time.Time{}},
		{"first sample, counted before: taken as now", nil, Sample{Present: true, Value: 4, StartTime: s1}, now},
		{"absent counter", nil, Sample{StartTime: s1}, time.Time{}},
		{"same process, unchanged", prev(4, s1), Sample{Present: true, Value: 4, StartTime: s1}, earlier},
		{"same process, grew", prev(4, s1), Sample{Present: true, Value: 5, StartTime: s1}, now},
		{"restarted, back to 0: not growth", prev(4, s1), Sample{Present: true, Value: 0, StartTime: s2}, earlier},
		{"restarted, counted 4 again: growth, not 'unchanged'", prev(4, s1), Sample{Present: true, Value: 4, StartTime: s2}, now},
		{"restarted, counted less: growth since the restart", prev(4, s1), Sample{Present: true, Value: 1, StartTime: s2}, now},
		{"no start times, dropped to 0: restart, no growth", prev(4, time.Time{}), Sample{Present: true}, earlier},
		{"no start times, dropped to 1: growth since the restart", prev(4, time.Time{}), Sample{Present: true, Value: 1}, now},
		{"start time rounded differently: same process", prev(4, s1), Sample{Present: true, Value: 4, StartTime: s1.Add(10 * time.Millisecond)}, earlier},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Observe(tc.prev, "m1", tc.s, now)
			if !r.LastGrowth.Equal(tc.want) || !r.LastSample.Equal(now) || r.Counter != tc.s.Value || r.Absent == tc.s.Present {
				t.Errorf("record %+v, want last growth %v", r, tc.want)
			}
		})
	}
}

// The retire decision: growth within the window and more than an hour
// after the key stopped signing refuses; earlier growth does not; hosts
// without a sample are unknown, named, and do not refuse.
func TestDecide(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	since := now.Add(-5 * time.Hour) // the key stopped signing
	rec := func(growth time.Time) Record {
		return Record{LastGrowth: growth, LastSample: now.Add(-time.Minute)}
	}
	for _, tc := range []struct {
		name     string
		recs     map[string]Record
		hosts    []string
		window   time.Duration
		refusing string
		unknown  string
	}{
		{"grew within the window, after since+1h: refused", map[string]Record{"m1": rec(now.Add(-10 * time.Minute)), "m2": rec(time.Time{})}, []string{"m1", "m2"}, time.Hour,
			"m1 at 2026-12-01T11:50:00Z", ""},
		{"grew before since+1h: allowed", map[string]Record{"m1": rec(since.Add(30 * time.Minute))}, []string{"m1"}, 24 * time.Hour, "", ""},
		{"grew after since+1h but before the window: allowed", map[string]Record{"m1": rec(now.Add(-2 * time.Hour))}, []string{"m1"}, time.Hour, "", ""},
		{"no sample: unknown, allowed, named", map[string]Record{"m1": rec(time.Time{})}, []string{"m1", "m3"}, time.Hour, "", "m3 (never sampled)"},
		{"sampled before the window: unknown", map[string]Record{"m1": {LastSample: now.Add(-3 * time.Hour)}}, []string{"m1"}, time.Hour, "", "m1 (last sampled 2026-12-01T09:00:00Z)"},
		{"a record of a host without a trust record counts", map[string]Record{"m4": rec(now.Add(-time.Minute))}, nil, time.Hour, "m4 at 2026-12-01T11:59:00Z", ""},
		{"several hosts named", map[string]Record{"m1": rec(now.Add(-time.Minute)), "m2": rec(now.Add(-2 * time.Minute))}, []string{"m1", "m2"}, time.Hour,
			"m1 at 2026-12-01T11:59:00Z, m2 at 2026-12-01T11:58:00Z", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := Decide(tc.recs, tc.hosts, since, now, tc.window)
			if v.String() != tc.refusing || v.UnknownString() != tc.unknown {
				t.Errorf("refusing %q unknown %q, want %q and %q", v, v.UnknownString(), tc.refusing, tc.unknown)
			}
		})
	}
}
