package health

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// checkJWKS compares the key IDs the apiserver publishes with those of the
// key files. A ready apiserver that verifies with the wrong key set is the
// failure this project exists to prevent: tokens from some master would be
// rejected cluster-wide. Transient fetch failures are retried until the
// deadline; a definite answer (a mismatch, 401/403, 404) ends it at once.
func (p *prober) checkJWKS(ctx context.Context, log logrus.FieldLogger) error {
	u := (&url.URL{Scheme: p.target.Scheme, Host: p.target.Host, Path: "/openid/v1/jwks"}).String()
	log = log.WithField("jwks", u)
	last := "no answer"
	for {
		out, err := p.get(ctx, u, jwksReadLimit)
		if err != nil {
			return err
		}
		switch {
		case ctx.Err() != nil:
		case out.ok():
			return p.compareJWKS(u, out.body, log)
		case out.status == http.StatusUnauthorized || out.status == http.StatusForbidden:
			return fmt.Errorf("%w: %s answered %s", ErrUnauthorized, u, out)
		case out.status == http.StatusNotFound:
			return fmt.Errorf("%w: %s answered %s; is --service-account-issuer set?", ErrJWKS, u, out)
		default:
			last = out.String()
			log.WithField("status", last).Info("JWKS not available yet")
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s (last: %s): %w", ErrJWKS, u, last, ctx.Err())
		case <-time.After(p.Interval):
		}
	}
}

func (p *prober) compareJWKS(u string, body []byte, log logrus.FieldLogger) error {
	var doc struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return fmt.Errorf("%w: %s: not a JSON Web Key Set: %w", ErrJWKS, u, err)
	}
	served := map[string]bool{}
	for _, k := range doc.Keys {
		served[k.Kid] = true
	}
	missing := slices.DeleteFunc(slices.Sorted(maps.Keys(p.wantKIDs)), func(k string) bool { return served[k] })
	extra := slices.DeleteFunc(slices.Sorted(maps.Keys(served)), func(k string) bool { return p.wantKIDs[k] })
	if len(missing) == 0 && len(extra) == 0 {
		log.WithField("kids", len(served)).Info("kube-apiserver serves exactly the expected service-account keys")
		return nil
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "missing (in the key files, not served): "+strings.Join(missing, ", "))
	}
	if len(extra) > 0 {
		parts = append(parts, "extra (served, not in the key files): "+strings.Join(extra, ", "))
	}
	// Served kids are the server's text; scrub them like any body.
	return fmt.Errorf("%w: %s: key IDs differ from the key files: %s", ErrJWKS, u, p.redact(strings.Join(parts, "; ")))
}
