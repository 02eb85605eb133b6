package health

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/keysync/confd/internal/pemcheck"
)

const (
	defaultInterval   = time.Second
	minRequestTimeout = 5 * time.Second
	excerptReadLimit  = 16 << 10
	excerptLen        = 300
	jwksReadLimit     = 1 << 20
)

type prober struct {
	Config // Interval defaulted
	target *url.URL
	client *http.Client
	// token is the last token read, kept only to scrub it from anything we
	// print, in case a server or proxy echoes it back.
	token          string
	requestTimeout time.Duration
	wantKIDs       map[string]bool
}

// newProber validates cfg and builds the client, so that a bad CA or an
// unreadable token fails before the first request instead of looking like
// an apiserver that is not ready. Without a URL the gate is off: no
// prober, no error.
func newProber(cfg Config) (*prober, error) {
	if cfg.URL == "" {
		return nil, nil
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		// url.Error quotes the input, which could hold userinfo.
		return nil, fmt.Errorf("%w: URL does not parse", ErrConfig)
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("%w: URL %s: want http(s)://host[:port]/path", ErrConfig, u.Redacted())
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.SkipVerify} // SkipVerify: only when asked, and logged
	if cfg.CACert != "" {
		f, err := pemcheck.ReadFile(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("%w: CA: %w", ErrConfig, err)
		}
		certs := f.Certificates()
		if len(certs) == 0 {
			return nil, fmt.Errorf("%w: CA %s holds no certificate", ErrConfig, cfg.CACert)
		}
		pool := x509.NewCertPool()
		for _, c := range certs {
			pool.AddCert(c)
		}
		tlsCfg.RootCAs = pool
	}
	if (cfg.Cert == "") != (cfg.Key == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both Cert and Key", ErrConfig)
	}
	if cfg.Cert != "" {
		pair, err := tls.LoadX509KeyPair(cfg.Cert, cfg.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %s / %s: %w", ErrConfig, cfg.Cert, cfg.Key, err)
		}
		tlsCfg.Certificates = []tls.Certificate{pair}
	}
	p := &prober{Config: cfg, target: u}
	p.Interval = cmp.Or(p.Interval, defaultInterval)
	p.requestTimeout = max(p.Interval, minRequestTimeout)
	if p.TokenFile != "" {
		if _, err := p.readToken(); err != nil {
			return nil, err
		}
	}
	if len(cfg.JWKSKeyFiles) > 0 {
		if p.wantKIDs, err = keyIDs(cfg.JWKSKeyFiles); err != nil {
			return nil, err
		}
	}
	p.client = &http.Client{
		Transport: &http.Transport{
			TLSClientConfig: tlsCfg,
			// A health check of this host's apiserver must not detour
			// through a proxy from the environment.
			Proxy:       nil,
			DialContext: (&net.Dialer{Timeout: p.requestTimeout}).DialContext,
			// Every probe dials afresh: a kept-alive connection to the
			// old process, or one that skips a new serving certificate,
			// would prove nothing about the new one.
			DisableKeepAlives:   true,
			TLSHandshakeTimeout: p.requestTimeout,
		},
		// A redirect is not readiness, and following one could carry the
		// token elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return p, nil
}

func (p *prober) readToken() (string, error) {
	data, err := os.ReadFile(p.TokenFile)
	if err != nil {
		return "", fmt.Errorf("%w: token file: %w", ErrConfig, err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("%w: token file %s is empty", ErrConfig, p.TokenFile)
	}
	p.token = tok
	return tok, nil
}

func (p *prober) redact(s string) string {
	if p.token == "" {
		return s
	}
	return strings.ReplaceAll(s, p.token, "[redacted]")
}

// outcome is one answer, or the failure to get one, already scrubbed of
// the token.
type outcome struct {
	status int
	text   string // "503 Service Unavailable: excerpt" or the transport error
	cause  error  // no answer (the transport error), or no whole body
	body   []byte
}

func (o outcome) ok() bool       { return o.cause == nil && o.status == http.StatusOK }
func (o outcome) String() string { return o.text }

// get fetches target. Failing to reach the server is an outcome (the
// apiserver may be restarting); only a problem of our own making — the
// token file gone — is returned as an error.
func (p *prober) get(ctx context.Context, target string, limit int64) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, p.requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return outcome{}, fmt.Errorf("%w: request: %s", ErrConfig, p.redact(err.Error()))
	}
	req.Header.Set("Accept", "application/json, */*")
	if p.TokenFile != "" {
		tok, err := p.readToken()
		if err != nil {
			return outcome{}, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return outcome{cause: err, text: p.redact(err.Error())}, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	o := outcome{status: resp.StatusCode, body: body, text: p.redact(resp.Status), cause: err}
	if ex := p.redact(excerpt(body)); ex != "" {
		o.text += ": " + ex
	}
	if err != nil {
		o.text += " (reading body: " + p.redact(err.Error()) + ")"
	}
	return o, nil
}

// excerpt makes a body fit one log line. For /readyz it keeps the failing
// checks ("[-]etcd failed: ..."), which are what an operator needs.
func excerpt(body []byte) string {
	s := string(body)
	var failed []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "[-]") {
			failed = append(failed, strings.TrimSpace(line))
		}
	}
	if len(failed) > 0 {
		s = strings.Join(failed, "; ")
	}
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }), " ")
	if r := []rune(s); len(r) > excerptLen {
		s = string(r[:excerptLen]) + "…"
	}
	return s
}

func keyIDs(files []string) (map[string]bool, error) {
	want := map[string]bool{}
	var errs []error
	for _, path := range files {
		f, err := pemcheck.ReadFile(path)
		var ids []string
		if err == nil {
			ids, err = f.KeyIDs() // nil on error
		}
		errs = append(errs, err)
		for _, id := range ids {
			want[id] = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: JWKS key files: %w", ErrConfig, err)
	}
	return want, nil
}
