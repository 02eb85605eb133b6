package staletokens

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/tlsconf"
)

// A Sampler's timing.
const (
	Interval = time.Minute
	// Heartbeat bounds how often an unchanged record is written
	// again only to move last_sample: one write per master per 15 minutes,
	// not per sample, keeps etcd's revisions and watchers quiet, and still
	// tells retire-keys within its window whether a sampler is alive.
	Heartbeat = 15 * time.Minute
	// metricsReadLimit bounds a /metrics body (kube-apiserver's is a few
	// MiB with every resource's histograms).
	metricsReadLimit = 64 << 20
)

// ClientConfig is how a Sampler reaches its apiserver's /metrics: the
// safe-restart health gate's CA, client pair or bearer token file, since
// it is the same local apiserver. The identity needs `get` on the
// non-resource URL /metrics (examples/rbac/metrics-reader.yaml).
type ClientConfig struct {
	URL       string // e.g. https://127.0.0.1:6443/metrics
	CACert    string // PEM CA of the serving certificate; empty: system roots
	Cert, Key string // client certificate and key (optional)
	TokenFile string // bearer token file (optional; read at each request, never logged)
}

// Sampler reads one apiserver's stale-token counter every Interval and
// records it at ROTATION-PREFIX/HOST/stale-tokens.
type Sampler struct {
	Client ClientConfig
	KV     clientv3.KV
	Prefix string // the rotation prefix
	Host   string
	Log    logrus.FieldLogger // required
	// Now is the clock (default time.Now); tests drive it.
	Now func() time.Time
	// Failed, when set, is told of every failed sample (the publisher
	// counts them in its metrics).
	Failed func()

	http *http.Client
	prev *Record // the record last written (or read at the start)
}

// Run samples until ctx ends, then returns nil. A failed sample or write
// is logged and retried at the next tick: an apiserver that is restarting
// or refuses the credentials must not stop the publisher it runs in. Only
// an unusable configuration (URL, CA, client pair, token file) is an
// error, before the first sample.
func (s *Sampler) Run(ctx context.Context) error {
	if err := s.init(); err != nil {
		return err
	}
	failing := 0 // failed samples in a row
	sample := func() {
		err := s.Once(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
		case err != nil:
			if s.Failed != nil {
				s.Failed()
			}
			if failing++; failing == 1 {
				s.Log.WithError(err).Warn("stale-token sampling failing: retried every interval (retire-keys counts this host as unknown once its record is older than its window)")
			} else {
				s.Log.WithError(err).Debug("stale-token sample failed again")
			}
		case failing > 0:
			s.Log.Infof("stale-token sampling works again after %d failed samples", failing)
			failing = 0
		}
	}
	sample()
	t := time.NewTicker(Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			sample()
		}
	}
}

// init fills the defaults and builds the HTTP client once.
func (s *Sampler) init() error {
	if s.http != nil {
		return nil
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Host == "" {
		return errors.New("stale-token sampler: no host name (--host)")
	}
	// The configuration is checked here, so that a bad URL, CA or client
	// pair fails at the start rather than at every sample.
	u, err := url.Parse(s.Client.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		// url.Error quotes the input, which could hold userinfo.
		return errors.New("--apiserver-metrics-url: want https://HOST:PORT/metrics (the local apiserver's)")
	}
	tc, err := tlsconf.Client(s.Client.CACert, s.Client.Cert, s.Client.Key)
	if err != nil {
		return fmt.Errorf("--apiserver-metrics-url %s: --health-cacert/--health-cert/--health-key: %w", u.Redacted(), err)
	}
	if s.Client.TokenFile != "" {
		if _, err := readToken(s.Client.TokenFile); err != nil {
			return err
		}
	}
	s.http = &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: tc,
			// The local apiserver, never through a proxy from the
			// environment.
			Proxy:       nil,
			DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		},
		// A redirect could carry the token elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return nil
}

func readToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--health-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("--health-token-file %s is empty", path)
	}
	return tok, nil
}

// Once takes one sample and writes the record when it changed, or when
// the last write is older than Heartbeat.
func (s *Sampler) Once(ctx context.Context) error {
	if err := s.init(); err != nil {
		return err
	}
	key := Key(s.Prefix, s.Host)
	if s.prev == nil {
		// The baseline survives a restart of the publisher: growth is
		// measured against what any earlier sampler recorded.
		resp, err := s.KV.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
		if len(resp.Kvs) > 0 {
			var r Record
			if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
				s.Log.Warnf("%s is not a stale-token record (%v): replaced by the next sample", key, err)
			} else {
				s.prev = &r
			}
		}
	}
	sample, err := s.fetch(ctx)
	if err != nil {
		return err
	}
	now := s.Now()
	r := Observe(s.prev, s.Host, sample, now)
	if !changed(s.prev, r) && now.Sub(s.prev.LastSample) < Heartbeat {
		return nil
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.KV.Put(ctx, key, string(data)); err != nil {
		// s.prev stays: the next sample is measured against what etcd
		// holds, so the growth is recorded then.
		return fmt.Errorf("write %s: %w", key, err)
	}
	if !r.LastGrowth.IsZero() && (s.prev == nil || !r.LastGrowth.Equal(s.prev.LastGrowth)) {
		s.Log.Infof("stale service-account tokens used on this apiserver (%s %v): recorded at %s; retire-keys keeps superseded keys while it grows", CounterMetric, r.Counter, key)
	}
	s.prev = &r
	return nil
}

// fetch reads and parses /metrics once.
func (s *Sampler) fetch(ctx context.Context) (Sample, error) {
	u, _ := url.Parse(s.Client.URL) // checked by init
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Client.URL, nil)
	if err != nil {
		return Sample{}, fmt.Errorf("--apiserver-metrics-url %s: %w", u.Redacted(), err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	if s.Client.TokenFile != "" {
		tok, err := readToken(s.Client.TokenFile)
		if err != nil {
			return Sample{}, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return Sample{}, fmt.Errorf("GET %s: %s: the client identity needs get on the non-resource URL /metrics (examples/rbac/metrics-reader.yaml)", u.Redacted(), resp.Status)
	case resp.StatusCode != http.StatusOK:
		return Sample{}, fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	sample, err := Parse(io.LimitReader(resp.Body, metricsReadLimit))
	if err != nil {
		return Sample{}, fmt.Errorf("GET %s: %w", u.Redacted(), err)
	}
	return sample, nil
}
