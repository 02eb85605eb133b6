package tokenprobe

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"
)

// secretToken is what the fake issuer hands out; it must never be logged.
const secretToken = "eyJhbGciOiJSUzI1NiJ9.probe-secret-token.c2lnbmF0dXJl"

const probeUser = "system:serviceaccount:kube-system:kube-apiserver-token-probe"

// verifier answers SelfSubjectReviews as one kind of apiserver.
func verifier(t *testing.T, kind string) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/authentication.k8s.io/v1/selfsubjectreviews" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) > 0 {
			t.Errorf("review with a client certificate: the token must be the only credential")
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Header.Get("Authorization") != "Bearer "+secretToken:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","code":401}`)
		case kind == "accepted":
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"kind":"SelfSubjectReview","apiVersion":"authentication.k8s.io/v1","status":{"userInfo":{"username":%q}}}`, probeUser)
		case kind == "401":
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Unauthorized","code":401}`)
		case kind == "500":
			// A broken proxy that echoes the request's credential.
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"internal error for %s","code":500}`, r.Header.Get("Authorization"))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// issuer is this host's apiserver: TokenRequest, the kubernetes Service's
// EndpointSlices (slices, when set), and reviews as an accepting verifier.
type issuer struct {
	srv      *httptest.Server
	mu       sync.Mutex
	slices   string
	tokenErr int // answer TokenRequests with this status when set
	requests []map[string]any
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	is := &issuer{}
	accept := verifier(t, "accepted")
	is.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.mu.Lock()
		defer is.mu.Unlock()
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/kube-system/serviceaccounts/kube-apiserver-token-probe/token":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			is.requests = append(is.requests, body)
			if is.tokenErr != 0 {
				w.WriteHeader(is.tokenErr)
				fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"serviceaccounts \"kube-apiserver-token-probe\" is forbidden","code":403}`)
				return
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"kind":"TokenRequest","apiVersion":"authentication.k8s.io/v1","status":{"token":%q}}`, secretToken)
		case r.Method == http.MethodGet && r.URL.Path == "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices":
			if r.URL.Query().Get("labelSelector") != "kubernetes.io/service-name=kubernetes" || is.slices == "" {
				http.Error(w, "unexpected", http.StatusBadRequest)
				return
			}
			fmt.Fprint(w, is.slices)
		default:
			// Its own apiserver verifies too.
			req, _ := http.NewRequest(r.Method, accept.URL+r.URL.Path, r.Body)
			req.Header = r.Header
			resp, err := accept.Client().Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		}
	}))
	t.Cleanup(is.srv.Close)
	return is
}

// kubeconfig names the issuer as this host's apiserver, with its CA.
func (is *issuer) kubeconfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: is.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "kubeconfig")
	err := os.WriteFile(kc, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, certificate-authority: %q}
users:
- name: u
  user: {}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`, is.srv.URL, ca), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

type probeTest struct {
	p   *Prober
	reg *prometheus.Registry
	log *bytes.Buffer
}

func newProbe(t *testing.T, is *issuer, targets []Target) *probeTest {
	t.Helper()
	var log bytes.Buffer
	l := logrus.New()
	l.SetOutput(&log)
	l.SetLevel(logrus.DebugLevel)
	p, err := New(Config{Host: "m1", Kubeconfig: is.kubeconfig(t), ServiceAccount: DefaultServiceAccount, Targets: targets, Log: l})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := p.Register(reg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if strings.Contains(log.String(), "probe-secret-token") {
			t.Errorf("the token reached the log:\n%s", log.String())
		}
	})
	return &probeTest{p: p, reg: reg, log: &log}
}

// value is the metric's value with the given labels, and whether it exists.
func (pt *probeTest) value(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := pt.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue(), true
				}
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

func (pt *probeTest) accepted(t *testing.T, verifier string) (float64, bool) {
	return pt.value(t, AcceptedMetric, map[string]string{"issuer_host": "m1", "verifier_host": verifier})
}

func (pt *probeTest) errors(t *testing.T, kind string) float64 {
	v, ok := pt.value(t, ErrorsMetric, map[string]string{"kind": kind})
	if !ok {
		t.Fatalf("%s{kind=%q} not exported", ErrorsMetric, kind)
	}
	return v
}

// TestVerifierAnswers: accepted is 1, refused (401) 0; a 500 or no answer
// leaves the series as it was and counts a review error, logged once
// when it starts and once when it ends.
func TestVerifierAnswers(t *testing.T) {
	is := newIssuer(t)
	gone := verifier(t, "accepted")
	goneURL := gone.URL
	gone.Close()
	tests := []struct {
		kind     string
		url      string
		want     float64
		exported bool
	}{
		{"accepted", verifier(t, "accepted").URL, 1, true},
		{"401", verifier(t, "401").URL, 0, true},
		{"500", verifier(t, "500").URL, 0, false},
		{"unreachable", goneURL, 0, false},
	}
	var targets []Target
	for _, tc := range tests {
		targets = append(targets, Target{Host: tc.kind, URL: tc.url})
	}
	targets = append(targets, Target{Host: "self", URL: is.srv.URL})
	pt := newProbe(t, is, targets)
	for _, k := range []string{ErrTokenRequest, ErrEndpoints, ErrReview} {
		if n := pt.errors(t, k); n != 0 {
			t.Errorf("errors{kind=%s} = %v before any probe", k, n)
		}
	}
	ctx := context.Background()
	pt.p.Once(ctx)
	pt.p.Once(ctx)
	for _, tc := range tests {
		t.Run(tc.kind, func(t *testing.T) {
			got, ok := pt.accepted(t, tc.kind)
			if ok != tc.exported || got != tc.want {
				t.Errorf("accepted{verifier_host=%s} = %v (exported %v), want %v (exported %v)", tc.kind, got, ok, tc.want, tc.exported)
			}
			_, stamped := pt.value(t, TimestampMetric, map[string]string{"issuer_host": "m1", "verifier_host": tc.kind})
			if stamped != tc.exported {
				t.Errorf("timestamp{verifier_host=%s} exported %v, want %v", tc.kind, stamped, tc.exported)
			}
		})
	}
	if v, ok := pt.accepted(t, "self"); !ok || v != 1 {
		t.Errorf("this host's own apiserver: accepted %v (exported %v), want 1", v, ok)
	}
	if n := pt.errors(t, ErrReview); n != 4 {
		t.Errorf("review errors after two probes of two failing verifiers: %v, want 4", n)
	}
	if n := strings.Count(pt.log.String(), "failed; tried again"); n != 2 {
		t.Errorf("%d failure lines after two probes, want one per failing verifier:\n%s", n, pt.log)
	}
	body := is.requests[0]
	spec, _ := body["spec"].(map[string]any)
	if spec["expirationSeconds"] != float64(ExpirationSeconds) || spec["audiences"] != nil {
		t.Errorf("TokenRequest spec %v: want expirationSeconds %d and no audiences", spec, ExpirationSeconds)
	}
}

// TestRecoveryLogged: a failure that ends is logged as ending, and a
// refusal that was 1 before turns the series to 0.
func TestRecoveryLogged(t *testing.T) {
	is := newIssuer(t)
	pt := newProbe(t, is, []Target{{Host: "self", URL: is.srv.URL}})
	ctx := context.Background()
	is.tokenErr = http.StatusForbidden
	pt.p.Once(ctx)
	pt.p.Once(ctx)
	if n := pt.errors(t, ErrTokenRequest); n != 2 {
		t.Errorf("token-request errors: %v, want 2", n)
	}
	if _, ok := pt.accepted(t, "self"); ok {
		t.Errorf("accepted exported without a token")
	}
	if !strings.Contains(pt.log.String(), "examples/rbac/token-probe.yaml") {
		t.Errorf("the token-request failure does not say what to do:\n%s", pt.log)
	}
	is.tokenErr = 0
	pt.p.Once(ctx)
	if !strings.Contains(pt.log.String(), "works again after 2 failed probes") {
		t.Errorf("no line saying the token request works again:\n%s", pt.log)
	}
	if v, ok := pt.accepted(t, "self"); !ok || v != 1 {
		t.Errorf("accepted %v (exported %v), want 1", v, ok)
	}
}

// TestEndpointSlices: without a list, the verifiers are the kubernetes
// Service's ready endpoints at the slice's https port; an address that
// leaves the slices has its series deleted.
func TestEndpointSlices(t *testing.T) {
	is := newIssuer(t)
	port := is.srv.Listener.Addr().(*net.TCPAddr).Port
	slices := func(addrs ...string) string {
		var eps []string
		for _, a := range addrs {
			eps = append(eps, fmt.Sprintf(`{"addresses":[%q],"conditions":{"ready":true}}`, a))
		}
		eps = append(eps, `{"addresses":["10.0.0.9"],"conditions":{"ready":false}}`)
		return fmt.Sprintf(`{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","items":[{"addressType":"IPv4","ports":[{"name":"https","port":%d,"protocol":"TCP"}],"endpoints":[%s]}]}`,
			port, strings.Join(eps, ","))
	}
	pt := newProbe(t, is, nil)
	ctx := context.Background()

	// Unreadable: counted, nothing exported.
	pt.p.Once(ctx)
	if n := pt.errors(t, ErrEndpoints); n != 1 {
		t.Errorf("endpoints errors: %v, want 1", n)
	}

	is.mu.Lock()
	is.slices = slices("127.0.0.1", "127.0.0.2")
	is.mu.Unlock()
	got, err := pt.p.endpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("[{127.0.0.1 https://127.0.0.1:%d} {127.0.0.2 https://127.0.0.2:%d}]", port, port)
	if fmt.Sprint(got) != want {
		t.Errorf("targets %v, want %s (10.0.0.9 is not ready)", got, want)
	}
	pt.p.Once(ctx)
	if v, ok := pt.accepted(t, "127.0.0.1"); !ok || v != 1 {
		t.Errorf("accepted{verifier_host=127.0.0.1} = %v (exported %v), want 1", v, ok)
	}
	if _, ok := pt.value(t, TimestampMetric, map[string]string{"verifier_host": "127.0.0.1"}); !ok {
		t.Errorf("no timestamp for 127.0.0.1")
	}

	// 127.0.0.1 leaves the list: its series go.
	is.mu.Lock()
	is.slices = slices("127.0.0.2")
	is.mu.Unlock()
	pt.p.Once(ctx)
	for _, name := range []string{AcceptedMetric, TimestampMetric} {
		if _, ok := pt.value(t, name, map[string]string{"verifier_host": "127.0.0.1"}); ok {
			t.Errorf("%s{verifier_host=127.0.0.1} still exported after it left the EndpointSlices", name)
		}
	}
}

func TestParse(t *testing.T) {
	got, err := ParseTargets([]string{"m1.example=https://10.0.0.1:6443", " m2.example=https://[fd00::2]:6443/ "})
	if err != nil || fmt.Sprint(got) != "[{m1.example https://10.0.0.1:6443} {m2.example https://[fd00::2]:6443}]" {
		t.Errorf("ParseTargets: %v, %v", got, err)
	}
	for _, bad := range []string{"m1", "=https://a:1", "m1=http://a:1", "m1=https://u:p@a:1"} {
		if _, err := ParseTargets([]string{bad}); err == nil || strings.Contains(err.Error(), "u:p") {
			t.Errorf("ParseTargets(%q): %v, want an error without credentials", bad, err)
		}
	}
	if _, err := ParseTargets([]string{"m1=https://a:1", "m1=https://b:1"}); err == nil {
		t.Error("a host named twice accepted")
	}
	for _, bad := range []string{"", "x", "/x", "x/", "a/b/c"} {
		if _, _, err := ParseServiceAccount(bad); err == nil {
			t.Errorf("ParseServiceAccount(%q) accepted", bad)
		}
	}
}
