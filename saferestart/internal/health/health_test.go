package health

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/pemcheck"
)

const (
	interval = 10 * time.Millisecond
	settle   = 50 * time.Millisecond
)

// server is an httptest TLS server whose CA the test trusts through a file,
// as Wait's callers do.
type server struct {
	*httptest.Server
	caFile string
}

func newServer(t *testing.T, h http.HandlerFunc, clientCAs *x509.CertPool) *server {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	if clientCAs != nil {
		s.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	ca := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
	return &server{Server: s, caFile: ca}
}

func (s *server) config() Config {
	return Config{URL: s.URL + "/readyz", CACert: s.caFile, Interval: interval, Settle: settle, Timeout: 10 * time.Second}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func captureLog() (*logrus.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	l := logrus.New()
	l.SetOutput(&buf)
	l.SetLevel(logrus.DebugLevel)
	return l, &buf
}

// waitAsync runs Wait in the background; the result arrives on the channel.
func waitAsync(ctx context.Context, cfg Config, log logrus.FieldLogger) <-chan error {
	done := make(chan error, 1)
	go func() { done <- Wait(ctx, cfg, log) }()
	return done
}

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestWaitReturnsOnlyAfterReadyAndSettled(t *testing.T) {
	var ready atomic.Bool
	var oks atomic.Int64
	var mu sync.Mutex
	var firstOK time.Time
	sawNotReady := make(chan struct{})
	var bad atomic.Int64
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			http.Error(w, "[-]etcd failed: reason withheld", http.StatusServiceUnavailable)
			if bad.Add(1) == 3 {
				close(sawNotReady)
			}
			return
		}
		mu.Lock()
		if firstOK.IsZero() {
			firstOK = time.Now()
		}
		mu.Unlock()
		oks.Add(1)
		w.Write([]byte("ok"))
	}, nil)
	log, _ := captureLog()
	done := waitAsync(context.Background(), s.config(), log)
	await(t, sawNotReady, "three not-ready probes")
	select {
	case err := <-done:
		t.Fatalf("Wait returned while the apiserver answered 503: %v", err)
	default:
	}
	ready.Store(true)
	if err := await(t, done, "Wait"); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	mu.Lock()
	defer mu.Unlock()
	if n := oks.Load(); n < 2 {
		t.Errorf("returned after %d 200s, want >= 2", n)
	}
	if d := returned.Sub(firstOK); d < settle {
		t.Errorf("returned %s after the first 200, want >= settle %s", d, settle)
	}
}

func TestNon200ResetsSettle(t *testing.T) {
	var n atomic.Int64
	var mu sync.Mutex
	var restart time.Time // first 200 after the 503
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case 3:
			mu.Lock()
			restart = time.Now()
			mu.Unlock()
		}
		w.Write([]byte("ok"))
	}, nil)
	if err := Wait(context.Background(), s.config(), quiet); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	mu.Lock()
	defer mu.Unlock()
	if restart.IsZero() {
		t.Fatalf("returned after %d requests, before the 200 that follows the 503", n.Load())
	}
	if d := returned.Sub(restart); d < settle {
		t.Errorf("returned %s after readiness came back, want >= settle %s", d, settle)
	}
}

func TestUnauthorizedReturnsAtOnce(t *testing.T) {
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			var n atomic.Int64
			s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				http.Error(w, `forbidden: User "system:anonymous" cannot get path "/readyz"`, code)
			}, nil)
			err := Wait(context.Background(), s.config(), quiet)
			if !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("err = %v, want ErrUnauthorized", err)
			}
			if n.Load() != 1 {
				t.Errorf("%d requests, want 1", n.Load())
			}
			if !strings.Contains(err.Error(), "system:anonymous") {
				t.Errorf("error lacks the body: %v", err)
			}
		})
	}
}

func TestTimeout(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "[+]ping ok\n[-]etcd failed: reason withheld\n[+]log ok\nreadyz check failed", http.StatusServiceUnavailable)
	}, nil)
	cfg := s.config()
	// The assertions need the body of at least one answer: a timeout of
	// 1 s leaves room for the first TLS handshake on a loaded 2-core
	// machine (100 ms did not, under -race beside other suites).
	cfg.Timeout = time.Second
	err := Wait(context.Background(), cfg, quiet)
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrNotReady and DeadlineExceeded", err)
	}
	for _, s := range []string{"within 1s", "503 Service Unavailable: [-]etcd failed: reason withheld", "/readyz"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "[+]ping") {
		t.Errorf("error carries passing checks: %v", err)
	}
}

func TestTimeoutWhileSettling(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }, nil)
	cfg := s.config()
	cfg.Settle, cfg.Timeout = time.Hour, time.Second
	err := Wait(context.Background(), cfg, quiet)
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "settle time") {
		t.Fatalf("err = %v, want ErrNotReady explaining the settle", err)
	}
}

const token = "s3cret-token-value-0123456789"

func TestBearerTokenSentAndNeverShown(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, []byte("  "+token+"\n"))

	t.Run("sent", func(t *testing.T) {
		s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token {
				http.Error(w, "bad token", http.StatusUnauthorized)
				return
			}
			w.Write([]byte("ok"))
		}, nil)
		cfg := s.config()
		cfg.TokenFile = tokenFile
		if err := Wait(context.Background(), cfg, quiet); err != nil {
			t.Fatal(err)
		}
	})

	// A server echoing the header back is the worst case for a leak.
	echo := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "[-]auth failed: got "+r.Header.Get("Authorization"), code)
		}
	}
	for _, code := range []int{http.StatusServiceUnavailable, http.StatusUnauthorized} {
		t.Run("hidden on "+http.StatusText(code), func(t *testing.T) {
			s := newServer(t, echo(code), nil)
			cfg := s.config()
			cfg.TokenFile = tokenFile
			cfg.Timeout = time.Second
			log, buf := captureLog()
			err := Wait(context.Background(), cfg, log)
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), token) {
				t.Errorf("token in error: %v", err)
			}
			if strings.Contains(buf.String(), token) {
				t.Errorf("token in log:\n%s", buf)
			}
			if !strings.Contains(err.Error(), "Bearer [redacted]") {
				t.Errorf("error lost the (scrubbed) body: %v", err)
			}
		})
	}
}

// The token file is read for every request, so a rotated token is used.
func TestTokenReadFresh(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile(t, tokenFile, []byte("old-token"))
	sawOld := make(chan struct{})
	var once sync.Once
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer new-token" {
			once.Do(func() { close(sawOld) })
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}, nil)
	cfg := s.config()
	cfg.TokenFile = tokenFile
	done := waitAsync(context.Background(), cfg, quiet)
	await(t, sawOld, "a probe with the old token")
	writeFile(t, tokenFile, []byte("new-token\n"))
	if err := await(t, done, "Wait"); err != nil {
		t.Fatal(err)
	}
}

func TestClientCertificate(t *testing.T) {
	ca := etcdtest.NewCA(t, "client CA")
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }, pool)
	dir := t.TempDir()
	cert, key := ca.Issue(t, "system:kube-apiserver-safe-restart", false, time.Now().Add(time.Hour))
	certFile, keyFile := filepath.Join(dir, "c.crt"), filepath.Join(dir, "c.key")
	writeFile(t, certFile, cert)
	writeFile(t, keyFile, key)

	cfg := s.config()
	cfg.Cert, cfg.Key = certFile, keyFile
	if err := Wait(context.Background(), cfg, quiet); err != nil {
		t.Fatalf("with client certificate: %v", err)
	}
	cfg = s.config()
	cfg.Timeout = 100 * time.Millisecond
	if err := Wait(context.Background(), cfg, quiet); !errors.Is(err, ErrNotReady) {
		t.Fatalf("without client certificate: err = %v, want ErrNotReady", err)
	}
}

func TestJWKS(t *testing.T) {
	dir := t.TempDir()
	var kids []string
	var files []string
	for i, name := range []string{"a.pub", "b.pub", "c.pub"} {
		ca := etcdtest.NewCA(t, name)
		der, err := x509.MarshalPKIXPublicKey(&ca.Key.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		data := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
		if i == 1 {
			data = append(data, ca.PEM...) // a certificate of the same key: same kid
		}
		writeFile(t, path, data)
		files = append(files, path)
		id, err := pemcheck.KeyID(&ca.Key.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, id)
	}
	jwks := func(served ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/openid/v1/jwks" {
				w.Write([]byte("ok"))
				return
			}
			var doc struct {
				Keys []map[string]string `json:"keys"`
			}
			for _, k := range served {
				doc.Keys = append(doc.Keys, map[string]string{"kid": k, "kty": "EC", "use": "sig"})
			}
			w.Header().Set("Content-Type", "application/jwk-set+json")
			json.NewEncoder(w).Encode(doc)
		}
	}
	tests := []struct {
		name    string
		handler http.HandlerFunc
		files   []string
		err     error
		text    []string
	}{
		{name: "match", handler: jwks(kids[0], kids[1]), files: files[:2]},
		{name: "missing", handler: jwks(kids[0]), files: files[:2], err: ErrJWKS, text: []string{"missing", kids[1]}},
		{name: "extra", handler: jwks(kids...), files: files[:2], err: ErrJWKS, text: []string{"extra", kids[2]}},
		{name: "not served", files: files[:1], err: ErrJWKS, text: []string{"404"},
			handler: func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/openid/v1/jwks" {
					http.NotFound(w, r)
					return
				}
				w.Write([]byte("ok"))
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, tc.handler, nil)
			cfg := s.config()
			cfg.JWKSKeyFiles = tc.files
			err := Wait(context.Background(), cfg, quiet)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			for _, s := range tc.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
}

func TestConfigErrorsAtOnce(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	writeFile(t, garbage, []byte("not a certificate"))
	emptyToken := filepath.Join(dir, "empty-token")
	writeFile(t, emptyToken, []byte("\n"))
	// Nothing listens on port 1; a config error must come before any probe.
	base := Config{URL: "https://127.0.0.1:1/readyz", Timeout: time.Minute, Interval: interval}
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"bad URL", func(c *Config) { c.URL = "ftp://host/x" }},
		{"URL without host", func(c *Config) { c.URL = "https:///readyz" }},
		{"garbage CA", func(c *Config) { c.CACert = garbage }},
		{"missing CA", func(c *Config) { c.CACert = filepath.Join(dir, "nope.crt") }},
		{"missing token file", func(c *Config) { c.TokenFile = filepath.Join(dir, "nope") }},
		{"empty token file", func(c *Config) { c.TokenFile = emptyToken }},
		{"cert without key", func(c *Config) { c.Cert = garbage }},
		{"bad client pair", func(c *Config) { c.Cert, c.Key = garbage, garbage }},
		{"bad JWKS key file", func(c *Config) { c.JWKSKeyFiles = []string{garbage} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.mod(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := Validate(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("Validate err = %v, want ErrConfig", err)
			}
			if err := Wait(ctx, cfg, quiet); !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig", err)
			}
		})
	}
	if err := Wait(context.Background(), Config{}, quiet); err != nil {
		t.Errorf("gate off: %v", err)
	}
	if err := Validate(base); err != nil {
		t.Errorf("Validate(valid config) = %v", err)
	}
}

// Probe judges only the gate's own configuration against the running
// apiserver: an untrusted certificate and 401/403 are errors; not ready,
// or not running at all, is not.
func TestProbe(t *testing.T) {
	ok := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }, nil)
	notReady := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
	}, nil)
	denied := newServer(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "Unauthorized", http.StatusUnauthorized) }, nil)
	// httptest servers share one certificate: another CA comes from elsewhere.
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	writeFile(t, otherCA, etcdtest.NewCA(t, "not the apiserver's").PEM)
	down := ok.config()
	down.URL = "https://127.0.0.1:1/readyz"
	wrongCA := ok.config()
	wrongCA.CACert = otherCA
	for _, tc := range []struct {
		name string
		cfg  Config
		want error
	}{
		{"ready", ok.config(), nil},
		{"not ready", notReady.config(), nil},
		{"down", down, nil},
		{"gate off", Config{}, nil},
		{"401", denied.config(), ErrUnauthorized},
		{"wrong CA", wrongCA, ErrTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Probe(context.Background(), tc.cfg)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Probe = %v, want %v", err, tc.want)
			}
		})
	}
}

// A certificate the gate does not trust ends Wait at once: no restart
// fixes a wrong CA, so waiting out the timeout only holds the line.
func TestWaitUntrustedCertificateAtOnce(t *testing.T) {
	s := newServer(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }, nil)
	cfg := s.config()
	cfg.CACert = filepath.Join(t.TempDir(), "other.crt")
	writeFile(t, cfg.CACert, etcdtest.NewCA(t, "other").PEM)
	cfg.Timeout = time.Minute
	start := time.Now()
	err := Wait(context.Background(), cfg, quiet)
	if !errors.Is(err, ErrTLS) {
		t.Fatalf("err = %v, want ErrTLS", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %s", d)
	}
}

// quiet is the logger of tests that do not read the log.
var quiet = func() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}()
