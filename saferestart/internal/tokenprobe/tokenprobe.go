// Package tokenprobe measures, from each master, whether every apiserver
// accepts the service-account tokens this master's apiserver issues: a
// bundle that lacks a master's key shows as a refused token long before a
// client notices. Every interval it requests a short-lived token for one
// probe service account from this host's apiserver (the kubeconfig's
// server, not the load balancer), presents it to every apiserver, its own
// included (SelfSubjectReview with the token as bearer), and exports the
// row of the matrix this host issues:
// kube_apiserver_safe_restart_token_accepted{issuer_host,verifier_host}.
//
// SelfSubjectReview rather than TokenReview: it authenticates the token
// itself, as any client's request would be, and needs no RBAC (every
// authenticated user has system:basic-user, which allows creating it);
// TokenReview would need the publisher's own identity to hold create on
// tokenreviews (system:auth-delegator) on every apiserver.
package tokenprobe

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/keysync/confd/internal/promserve"
)

// Defaults of the publisher's flags.
const (
	DefaultInterval       = time.Minute
	DefaultServiceAccount = "kube-system/kube-apiserver-token-probe"
	// ExpirationSeconds is the shortest token kube-apiserver issues
	// (TokenRequest refuses less than 10 minutes).
	ExpirationSeconds = 600
	// DefaultTimeout bounds each request.
	DefaultTimeout = 10 * time.Second
)

// Error kinds: the errors counter's kind label.
const (
	ErrTokenRequest = "token-request" // this host's apiserver issued no token
	ErrEndpoints    = "endpoints"     // the kubernetes Service's EndpointSlices unreadable
	ErrReview       = "review"        // a verifier gave no answer that says accepted or refused
)

// Metric names: the interface the alert rules read.
const (
	AcceptedMetric  = "kube_apiserver_safe_restart_token_accepted"
	TimestampMetric = "kube_apiserver_safe_restart_token_probe_timestamp_seconds"
	ErrorsMetric    = "kube_apiserver_safe_restart_token_probe_errors_total"
)

// Target is one apiserver to present the token to.
type Target struct {
	Host string // the verifier_host label
	URL  string // https://HOST:PORT
}

// ParseTargets reads --token-probe-apiservers: HOST=URL items.
func ParseTargets(items []string) ([]Target, error) {
	var out []Target
	seen := map[string]bool{}
	for _, it := range items {
		it = strings.TrimSpace(it)
		if it == "" {
			continue
		}
		host, raw, ok := strings.Cut(it, "=")
		if !ok || host == "" {
			return nil, fmt.Errorf("--token-probe-apiservers %q: want HOST=URL, e.g. m1.example.com=https://10.0.0.11:6443", it)
		}
		u, err := url.Parse(raw)
		if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
			return nil, fmt.Errorf("--token-probe-apiservers %s: want an https://HOST:PORT URL after the =", host)
		}
		if seen[host] {
			return nil, fmt.Errorf("--token-probe-apiservers: %s named twice", host)
		}
		seen[host] = true
		out = append(out, Target{Host: host, URL: strings.TrimSuffix(u.String(), "/")})
	}
	return out, nil
}

// ParseServiceAccount reads --token-probe-service-account NAMESPACE/NAME.
func ParseServiceAccount(s string) (namespace, name string, err error) {
	ns, n, ok := strings.Cut(s, "/")
	if !ok || ns == "" || n == "" || strings.Contains(n, "/") {
		return "", "", fmt.Errorf("--token-probe-service-account %q: want NAMESPACE/NAME, e.g. %s", s, DefaultServiceAccount)
	}
	return ns, n, nil
}

// Config is one prober.
type Config struct {
	// Host is this host's name, the issuer_host label (--host).
	Host string
	// Kubeconfig names this host's apiserver (its server) and an
	// identity allowed to create a token for ServiceAccount (and, without
	// Targets, to list EndpointSlices).
	Kubeconfig string
	// ServiceAccount is NAMESPACE/NAME.
	ServiceAccount string
	// Targets are the apiservers; empty: the kubernetes Service's
	// EndpointSlices in default, read at every probe.
	Targets  []Target
	Interval time.Duration // default DefaultInterval
	Timeout  time.Duration // per request; default DefaultTimeout
	Log      logrus.FieldLogger
}

// Prober runs the probe; its metrics go in the registry Register is given.
type Prober struct {
	cfg       Config
	namespace string
	name      string
	server    string       // this host's apiserver (the kubeconfig's)
	api       *http.Client // the kubeconfig's identity, to this host's apiserver
	review    *http.Client // no identity: the token is the only credential

	accepted  *prometheus.GaugeVec
	timestamp *prometheus.GaugeVec
	errors    *prometheus.CounterVec

	mu      sync.Mutex
	known   map[string]bool // verifiers with series
	failing map[string]int  // what fails (kind, or review of a verifier): in a row
}

// New checks cfg, loads the kubeconfig and builds the clients; no request
// is made.
func New(cfg Config) (*Prober, error) {
	if cfg.Host == "" {
		return nil, errors.New("token probe: no host name (--host)")
	}
	cfg.Interval, cfg.Timeout = cmp.Or(cfg.Interval, DefaultInterval), cmp.Or(cfg.Timeout, DefaultTimeout)
	ns, name, err := ParseServiceAccount(cfg.ServiceAccount)
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--token-probe-kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.Timeout = cfg.Timeout
	rc.UserAgent = "kube-apiserver-safe-restart token-probe"
	api, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("--token-probe-kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	u, err := url.Parse(rc.Host)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--token-probe-kubeconfig %s: server %q is no URL; want this host's apiserver, e.g. https://127.0.0.1:6443", cfg.Kubeconfig, rc.Host)
	}
	// The verifiers are reached by their own addresses, but each serving
	// certificate is verified for the name this host's own is (the
	// kubeconfig's tls-server-name, else its server's host, e.g.
	// 127.0.0.1): the masters' certificates share a profile, but need not
	// name each other's addresses.
	anon := rest.AnonymousClientConfig(rc)
	if anon.TLSClientConfig.ServerName == "" {
		anon.TLSClientConfig.ServerName = u.Hostname()
	}
	review, err := rest.HTTPClientFor(anon)
	if err != nil {
		return nil, fmt.Errorf("--token-probe-kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	p := &Prober{cfg: cfg, namespace: ns, name: name, server: strings.TrimSuffix(rc.Host, "/"), api: api, review: review,
		known: map[string]bool{}, failing: map[string]int{}}
	p.accepted = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: AcceptedMetric,
		Help: "1 when the verifier's apiserver accepted the last token this host's apiserver (the issuer) issued for the probe service account, 0 when it refused it (401)."},
		[]string{"issuer_host", "verifier_host"})
	p.timestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: TimestampMetric,
		Help: "When the verifier last answered the token probe with accepted or refused (Unix time)."},
		[]string{"issuer_host", "verifier_host"})
	p.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: ErrorsMetric,
		Help: "Token probes that got no answer, by kind (token-request: this host's apiserver issued no token; endpoints: the kubernetes Service's EndpointSlices unreadable; review: a verifier unreachable or answering neither accepted nor 401)."},
		[]string{"kind"})
	for _, k := range []string{ErrTokenRequest, ErrEndpoints, ErrReview} {
		p.errors.WithLabelValues(k)
	}
	return p, nil
}

// Register adds the probe's metrics to reg (the publisher's registry).
func (p *Prober) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{p.accepted, p.timestamp, p.errors} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("token probe metrics: %w", err)
		}
	}
	return nil
}

// Run probes at once and then every Interval until ctx ends; it returns
// nil. Failures are counted and logged when they start and when they end.
func (p *Prober) Run(ctx context.Context) error {
	p.cfg.Log.WithFields(logrus.Fields{"service-account": p.cfg.ServiceAccount, "interval": p.cfg.Interval.String()}).
		Info("token probe: presenting this host's tokens to every apiserver")
	p.Once(ctx)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.Once(ctx)
		}
	}
}

// Once runs one probe: the verifiers, a token, every review.
func (p *Prober) Once(ctx context.Context) {
	targets := p.cfg.Targets
	if len(targets) == 0 {
		var err error
		targets, err = p.endpoints(ctx)
		if p.outcome(ctx, ErrEndpoints, "reading the kubernetes Service's EndpointSlices", err) {
			return
		}
	}
	p.forgetVanished(targets)
	token, err := p.token(ctx)
	if p.outcome(ctx, ErrTokenRequest, "requesting a token for "+p.cfg.ServiceAccount, err) {
		return
	}
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Go(func() {
			ok, err := p.present(ctx, tg, token)
			if err != nil && strings.Contains(err.Error(), token) {
				// An answer may echo the request (a proxy's error page).
				err = errors.New(strings.ReplaceAll(err.Error(), token, "[token]"))
			}
			if p.outcome(ctx, ErrReview+" "+tg.Host, "presenting the token to "+tg.Host, err) {
				return
			}
			p.accepted.WithLabelValues(p.cfg.Host, tg.Host).Set(promserve.Bool(ok))
			p.timestamp.WithLabelValues(p.cfg.Host, tg.Host).Set(float64(time.Now().UnixNano()) / 1e9)
		})
	}
	wg.Wait()
}

// outcome counts and logs err under what (a kind, or "review HOST"): a
// warning when a run of failures starts, info when it ends. It reports
// whether err was a failure.
func (p *Prober) outcome(ctx context.Context, what, doing string, err error) bool {
	if err != nil && ctx.Err() != nil {
		return true // stopping: not the apiserver's fault
	}
	kind, verifier, _ := strings.Cut(what, " ")
	log := p.cfg.Log.WithField("probe", kind)
	if verifier != "" {
		log = log.WithField("verifier", verifier)
	}
	p.mu.Lock()
	n := p.failing[what]
	if err != nil {
		p.failing[what] = n + 1
	} else {
		delete(p.failing, what)
	}
	p.mu.Unlock()
	switch {
	case err != nil:
		p.errors.WithLabelValues(kind).Inc()
		if n == 0 {
			log.WithError(err).Warnf("token probe: %s failed; tried again every %s, %s keeps its last value meanwhile", doing, p.cfg.Interval, AcceptedMetric)
		}
		return true
	case n > 0:
		log.Infof("token probe: %s works again after %d failed probes", doing, n)
	}
	return false
}

// forgetVanished deletes the series of verifiers no longer listed.
func (p *Prober) forgetVanished(targets []Target) {
	now := map[string]bool{}
	for _, tg := range targets {
		now[tg.Host] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for h := range p.known {
		if !now[h] {
			p.accepted.DeleteLabelValues(p.cfg.Host, h)
			p.timestamp.DeleteLabelValues(p.cfg.Host, h)
			delete(p.failing, ErrReview+" "+h)
			p.cfg.Log.WithField("verifier", h).Info("token probe: apiserver no longer listed; its series removed")
		}
	}
	p.known = now
}

// token asks this host's apiserver for a token for the probe service
// account. The token is returned and never put in an error.
func (p *Prober) token(ctx context.Context) (string, error) {
	body := fmt.Appendf(nil, `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":%d}}`, ExpirationSeconds)
	u := p.server + "/api/v1/namespaces/" + url.PathEscape(p.namespace) + "/serviceaccounts/" + url.PathEscape(p.name) + "/token"
	resp, data, err := p.call(ctx, p.api, http.MethodPost, u, body, "", 1<<20)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("POST %s: %s%s (the kubeconfig's identity needs create on serviceaccounts/token for %s: examples/rbac/token-probe.yaml)",
			u, resp.Status, statusMessage(data), p.cfg.ServiceAccount)
	}
	var tr authenticationv1.TokenRequest
	if err := json.Unmarshal(data, &tr); err != nil || tr.Status.Token == "" {
		// Neither the body nor the decoder's error: they may hold the token.
		return "", fmt.Errorf("POST %s: %s without a token in its answer", u, resp.Status)
	}
	return tr.Status.Token, nil
}

// present sends token to tg as a SelfSubjectReview: true when tg
// authenticated the probe service account, false on 401, an error on any
// other answer or none.
func (p *Prober) present(ctx context.Context, tg Target, token string) (bool, error) {
	body := []byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	u := tg.URL + "/apis/authentication.k8s.io/v1/selfsubjectreviews"
	resp, data, err := p.call(ctx, p.review, http.MethodPost, u, body, token, 1<<20)
	if err != nil {
		return false, err
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return false, nil
	case http.StatusCreated, http.StatusOK:
	default:
		return false, fmt.Errorf("POST %s: %s%s", u, resp.Status, statusMessage(data))
	}
	var r authenticationv1.SelfSubjectReview
	if err := json.Unmarshal(data, &r); err != nil {
		return false, fmt.Errorf("POST %s: %s, an answer that is no SelfSubjectReview: %w", u, resp.Status, err)
	}
	want := "system:serviceaccount:" + p.namespace + ":" + p.name
	if got := r.Status.UserInfo.Username; got != want {
		return false, fmt.Errorf("POST %s: authenticated as %q, want %q", u, got, want)
	}
	return true, nil
}

// call sends a request, with a JSON body and token as the bearer when
// given, and reads the answer, all within Timeout. Errors name the method
// and URL, never the token.
func (p *Prober) call(ctx context.Context, c *http.Client, method, u string, body []byte, token string, limit int64) (*http.Response, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err // url.Error quotes the method and URL, named here already
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: reading the answer: %w", method, u, err)
	}
	return resp, data, nil
}

// endpoints reads the kubernetes Service's EndpointSlices from this
// host's apiserver: every ready endpoint address, at the slice's https
// port (its only port when unnamed).
func (p *Prober) endpoints(ctx context.Context) ([]Target, error) {
	q := url.Values{"labelSelector": {"kubernetes.io/service-name=kubernetes"}}
	u := p.server + "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?" + q.Encode()
	resp, data, err := p.call(ctx, p.api, http.MethodGet, u, nil, "", 8<<20)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s%s (the kubeconfig's identity needs list on endpointslices in default, or set --token-probe-apiservers)", u, resp.Status, statusMessage(data))
	}
	// The part of an EndpointSliceList the probe reads (decoded here
	// rather than through discovery/v1's types, which would link core/v1
	// into the helper).
	var list struct {
		Items []struct {
			Ports []struct {
				Name *string `json:"name"`
				Port *int32  `json:"port"`
			} `json:"ports"`
			Endpoints []struct {
				Addresses  []string `json:"addresses"`
				Conditions struct {
					Ready *bool `json:"ready"`
				} `json:"conditions"`
			} `json:"endpoints"`
		} `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("GET %s: no EndpointSliceList: %w", u, err)
	}
	seen := map[string]bool{}
	var out []Target
	for _, s := range list.Items {
		port := int32(0)
		for _, pt := range s.Ports {
			if pt.Port != nil && (pt.Name == nil || *pt.Name == "https" || len(s.Ports) == 1) {
				port = *pt.Port
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if seen[a] {
					continue
				}
				seen[a] = true
				out = append(out, Target{Host: a, URL: "https://" + net.JoinHostPort(a, strconv.Itoa(int(port)))})
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("GET %s: no ready endpoint with an https port in the kubernetes Service's EndpointSlices", u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out, nil
}

// statusMessage is ": MESSAGE" of a metav1.Status answer, "" otherwise.
func statusMessage(data []byte) string {
	var st metav1.Status
	if json.Unmarshal(data, &st) != nil || st.Kind != "Status" || st.Message == "" {
		return ""
	}
	m := st.Message
	if len(m) > 300 {
		m = m[:300] + "..."
	}
	return ": " + m
}
