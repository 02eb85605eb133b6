package staletokens

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fakeKV is the two calls a Sampler makes, so that its write policy is
// tested without etcd (the saferestart tests run it on a real one).
type fakeKV struct {
	clientv3.KV
	data map[string]string
	puts int
}

func (f *fakeKV) Get(_ context.Context, key string, _ ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp := &clientv3.GetResponse{}
	if v, ok := f.data[key]; ok {
		resp.Kvs = []*mvccpb.KeyValue{{Key: []byte(key), Value: []byte(v)}}
	}
	return resp, nil
}

func (f *fakeKV) Put(_ context.Context, key, val string, _ ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	f.data[key] = val
	f.puts++
	return &clientv3.PutResponse{}, nil
}

// metricsServer is a stand-in apiserver /metrics over TLS that wants the
// bearer token, with a counter and start time the test sets.
type metricsServer struct {
	*httptest.Server
	counter, start atomic.Int64
	caFile         string
	status         atomic.Int32
}

func newMetricsServer(t *testing.T, token string) *metricsServer {
	m := &metricsServer{}
	m.start.Store(1796427859)
	m.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token || r.URL.Path != "/metrics" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if c := m.status.Load(); c != 0 {
			w.WriteHeader(int(c))
			return
		}
		fmt.Fprintf(w, "# HELP %[1]s [BETA] Cumulative stale projected service account tokens used\n# TYPE %[1]s counter\n%[1]s %[2]d\n"+
			"# HELP %[3]s Start time of the process since unix epoch in seconds.\n# TYPE %[3]s gauge\n%[3]s %[4]d.72\n",
			CounterMetric, m.counter.Load(), StartTimeMetric, m.start.Load())
	}))
	t.Cleanup(m.Close)
	m.caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(m.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

// The record is written on the first sample, on growth and on a restart,
// and otherwise only once the heartbeat is due; the token is sent and
// never logged; a refusal names the RBAC it needs.
func TestSamplerWritesOnlyWhatChanged(t *testing.T) {
	const secret = "BEARER-TOKEN-NEVER-LOGGED"
	m := newMetricsServer(t, secret)
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kv := &fakeKV{data: map[string]string{}}
	var logs bytes.Buffer
	log := logrus.New()
	log.Out = &logs
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	s := &Sampler{Client: ClientConfig{URL: m.URL + "/metrics", CACert: m.caFile, TokenFile: tok}, KV: kv, Prefix: "/rot/", Host: "m1",
		Log: log, Now: func() time.Time { return now }}
	key := "/rot/m1/stale-tokens"
	record := func() Record {
		var r Record
		if err := json.Unmarshal([]byte(kv.data[key]), &r); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return r
	}
	step := func(d time.Duration, wantPuts int) Record {
		t.Helper()
		now = now.Add(d)
		if err := s.Once(context.Background()); err != nil {
			t.Fatal(err)
		}
		if kv.puts != wantPuts {
			t.Fatalf("after %s: %d writes, want %d", d, kv.puts, wantPuts)
		}
		return record()
	}
	if r := step(0, 1); !r.LastGrowth.IsZero() || r.Host != "m1" || r.StartTime.Unix() != 1796427859 {
		t.Fatalf("first sample: %+v", r)
	}
	step(time.Minute, 1) // unchanged
	step(time.Minute, 1)
	m.counter.Store(2)
	if r := step(time.Minute, 2); !r.LastGrowth.Equal(now) || r.Counter != 2 {
		t.Fatalf("growth: %+v", r)
	}
	grew := now
	if r := step(15*time.Minute, 3); !r.LastGrowth.Equal(grew) || !r.LastSample.Equal(now) {
		t.Fatalf("heartbeat: %+v", r)
	}
	// A restart to 0 is not growth, but is written (a new baseline).
	m.counter.Store(0)
	m.start.Add(3600)
	if r := step(time.Minute, 4); !r.LastGrowth.Equal(grew) || r.Counter != 0 {
		t.Fatalf("restart: %+v", r)
	}
	// A new sampler (the publisher restarted) measures against etcd's record.
	s2 := *s
	s2.prev, s2.http = nil, nil
	m.counter.Store(1)
	now = now.Add(time.Minute)
	if err := s2.Once(context.Background()); err != nil || !record().LastGrowth.Equal(now) {
		t.Fatalf("restarted sampler: %v %+v", err, record())
	}
	m.status.Store(http.StatusForbidden)
	err := s.Once(context.Background())
	if err == nil || !strings.Contains(err.Error(), "non-resource URL /metrics") {
		t.Fatalf("403: %v", err)
	}
	if strings.Contains(logs.String()+err.Error(), secret) {
		t.Error("the bearer token reached a log or an error")
	}
	if err := (&Sampler{Client: ClientConfig{URL: "ftp://x"}, Host: "m1"}).Once(context.Background()); err == nil {
		t.Error("an ftp URL accepted")
	}
}

// Run samples at once, then every interval, until ctx ends.
func TestRunStopsWithContext(t *testing.T) {
	m := newMetricsServer(t, "t")
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	kv := &fakeKV{data: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := &Sampler{Client: ClientConfig{URL: m.URL + "/metrics", CACert: m.caFile, TokenFile: tok}, KV: kv, Prefix: "/rot", Host: "m1", Log: logrus.StandardLogger()}
	go func() { done <- s.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := (&Sampler{Client: ClientConfig{URL: m.URL, CACert: "/nonexistent"}, Host: "m1"}).Run(context.Background()); err == nil || !strings.Contains(err.Error(), "--health-cacert") {
		t.Fatalf("a missing CA: %v", err)
	}
}
