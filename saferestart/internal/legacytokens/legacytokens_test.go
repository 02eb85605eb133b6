package legacytokens

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func jwt(kid string) string {
	h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"` + kid + `"}`))
	return h + ".eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVmYXVsdDp4In0.c2lnbmF0dXJl"
}

func TestKeyID(t *testing.T) {
	for tok, want := range map[string]string{jwt("abc"): "abc", "": "", "no-dots": "", "!!.x.y": "", base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256"}`)) + ".x.y": ""} {
		if got := KeyID([]byte(tok)); got != want {
			t.Errorf("KeyID(%q) = %q, want %q", tok, got, want)
		}
	}
}

// Holding pages through every namespace's token Secrets and names those
// whose token carries the kid; the tokens never appear in what it returns.
func TestHolding(t *testing.T) {
	var queries []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Path+"?"+r.URL.RawQuery)
		page := map[string]any{"kind": "SecretList", "apiVersion": "v1", "metadata": map[string]any{}}
		item := func(ns, name, kid string) map[string]any {
			return map[string]any{"metadata": map[string]any{"namespace": ns, "name": name}, "type": Type,
				"data": map[string]string{"token": base64.StdEncoding.EncodeToString([]byte(jwt(kid)))}}
		}
		if r.URL.Query().Get("continue") == "" {
			page["metadata"] = map[string]any{"continue": "p2"}
			page["items"] = []any{item("kube-system", "old-token", "OLD"), item("default", "new-token", "NEW")}
		} else {
			page["items"] = []any{item("apps", "legacy", "OLD")}
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	conf := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q, insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n", srv.URL)
	if err := os.WriteFile(kc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := New(kc, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.Holding(context.Background(), "OLD")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "apps/legacy,kube-system/old-token" {
		t.Errorf("Holding = %q", got)
	}
	if len(queries) != 2 || !strings.Contains(queries[0], "fieldSelector=type%3Dkubernetes.io%2Fservice-account-token") || !strings.HasPrefix(queries[0], "/api/v1/secrets?") {
		t.Errorf("queries %q", queries)
	}
}
