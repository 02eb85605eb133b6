//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// staleTokens: retire-keys weighs the stale-token evidence the publishers
// collect (issue 31 point 5). Every master's publisher, run by the shipped
// unit with the shipped apiserver-metrics-url, reads its real apiserver's
// /metrics: each host's ROTATION-PREFIX/HOST/stale-tokens record holds a
// parsed counter. A removed master's key is due (superseded two hours ago,
// its grace over); m1's sampler is pointed at a stand-in /metrics whose
// serviceaccount_stale_tokens_total grows (a real apiserver counts a use
// only an hour after a token's issue): retire-keys keeps the key, naming
// m1, exit 0; once no counter grew within --stale-token-window, it
// retires it, and every bundle drops it.
func (f *fleet) staleTokens(t *testing.T) {
	m1, m2 := f.hosts[0], f.hosts[1]
	const rotation = "/kubernetes/service-account-keys-rotation/"
	type sample struct {
		Host       string    `json:"host"`
		LastGrowth time.Time `json:"last_growth"`
		LastSample time.Time `json:"last_sample"`
		Counter    float64   `json:"counter"`
		Absent     bool      `json:"absent"`
	}
	read := func(h *host) (sample, bool) {
		key := rotation + h.name + "/stale-tokens"
		v, ok := f.etcdKeys(t, key)[key]
		var s sample
		if ok {
			if err := json.Unmarshal([]byte(v), &s); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		return s, ok
	}
	// The real apiservers' /metrics, read and parsed by each publisher.
	for _, h := range f.hosts {
		f.await(t, 2*time.Minute, h.name+"'s stale-token record", func() bool {
			_, ok := read(h)
			return ok
		})
		if s, _ := read(h); s.Absent || s.LastSample.IsZero() {
			t.Fatalf("%s's sampler record %+v: want the real apiserver's counter", h.name, s)
		}
	}

	// A removed master's key, superseded two hours ago, its grace over.
	gone := newSAKey(t)
	const goneHost = "m9.fleet.test"
	now := time.Now()
	rec, _ := json.Marshal(map[string]any{"host": goneHost, "forgotten": now.Add(-2 * time.Hour),
		"superseded": map[string]any{gone.kid: map[string]any{"since": now.Add(-2 * time.Hour),
			"retire_after": now.Add(-time.Hour), "pem": string(gone.public), "by": "forget-host"}}})
	f.put(t, rotation+goneHost+"/kept", string(rec))
	f.put(t, keyPrefix+goneHost, string(gone.public))
	f.awaitConverged(t, 4*time.Minute)

	// m1's sampler reads a stand-in whose counter grows.
	var counter atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE serviceaccount_stale_tokens_total counter\nserviceaccount_stale_tokens_total %d\n", counter.Add(1))
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	cfg := string(m1.read(configPath))
	url := regexp.MustCompile(`(?m)^apiserver-metrics-url = .*$`)
	if !url.MatchString(cfg) {
		t.Fatalf("%s has no apiserver-metrics-url:\n%s", configPath, cfg)
	}
	m1.write(configPath, url.ReplaceAllString(cfg, `apiserver-metrics-url = "http://`+ln.Addr().String()+`/metrics"`), 0o644)
	defer func() {
		m1.write(configPath, cfg, 0o644)
		m1.unitCtl(t, "restart", publisherUnit)
	}()
	m1.unitCtl(t, "restart", publisherUnit) // samples at its start
	f.await(t, time.Minute, "m1's sampler recording growth", func() bool {
		s, _ := read(m1)
		return now.Before(s.LastGrowth)
	})

	code, out := m2.retireKeys(t)
	if code != 0 || !strings.Contains(out, "stale service-account tokens were used on "+m1.name) {
		t.Fatalf("retire-keys while m1's counter grows: exit %d, want 0 keeping %s and naming %s:\n%s", code, gone.kid, m1.name, out)
	}
	if !strings.Contains(f.etcdKeys(t, keyPrefix+goneHost)[keyPrefix+goneHost], string(gone.public)) {
		t.Fatalf("%s retired while stale tokens are in use", gone.kid)
	}
	t.Logf("retire-keys kept %s while stale tokens were used on %s", gone.kid, m1.name)

	// The counter stops growing: m1's sampler reads its real apiserver
	// again, whose counter is lower (taken as a restart, not as growth).
	// Once the last growth is older than the window (shortened here: it
	// is an hour by default), the key goes.
	grew, _ := read(m1)
	m1.write(configPath, cfg, 0o644)
	restarted := time.Now()
	m1.unitCtl(t, "restart", publisherUnit)
	f.await(t, time.Minute, "m1's sampler reading its apiserver again", func() bool {
		s, _ := read(m1)
		return s.LastSample.After(restarted)
	})
	if s, _ := read(m1); !s.LastGrowth.Equal(grew.LastGrowth) {
		t.Fatalf("m1's sampler took its apiserver's counter for growth: %+v (before: %+v)", s, grew)
	}
	window := (time.Since(grew.LastGrowth) / 2).Round(time.Millisecond)
	code, out = m2.helper(t, "retire-keys", "--stale-token-window", window.String(),
		"--signing-key", m2.Path("/etc/kubernetes/pki/sa.key"), "--public-key", m2.Path("/etc/kubernetes/pki/sa.pub"))
	if code != 0 || strings.Contains(out, "stale service-account tokens were used") {
		t.Fatalf("retire-keys once the counters stopped (window %s): exit %d:\n%s", window, code, out)
	}
	f.await(t, time.Minute, goneHost+"'s value gone with its last key", func() bool {
		_, ok := f.etcdKeys(t, keyPrefix+goneHost)[keyPrefix+goneHost]
		return !ok
	})
	f.awaitConverged(t, 4*time.Minute)
	for _, h := range f.hosts {
		if strings.Contains(string(h.read("/etc/kubernetes/pki/sa-bundle.pem")), string(gone.public)) {
			t.Errorf("%s's bundle still holds the retired key %s", h.name, gone.kid)
		}
	}
}
