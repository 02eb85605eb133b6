// Package health is the gate the restart lock is held across: after
// kube-apiserver restarts, Wait returns only once it has answered ready
// continuously for a settle period, and, optionally, serves the expected
// service-account verification keys.
package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sirupsen/logrus"
)

var (
	// ErrUnauthorized means the endpoint answered 401 or 403: a credentials
	// or RBAC problem, which waiting will not fix.
	ErrUnauthorized = errors.New("kube-apiserver refused the health check's credentials")
	// ErrNotReady means the apiserver was not ready before the deadline.
	ErrNotReady = errors.New("kube-apiserver not ready")
	// ErrJWKS means /openid/v1/jwks could not be fetched or did not serve
	// exactly the key IDs of the expected key files.
	ErrJWKS = errors.New("service-account JWKS check failed")
	// ErrConfig is an unusable Config, reported before any request.
	ErrConfig = errors.New("invalid health check configuration")
	// ErrTLS means the apiserver's certificate was not trusted (or did not
	// name the URL's host): the gate's CA is wrong, which waiting will not fix.
	ErrTLS = errors.New("the health check does not trust kube-apiserver's certificate")
)

// Probe asks the running apiserver once, before a restart, whether the
// gate's TLS settings and credentials work: it returns ErrTLS for a
// certificate the gate does not trust and ErrUnauthorized for 401/403, so
// that a gate that could never pass stops the restart before it happens.
// Any other answer, and no answer at all (the apiserver is down), is nil:
// only the gate's own configuration is judged here.
func Probe(ctx context.Context, cfg Config) error {
	p, err := newProber(cfg)
	if p == nil {
		return err
	}
	out, err := p.get(ctx, p.target.String(), excerptReadLimit)
	if err != nil {
		return err
	}
	return p.refused(out)
}

// refused is an answer no restart fixes: a certificate the gate does not
// trust (ErrTLS), 401 or 403 (ErrUnauthorized); nil for any other.
func (p *prober) refused(out outcome) error {
	// The TLS client wraps every failure to verify the server's
	// certificate (unknown CA, wrong host, expired) in this type: the
	// gate's CA or the URL's host is wrong. A refused or reset connection
	// is not one: the apiserver is restarting.
	if _, bad := errors.AsType[*tls.CertificateVerificationError](out.cause); bad {
		return fmt.Errorf("%w: %s: %s", ErrTLS, p.target.Redacted(), out)
	}
	if out.status == http.StatusUnauthorized || out.status == http.StatusForbidden {
		return fmt.Errorf("%w: %s answered %s", ErrUnauthorized, p.target.Redacted(), out)
	}
	return nil
}

// Config configures Wait.
type Config struct {
	URL       string        // e.g. https://127.0.0.1:6443/readyz; "" = gate off (Wait returns nil at once)
	CACert    string        // PEM CA to verify the server; empty = system roots
	Cert, Key string        // client cert auth (optional)
	TokenFile string        // bearer token file (optional; read fresh, trimmed; never logged)
	Settle    time.Duration // must answer 200 continuously this long (>= 2 consecutive 200s spanning Settle)
	Timeout   time.Duration // overall deadline for readiness and the JWKS check; 0 = only ctx's
	Interval  time.Duration // poll interval (default 1s)
	// JWKSKeyFiles, if set, makes Wait fetch <scheme://host>/openid/v1/jwks
	// once ready and require its set of "kid"s to equal the KeyIDs of the
	// public keys in these PEM files.
	JWKSKeyFiles []string
	// SkipVerify accepts any serving certificate (kube-controller-manager's
	// self-signed one, when no CA is given); the caller logs that it does.
	SkipVerify bool
}

// Validate reports, without any request, what would make Wait fail with
// ErrConfig: a bad URL, an unreadable or empty CA, client certificate,
// token or JWKS key file. Callers run it before a restart, so that a gate
// that cannot work stops the restart instead of failing after it.
func Validate(cfg Config) error {
	_, err := newProber(cfg)
	return err
}

// Wait blocks until the apiserver at cfg.URL is ready and settled (and, if
// asked, serves the expected JWKS). Any answer but 200 — including refused
// or reset connections, normal while it restarts — means "not ready yet"
// and restarts the settle window; 401/403 end the wait at once with
// ErrUnauthorized, and a certificate the gate does not trust with ErrTLS
// (no restart fixes either). The bearer token never appears in logs or
// errors.
func Wait(ctx context.Context, cfg Config, log logrus.FieldLogger) error {
	p, err := newProber(cfg)
	if p == nil {
		return err
	}
	if cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
		defer cancel()
	}
	log = log.WithField("url", p.target.Redacted())
	if p.TokenFile != "" && p.target.Scheme == "http" {
		log.Warn("sending a bearer token over plain HTTP")
	}
	if err := p.waitReady(ctx, log); err != nil {
		return err
	}
	if p.wantKIDs != nil {
		return p.checkJWKS(ctx, log)
	}
	return nil
}

func (p *prober) waitReady(ctx context.Context, log logrus.FieldLogger) error {
	log.WithFields(logrus.Fields{"settle": p.Settle, "interval": p.Interval, "timeout": p.Timeout}).
		Info("waiting for kube-apiserver to become ready")
	var (
		okSince  time.Time
		settling bool // answered 200 since okSince
		probes   int
		last     *outcome
	)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			desc := "no answer"
			if last != nil {
				desc = last.String()
			}
			if settling {
				desc += fmt.Sprintf(", but only for %s of the %s settle time",
					time.Since(okSince).Round(time.Millisecond), p.Settle)
			}
			within := ""
			if p.Timeout > 0 {
				within = " within " + p.Timeout.String()
			}
			return fmt.Errorf("%w%s: %s after %d probes (last: %s): %w",
				ErrNotReady, within, p.target.Redacted(), probes, desc, ctx.Err())
		case <-timer.C:
		}
		out, err := p.get(ctx, p.target.String(), excerptReadLimit)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			// Cut short by our own deadline: keep the last real answer.
			continue
		}
		if err := p.refused(out); err != nil {
			return err
		}
		probes++
		now := time.Now()
		entry := log.WithFields(logrus.Fields{"probe": probes, "status": out.String()})
		switch {
		case out.ok() && !settling:
			okSince = now
			entry.Info("kube-apiserver answered 200; settling")
		case out.ok() && now.Sub(okSince) >= p.Settle: // the second 200 at least
			entry.WithField("settled", now.Sub(okSince).Round(time.Millisecond)).Info("kube-apiserver ready")
			return nil
		case !out.ok() && settling:
			entry.Warn("kube-apiserver stopped answering 200 while settling; starting over")
		case !out.ok() && (last == nil || last.String() != out.String()):
			// Log changes at info, repeats at debug, to keep the log short.
			entry.Info("kube-apiserver not ready")
		default:
			entry.Debug("readiness probe")
		}
		settling = out.ok()
		last = &out
		timer.Reset(p.Interval)
	}
}
