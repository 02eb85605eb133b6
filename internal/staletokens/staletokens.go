// Package staletokens is the evidence retire-keys weighs about stale
// service-account tokens: each apiserver's serviceaccount_stale_tokens_total
// counter (read from its /metrics), sampled by a long-running Sampler on
// every master and recorded in etcd at ROTATION-PREFIX/HOST/stale-tokens as
// the last time the counter grew, and the decision whether that growth
// forbids retiring a superseded key.
//
// kube-apiserver (pkg/serviceaccount/claims.go) increments the counter each
// time it accepts a token past its kubernetes.io.warnafter claim: issue +
// 3607 s, set on the extended tokens admission injects into pods. A client
// that uses such a token has not re-read its token file for over an hour,
// and may hold a token signed with a key that stopped signing: retiring the
// key would make every apiserver refuse it. The counter lives in the
// apiserver's memory (no labels) and restarts from 0 with it, so a sample
// only means something against the previous one of the same process.
package staletokens

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
)

// The metrics read, as kube-apiserver v1.37 names them:
// pkg/serviceaccount/metrics.go (subsystem "serviceaccount", a BETA
// counter without labels) and component-base's process start time.
const (
	CounterMetric   = "serviceaccount_stale_tokens_total"
	StartTimeMetric = "process_start_time_seconds"
)

// StaleAfter is how long after a key stopped signing a stale use counts as
// evidence against retiring it: kube-apiserver counts a token as stale
// 3607 s after its issue (WarnOnlyBoundTokenExpirationSeconds), so uses
// within the first hour may be of tokens any key signed before. One hour,
// not 3607 s: the shorter margin refuses more, never less.
const StaleAfter = time.Hour

// recordName is the record's last path element under the rotation prefix.
const recordName = "stale-tokens"

// Key is host's record: ROTATION-PREFIX/HOST/stale-tokens.
func Key(prefix, host string) string { return etcdkey.Join(prefix, host, recordName) }

// Sample is what one read of an apiserver's /metrics says.
type Sample struct {
	// Present is false when the counter is not exposed (an apiserver
	// older than the metric, or one built without it): Value is then 0.
	Present bool
	Value   float64
	// StartTime is the apiserver's process_start_time_seconds; zero when
	// not exposed.
	StartTime time.Time
}

// Parse reads Prometheus text exposition (what kube-apiserver's /metrics
// serves) with Prometheus' own parser and returns the stale-token counter
// and the process start time. A counter of another type is an error: the
// metric is not the one this package knows.
func Parse(r io.Reader) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("parse the metrics text: %w", err)
	}
	var s Sample
	if f := fams[CounterMetric]; f != nil {
		if f.GetType() != dto.MetricType_COUNTER || len(f.GetMetric()) != 1 {
			return Sample{}, fmt.Errorf("%s: a %s with %d series, want one counter: not the metric kube-apiserver's pkg/serviceaccount exposes", CounterMetric, f.GetType(), len(f.GetMetric()))
		}
		s.Present, s.Value = true, f.GetMetric()[0].GetCounter().GetValue()
	}
	if f := fams[StartTimeMetric]; f != nil && len(f.GetMetric()) == 1 {
		m := f.GetMetric()[0]
		v := m.GetGauge().GetValue()
		if m.GetUntyped() != nil {
			v = m.GetUntyped().GetValue()
		}
		if v > 0 {
			sec, frac := math.Modf(v)
			s.StartTime = time.Unix(int64(sec), int64(frac*1e9)).UTC()
		}
	}
	return s, nil
}

// Record is one host's record in etcd.
type Record struct {
	Host string `json:"host"`
	// LastGrowth is when a sample last found the counter grown (zero:
	// never seen growing). Growth happened between the previous sample
	// and this time; the later bound is recorded, which refuses longer.
	LastGrowth time.Time `json:"last_growth,omitzero"`
	// LastSample is when the apiserver was last read. The record is
	// written when something changed, and otherwise at most every
	// Heartbeat, so this lags by up to that much.
	LastSample time.Time `json:"last_sample"`
	Counter    float64   `json:"counter"`
	// Absent: the apiserver does not expose the counter.
	Absent bool `json:"absent,omitempty"`
	// StartTime is the apiserver's start (zero: not exposed): a
	// different one means the counter started again from 0.
	StartTime time.Time `json:"apiserver_start_time,omitzero"`
}

// sameProcess says whether s comes from the apiserver process prev did.
// Without start times a counter that went down is the only sign of a
// restart; the times are compared to the second, as floats round.
func sameProcess(prev Record, s Sample) bool {
	if s.Value < prev.Counter {
		return false
	}
	if prev.StartTime.IsZero() || s.StartTime.IsZero() {
		return true
	}
	d := prev.StartTime.Sub(s.StartTime)
	return d > -time.Second && d < time.Second
}

// Observe is host's record after sample s at now, given the previous
// record (nil: none). Growth is measured against the previous value of the
// same apiserver process; after a restart the baseline is 0, the counter's
// value at the start, so any value is growth since. Without a previous
// record a non-zero counter grew at some time since the apiserver started,
// unknown when: it is taken as now.
func Observe(prev *Record, host string, s Sample, now time.Time) Record {
	r := Record{Host: host, LastSample: now.UTC(), Counter: s.Value, Absent: !s.Present, StartTime: s.StartTime}
	base := 0.0
	if prev != nil {
		r.LastGrowth = prev.LastGrowth
		if sameProcess(*prev, s) {
			base = prev.Counter
		}
	}
	if s.Value > base {
		r.LastGrowth = now.UTC()
	}
	return r
}

// changed says whether r says something prev did not, beyond a later
// sample time: what makes the Sampler write before the heartbeat is due.
func changed(prev *Record, r Record) bool {
	return prev == nil || prev.Counter != r.Counter || prev.Absent != r.Absent || !prev.LastGrowth.Equal(r.LastGrowth) ||
		!prev.StartTime.Equal(r.StartTime) || prev.Host != r.Host
}

// List reads every host's record under the rotation prefix. A record that
// does not parse is returned as a problem naming its key, not an error: one
// bad record must not hide the others (its host is then unknown).
func List(ctx context.Context, kv clientv3.KV, prefix string) (map[string]Record, []string, error) {
	dir := etcdkey.Dir(prefix)
	resp, err := kv.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("read stale-token records under %s: %w", dir, err)
	}
	recs := map[string]Record{}
	var problems []string
	for _, k := range resp.Kvs {
		host, what, ok := strings.Cut(strings.TrimPrefix(string(k.Key), dir), "/")
		if !ok || host == "" || what != recordName {
			continue
		}
		var r Record
		if err := json.Unmarshal(k.Value, &r); err != nil {
			problems = append(problems, fmt.Sprintf("%s is not a stale-token record (%v): the sampler on %s rewrites it", k.Key, err, host))
			continue
		}
		r.Host = host
		recs[host] = r
	}
	return recs, problems, nil
}

// Verdict is what the records say about retiring one key, each host
// named as the logs show it.
type Verdict struct {
	// Refusing: counters that grew within the window and more than
	// StaleAfter after the key stopped signing ("m1 at T").
	Refusing []string
	// Unknown apiservers do not refuse; they are named: "m3 (never
	// sampled)", "m4 (last sampled T)".
	Unknown []string
}

// Decide weighs the records about a key superseded at since (when it
// stopped signing): a counter that grew within window before now, and
// more than StaleAfter after since, refuses it. hosts are the apiservers
// expected to have a record (those with a trust record); any of them
// without one, or with one not sampled within the window, is unknown.
func Decide(recs map[string]Record, hosts []string, since, now time.Time, window time.Duration) Verdict {
	var v Verdict
	all := slices.Concat(hosts, slices.Collect(maps.Keys(recs)))
	slices.Sort(all)
	from := now.Add(-window)
	for _, h := range slices.Compact(all) {
		r, ok := recs[h]
		switch g := r.LastGrowth; {
		case !g.IsZero() && g.After(since.Add(StaleAfter)) && !g.Before(from):
			v.Refusing = append(v.Refusing, h+" at "+g.UTC().Format(time.RFC3339))
		case !ok || r.LastSample.IsZero() && r.LastSample.Before(from):
			v.Unknown = append(v.Unknown, h+" (never sampled)")
		case r.LastSample.Before(from):
			v.Unknown = append(v.Unknown, h+" (last sampled "+r.LastSample.UTC().Format(time.RFC3339)+")")
		}
	}
	return v
}

// String names the refusing hosts and times: "m1 at T, m2 at T".
func (v Verdict) String() string { return strings.Join(v.Refusing, ", ") }

// UnknownString names the unknown hosts: "m3 (never sampled), m4 (last
// sampled T)".
func (v Verdict) UnknownString() string { return strings.Join(v.Unknown, ", ") }
