package fleetstate

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/hold"
	"github.com/keysync/confd/saferestart/internal/lock"
	"github.com/keysync/confd/saferestart/internal/rotation"
	"github.com/keysync/confd/saferestart/internal/status"
)

var t0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// scrape gathers c once, as name{label="value",...} → value.
func scrape(t *testing.T, c *Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			name := mf.GetName()
			if len(ls) > 0 {
				name += "{" + strings.Join(ls, ",") + "}"
			}
			out[name] = m.GetGauge().GetValue()
		}
	}
	return out
}

func fixed(s *Snapshot) func(context.Context) (*Snapshot, error) {
	return func(context.Context) (*Snapshot, error) { return s, nil }
}

// fleet: m1 restarted and trusts every key, mid-rotation with a superseded
// key past due; m2 published but has no trust record; m3 was forgotten:
// only its key record is left, with a superseded key not yet due.
func fleet() *Snapshot {
	return &Snapshot{
		Trust: &trust.Report{
			Published: []string{"k1a", "k1b", "k2"},
			Hosts: []trust.Host{
				{Host: "m1", Publishes: []string{"k1a", "k1b"}, Record: &trust.Record{Host: "m1", Trusted: []string{"k1a", "k1b", "k2"}, Time: t0.Add(-time.Hour)}},
				{Host: "m2", Publishes: []string{"k2"}},
			},
			Lifecycle: map[string]keystate.HostKeys{
				"m1": {Host: "m1", Current: []string{"k1b"}, Superseded: []keystate.SupersededKey{{KID: "k1a", RetireAfter: t0.Add(-90 * time.Second)}}},
				"m2": {Host: "m2", Current: []string{"k2"}},
				"m3": {Host: "m3", Superseded: []keystate.SupersededKey{{KID: "k3", RetireAfter: t0.Add(time.Hour)}}, Forgotten: &t0},
			},
		},
		Report: status.Report{Rotations: []rotation.HostRecords{
			{Host: "m1", State: &rotation.State{Host: "m1", Phase: rotation.PhaseInstalled, Updated: t0.Add(-10 * time.Minute)}},
			{Host: "m4", StateError: "not a rotation record"},
		}},
		StaleTokens: map[string]staletokens.Record{"m1": {Host: "m1", Counter: 7}},
	}
}

func TestCollectorHosts(t *testing.T) {
	got := scrape(t, &Collector{Read: fixed(fleet()), Now: func() time.Time { return t0 }})
	want := map[string]float64{
		`kube_apiserver_safe_restart_fleet_state_up`:                                  1,
		`kube_apiserver_safe_restart_fleet_state_timestamp_seconds`:                   float64(t0.Unix()),
		`kube_apiserver_safe_restart_published_keys{host="m1"}`:                       2,
		`kube_apiserver_safe_restart_published_keys{host="m2"}`:                       1,
		`kube_apiserver_safe_restart_published_keys{host="m3"}`:                       0,
		`kube_apiserver_safe_restart_superseded_keys{host="m1"}`:                      1,
		`kube_apiserver_safe_restart_superseded_keys{host="m2"}`:                      0,
		`kube_apiserver_safe_restart_superseded_keys{host="m4"}`:                      0,
		`kube_apiserver_safe_restart_key_retirement_due_seconds{host="m1",kid="k1a"}`: -90,
		`kube_apiserver_safe_restart_key_retirement_due_seconds{host="m3",kid="k3"}`:  3600,
		`kube_apiserver_safe_restart_untrusted_keys{host="m1"}`:                       0,
		`kube_apiserver_safe_restart_untrusted_keys{host="m2"}`:                       3,
		`kube_apiserver_safe_restart_untrusted_keys{host="m3"}`:                       0, // forgotten: must trust nothing
		`kube_apiserver_safe_restart_last_restart_timestamp_seconds{host="m1"}`:       float64(t0.Add(-time.Hour).Unix()),
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="installed"}`:     1,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="none"}`:          0,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="none"}`:          1,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="installed"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="none"}`:          0,
		`kube_apiserver_safe_restart_rotation_phase_age_seconds{host="m1"}`:           600,
		`kube_apiserver_safe_restart_stale_tokens{host="m1"}`:                         7,
		`kube_apiserver_safe_restart_hold_active`:                                     0,
		`kube_apiserver_safe_restart_lock_held`:                                       0,
		`kube_apiserver_safe_restart_lock_holder_age_seconds`:                         0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="rolling-back"}`:  0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="generated"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="rolling-back"}`:  0,
		`kube_apiserver_safe_restart_untrusted_keys{host="m4"}`:                       3,
		`kube_apiserver_safe_restart_published_keys{host="m4"}`:                       0,
		`kube_apiserver_safe_restart_superseded_keys{host="m3"}`:                      1,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="none"}`:          1,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="generated"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="generated"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="installed"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="installed"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="generated"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="rolling-back"}`:  0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="rolling-back"}`:  0,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="published"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="installing"}`:    0,
		`kube_apiserver_safe_restart_rotation_phase{host="m1",phase="retired"}`:       0,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="published"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="installing"}`:    0,
		`kube_apiserver_safe_restart_rotation_phase{host="m2",phase="retired"}`:       0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="published"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="installing"}`:    0,
		`kube_apiserver_safe_restart_rotation_phase{host="m3",phase="retired"}`:       0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="published"}`:     0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="installing"}`:    0,
		`kube_apiserver_safe_restart_rotation_phase{host="m4",phase="retired"}`:       0,
	}
	for name, v := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s missing", name)
		case g != v:
			t.Errorf("%s = %v, want %v", name, g, v)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("unexpected %s = %v", name, got[name])
		}
	}
}

func TestCollectorHoldAndLock(t *testing.T) {
	acquired := t0.Add(-30 * time.Second)
	tests := []struct {
		name string
		hold *hold.Record
		lock *lock.Entry
		want map[string]float64
		gone []string
	}{
		{name: "free", want: map[string]float64{
			`kube_apiserver_safe_restart_hold_active`: 0, `kube_apiserver_safe_restart_lock_held`: 0, `kube_apiserver_safe_restart_lock_holder_age_seconds`: 0},
			gone: []string{`kube_apiserver_safe_restart_hold_info{host="m2"}`, `kube_apiserver_safe_restart_lock_holder_info{host="m1"}`}},
		{name: "held", hold: &hold.Record{Host: "m2", Reason: "maintenance", Time: t0},
			lock: &lock.Entry{Key: "l/1", Lease: "1", CreateRevision: 5, Info: &lock.Info{Host: "m1", Acquired: &acquired}},
			want: map[string]float64{
				`kube_apiserver_safe_restart_hold_active`: 1, `kube_apiserver_safe_restart_hold_info{host="m2"}`: 1,
				`kube_apiserver_safe_restart_lock_held`: 1, `kube_apiserver_safe_restart_lock_holder_age_seconds`: 30,
				`kube_apiserver_safe_restart_lock_holder_info{host="m1"}`: 1}},
		{name: "etcdctl lock, raw hold", hold: &hold.Record{Raw: "by hand"},
			lock: &lock.Entry{Key: "l/2", Lease: "2", CreateRevision: 6},
			want: map[string]float64{
				`kube_apiserver_safe_restart_hold_info{host="unknown"}`: 1,
				`kube_apiserver_safe_restart_lock_held`:                 1, `kube_apiserver_safe_restart_lock_holder_age_seconds`: 0,
				`kube_apiserver_safe_restart_lock_holder_info{host="unknown"}`: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := scrape(t, &Collector{Read: fixed(&Snapshot{Report: status.Report{Hold: tt.hold, Holder: tt.lock}}), Now: func() time.Time { return t0 }})
			for name, v := range tt.want {
				if g, ok := got[name]; !ok || g != v {
					t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
				}
			}
			for _, name := range tt.gone {
				if _, ok := got[name]; ok {
					t.Errorf("%s present", name)
				}
			}
		})
	}
}

// A holder that records no acquired time is aged from when this collector
// first saw it; a new holder starts again from 0.
func TestCollectorHolderFirstSeen(t *testing.T) {
	now := t0
	s := &Snapshot{Report: status.Report{Holder: &lock.Entry{Key: "l/1", CreateRevision: 5}}}
	c := &Collector{Read: fixed(s), Now: func() time.Time { return now }}
	const age = `kube_apiserver_safe_restart_lock_holder_age_seconds`
	if got := scrape(t, c)[age]; got != 0 {
		t.Fatalf("first scrape: %s = %v, want 0", age, got)
	}
	now = t0.Add(40 * time.Second)
	if got := scrape(t, c)[age]; got != 40 {
		t.Fatalf("same holder 40 s later: %s = %v, want 40", age, got)
	}
	s.Holder = &lock.Entry{Key: "l/2", CreateRevision: 9}
	if got := scrape(t, c)[age]; got != 0 {
		t.Fatalf("new holder: %s = %v, want 0", age, got)
	}
}

// A failed read: fleet_state_up 0, counted each time, logged when it
// starts failing and when it recovers; the gauges keep the last read.
func TestCollectorReadFails(t *testing.T) {
	logger, hook := test.NewNullLogger()
	fail := true
	failures := 0
	var gotDeadline bool
	c := &Collector{
		Read: func(ctx context.Context) (*Snapshot, error) {
			_, gotDeadline = ctx.Deadline()
			if fail {
				return nil, errors.New("etcd cut")
			}
			return &Snapshot{Report: status.Report{Hold: &hold.Record{Host: "m2", Reason: "x"}}}, nil
		},
		Failed: func() { failures++ },
		Log:    logger,
		Now:    func() time.Time { return t0 },
	}
	got := scrape(t, c)
	if !gotDeadline {
		t.Error("the read has no deadline: a scrape on a cut etcd would hang")
	}
	if got[`kube_apiserver_safe_restart_fleet_state_up`] != 0 || got[`kube_apiserver_safe_restart_fleet_state_timestamp_seconds`] != 0 {
		t.Errorf("before any read: %v", got)
	}
	if _, ok := got[`kube_apiserver_safe_restart_hold_active`]; !ok {
		t.Error("hold_active missing before the first successful read")
	}
	scrape(t, c)
	if failures != 2 || len(hook.AllEntries()) != 1 || hook.LastEntry().Level != logrus.WarnLevel {
		t.Fatalf("two failed reads: %d counted, log %v; want 2 counted, one warning", failures, hook.AllEntries())
	}
	fail = false
	got = scrape(t, c)
	if got[`kube_apiserver_safe_restart_fleet_state_up`] != 1 || got[`kube_apiserver_safe_restart_hold_active`] != 1 {
		t.Errorf("after recovery: %v", got)
	}
	if len(hook.AllEntries()) != 2 || hook.LastEntry().Level != logrus.InfoLevel {
		t.Errorf("recovery not logged once: %v", hook.AllEntries())
	}
	fail = true
	got = scrape(t, c)
	if got[`kube_apiserver_safe_restart_fleet_state_up`] != 0 || got[`kube_apiserver_safe_restart_hold_active`] != 1 ||
		got[`kube_apiserver_safe_restart_fleet_state_timestamp_seconds`] != float64(t0.Unix()) {
		t.Errorf("failing after a read: want up 0, the last read's hold and time: %v", got)
	}
}

// A read that etcd never answers ends at Timeout: the scrape answers,
// fleet_state_up 0.
func TestCollectorReadBounded(t *testing.T) {
	logger, _ := test.NewNullLogger()
	c := &Collector{
		Read: func(ctx context.Context) (*Snapshot, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		Timeout: time.Millisecond,
		Log:     logger,
	}
	if got := scrape(t, c); got[`kube_apiserver_safe_restart_fleet_state_up`] != 0 {
		t.Errorf("fleet_state_up = %v after a read that never ended", got[`kube_apiserver_safe_restart_fleet_state_up`])
	}
}
