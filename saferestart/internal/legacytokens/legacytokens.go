// Package legacytokens finds the legacy service-account token Secrets
// (type kubernetes.io/service-account-token, filled by
// kube-controller-manager) whose token was signed with a given key: such a
// token stops working everywhere once its key leaves every apiserver's
// --service-account-key-file. Only the JWT header's "kid" is read; a token
// never leaves this package, and no error or log line carries one.
package legacytokens

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Type is the Secret type kube-controller-manager fills with a token.
const Type = "kubernetes.io/service-account-token"

const pageSize = 500

// Lister lists the token Secrets of every namespace through the apiserver
// a kubeconfig names. client-go builds the HTTP client (TLS, credentials,
// exec plugins); the list is decoded into the few fields read here, so the
// helper does not link core/v1's types.
type Lister struct {
	client *http.Client
	host   string
}

// New loads the kubeconfig (current context); each request is bounded by
// opTimeout.
func New(kubeconfig string, opTimeout time.Duration) (*Lister, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = opTimeout
	cfg.UserAgent = "kube-apiserver-safe-restart"
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return &Lister{client: hc, host: strings.TrimSuffix(cfg.Host, "/")}, nil
}

type secretList struct {
	Metadata struct {
		Continue string `json:"continue"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"metadata"`
		Type string            `json:"type"`
		Data map[string][]byte `json:"data"` // base64 in JSON: decoded
	} `json:"items"`
}

// Holding lists, as namespace/name, the token Secrets whose token's kid is
// kid.
func (l *Lister) Holding(ctx context.Context, kid string) ([]string, error) {
	var out []string
	cont := ""
	for {
		q := url.Values{"fieldSelector": {"type=" + Type}, "limit": {fmt.Sprint(pageSize)}}
		if cont != "" {
			q.Set("continue", cont)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.host+"/api/v1/secrets?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := l.client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("list %s Secrets: %w", Type, err)
		}
		var page secretList
		if resp.StatusCode == http.StatusOK {
			err = json.NewDecoder(resp.Body).Decode(&page)
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			err = fmt.Errorf("list %s Secrets: HTTP %d (the kubeconfig needs list on secrets in every namespace)", Type, resp.StatusCode)
		}
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		for _, s := range page.Items {
			if s.Type == Type && KeyID(s.Data["token"]) == kid {
				out = append(out, s.Metadata.Namespace+"/"+s.Metadata.Name)
			}
		}
		if cont = page.Metadata.Continue; cont == "" {
			break
		}
	}
	sort.Strings(out)
	return out, nil
}

// KeyID is the "kid" of a JWT's header; "" when it has none or is no JWT.
func KeyID(token []byte) string {
	header, _, ok := strings.Cut(string(token), ".")
	raw, err := base64.RawURLEncoding.DecodeString(header)
	var h struct {
		Kid string `json:"kid"`
	}
	if !ok || err != nil || json.Unmarshal(raw, &h) != nil {
		return ""
	}
	return h.Kid
}
