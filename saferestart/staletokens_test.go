package saferestart

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/staletokens"
	"github.com/keysync/confd/internal/trust"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/keycmd"
)

// On a real etcd: the sampler, configured by the flags the publisher
// takes (--apiserver-metrics-url and the health gate's credentials),
// records a stand-in apiserver's counter growth; retire-keys then keeps the
// due key, naming the host and the time and the host never sampled (exit
// 0), and retires it once the growth is older than --stale-token-window.
func TestRetireKeysWeighsStaleTokens(t *testing.T) {
	const secret = "METRICS-TOKEN-NEVER-LOGGED"
	var counter atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "# TYPE %[1]s counter\n%[1]s %[2]d\n# TYPE %[3]s gauge\n%[3]s 1.79642785972e+09\n",
			staletokens.CounterMetric, counter.Load(), staletokens.StartTimeMetric)
	}))
	defer srv.Close()
	e := newPublishEnv(t)
	ca := e.file(t, "apiserver-ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	tok := e.file(t, "metrics.token", []byte(secret+"\n"))
	a, b := newTestKey(t, true), newTestKey(t, true)
	pub := e.file(t, "sa.pub", a.pkix)
	if code, _, _, stderr := e.run(t, "--public-key", pub); code != cmdkit.ExitOK {
		t.Fatalf("publish a: %s", stderr)
	}
	e.file(t, "sa.pub", b.pkix)
	if code, _, _, stderr := e.run(t, "--public-key", pub, "--grace", "0"); code != cmdkit.ExitOK {
		t.Fatalf("publish b: %s", stderr)
	}
	// a stopped signing three hours ago, its grace is over.
	now := time.Now()
	kept, _ := json.Marshal(map[string]any{"host": e.host, "superseded": map[string]any{a.kid: map[string]any{
		"since": now.Add(-3 * time.Hour), "retire_after": now.Add(-time.Hour), "pem": string(a.pkix), "by": "publish-key"}}})
	e.srv.Put(t, "/kubernetes/service-account-keys-rotation/"+e.host+"/kept", string(kept))
	ctx := context.Background()
	cli := e.srv.Client(t)
	for _, h := range []string{e.host, "m2.example"} {
		if err := trust.Put(ctx, cli, trust.DefaultPrefix, "", trust.Record{Host: h, Trusted: []string{a.kid, b.kid}, Signing: b.kid, Time: now}); err != nil {
			t.Fatal(err)
		}
	}

	o, _, err := parseArgs([]string{"publish-key", "--config", "", "--endpoints", e.srv.Endpoint, "--host", e.host,
		"--apiserver-metrics-url", srv.URL + "/metrics", "--health-cacert", ca, "--health-token-file", tok}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := logrus.New()
	log.Out = &logs
	s := opts[*keycmd.PublishKey](t, o).StaleTokenSampler(ctx, o.env(io.Discard, log), cli)
	clock := now.Add(-20 * time.Minute)
	s.Now = func() time.Time { return clock }
	if err := s.Once(ctx); err != nil {
		t.Fatal(err)
	}
	counter.Store(3)
	clock = now.Add(-10 * time.Minute)
	if err := s.Once(ctx); err != nil {
		t.Fatal(err)
	}
	grew := clock.UTC().Format(time.RFC3339)

	retire := func(extra ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, nil, append([]string{"retire-keys", "--config", "", "--endpoints", e.srv.Endpoint, "--host", e.host,
			"--signing-key", filepath.Join(e.dir, "sa.key"), "--public-key", pub}, extra...), &out, &errb)
		resp, err := cli.Get(ctx, "/kubernetes/service-account-keys/"+e.host)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("published value: %v", err)
		}
		return code, string(resp.Kvs[0].Value), errb.String()
	}
	e.file(t, "sa.key", b.pkcs8)
	code, value, stderr := retire()
	if code != cmdkit.ExitOK || !strings.Contains(value, string(a.pkix)) {
		t.Fatalf("retire-keys while stale tokens are used: exit %d, a retired: %v\n%s", code, !strings.Contains(value, string(a.pkix)), stderr)
	}
	for _, want := range []string{"stale service-account tokens were used on " + e.host + " at " + grew, "m2.example (never sampled)"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("retire-keys does not say %q:\n%s", want, stderr)
		}
	}
	// The window has passed (a window shorter than the growth's age).
	if code, value, stderr := retire("--stale-token-window", "5m"); code != cmdkit.ExitOK || strings.Contains(value, string(a.pkix)) {
		t.Fatalf("retire-keys once the window passed: exit %d value %q\n%s", code, value, stderr)
	}
	if strings.Contains(logs.String()+stderr, secret) {
		t.Error("the metrics token reached a log")
	}
	if _, err := os.Stat(tok); err != nil {
		t.Fatal(err)
	}
}
