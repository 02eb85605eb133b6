package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeconfig writes a kubeconfig for an insecure local test server.
func kubeconfig(t *testing.T, url string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin.conf")
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: not-logged}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`, url)
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The REST client asks what the typed client asks (path, label selector,
// credentials) and decodes the apiserver's JSON.
func TestNewLeasesReadsTheAPI(t *testing.T) {
	var gotPath, gotSel, gotAuth string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotSel, gotAuth = r.URL.Path, r.URL.Query().Get("labelSelector"), r.Header.Get("Authorization")
		list := coordinationv1.LeaseList{TypeMeta: metav1.TypeMeta{Kind: "LeaseList", APIVersion: "coordination.k8s.io/v1"},
			Items: []coordinationv1.Lease{*lease("apiserver-a", "m2", time.Second), *lease("apiserver-b", "m3", time.Hour-time.Minute)}}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(list)
	}))
	defer srv.Close()
	leases, err := NewLeases(kubeconfig(t, srv.URL), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Check(context.Background(), leases, cfg("m1", AllOthers))
	if err != nil {
		t.Fatal(err)
	}
	if gotPath != "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases" || gotSel != Selector || gotAuth != "Bearer not-logged" {
		t.Errorf("request %s ?labelSelector=%s auth %q", gotPath, gotSel, gotAuth)
	}
	if strings.Join(s.Live, ",") != "m2" || strings.Join(s.Missing, ",") != "m3 (renewed 59m0s ago)" || s.OK() {
		t.Errorf("status %s", s)
	}
}

func TestNewLeasesErrors(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,"message":"leases is forbidden"}`)
	}))
	leases, err := NewLeases(kubeconfig(t, srv.URL), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Check(context.Background(), leases, cfg("m1", AllOthers)); !errors.Is(err, ErrAccess) {
		t.Errorf("403: %v, want ErrAccess", err)
	}
	srv.Close() // now nothing answers
	if _, err := Check(context.Background(), leases, cfg("m1", AllOthers)); !errors.Is(err, ErrUnavailable) {
		t.Errorf("closed server: %v, want ErrUnavailable", err)
	}
	if _, err := NewLeases(filepath.Join(t.TempDir(), "none"), time.Second); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("missing kubeconfig: %v", err)
	}
}
