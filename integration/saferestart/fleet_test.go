package saferestart

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
)

// leaseServer stands in for the local apiserver's Lease API: answer(n)
// gives, for the n-th request (1-based), each host's Lease age.
func leaseServer(t *testing.T, answer func(n int32) map[string]time.Duration) (kubeconfig string, requests *atomic.Int32) {
	t.Helper()
	requests = &atomic.Int32{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := requests.Add(1)
		if r.URL.Path != "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases" ||
			r.URL.Query().Get("labelSelector") != "apiserver.kubernetes.io/identity=kube-apiserver" {
			http.NotFound(w, r)
			return
		}
		var items []map[string]any
		for host, age := range answer(n) {
			items = append(items, map[string]any{
				"metadata": map[string]any{"name": "apiserver-" + host, "namespace": "kube-system",
					"labels": map[string]string{"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": host}},
				"spec": map[string]any{"holderIdentity": "apiserver-" + host, "leaseDurationSeconds": 3600,
					"renewTime": time.Now().Add(-age).UTC().Format("2006-01-02T15:04:05.000000Z07:00")},
			})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "items": items})
	}))
	t.Cleanup(srv.Close)
	return writeKubeconfig(t, srv.URL), requests
}

func writeKubeconfig(t *testing.T, url string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin.conf")
	conf := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q, insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n", url)
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFleetCheck: a restart looks at the other apiservers' identity Leases
// before queueing (waiting) and under the lock (not waiting); with one
// missing it exits 5 naming it, having run nothing and written no hold.
func TestFleetCheck(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	live := map[string]time.Duration{"m1": time.Second, "m2": 3 * time.Second, "m3": 5 * time.Second}
	m3down := map[string]time.Duration{"m1": time.Second, "m2": 3 * time.Second, "m3": 50 * time.Second}
	run := func(t *testing.T, lock string, answer func(n int32) map[string]time.Duration, more ...string) (*proc, string, *atomic.Int32) {
		t.Helper()
		kc, reqs := leaseServer(t, answer)
		marker := filepath.Join(t.TempDir(), "restarted")
		args := append([]string{"--host", "m1.example.com", "--kubeconfig", kc}, more...)
		p := runBin(t, env(s), lockArgs(lock, append(args, "--", "touch", marker)...)...)
		return p, marker, reqs
	}
	restarted := func(marker string) bool { _, err := os.Stat(marker); return err == nil }
	noHold := func(t *testing.T, lock string) {
		t.Helper()
		if v, ok := getKey(t, cli, lock+"-hold"); ok {
			t.Errorf("hold written: %s", v)
		}
		if q := queueKeys(t, cli, lock); len(q) != 0 {
			t.Errorf("lock queue not empty: %v", q)
		}
	}

	t.Run("degraded: waits, then exit 5 naming the missing one", func(t *testing.T) {
		p, marker, reqs := run(t, "fleet-degraded", func(int32) map[string]time.Duration { return m3down }, "--fleet-timeout", "2500ms")
		if p.code != codeLockTimeout || restarted(marker) {
			t.Fatalf("exit %d (want %d), restarted %v:\n%s", p.code, codeLockTimeout, restarted(marker), p.stderr)
		}
		if !strings.Contains(p.stderr.String(), "m3 (renewed") || strings.Contains(p.stderr.String(), "m1 (renewed") {
			t.Errorf("the error should name m3 only:\n%s", p.stderr)
		}
		if reqs.Load() < 2 {
			t.Errorf("%d reads: it did not wait", reqs.Load())
		}
		noHold(t, "fleet-degraded")
	})
	t.Run("recovers while waiting", func(t *testing.T) {
		p, marker, _ := run(t, "fleet-recovers", func(n int32) map[string]time.Duration {
			if n == 1 {
				return m3down
			}
			return live
		})
		if p.code != codeOK || !restarted(marker) {
			t.Fatalf("exit %d, restarted %v:\n%s", p.code, restarted(marker), p.stderr)
		}
	})
	t.Run("under the lock, not waiting", func(t *testing.T) {
		p, marker, reqs := run(t, "fleet-underlock", func(n int32) map[string]time.Duration {
			if n == 1 {
				return live
			}
			return m3down
		})
		if p.code != codeLockTimeout || restarted(marker) || reqs.Load() != 2 {
			t.Fatalf("exit %d (want %d), restarted %v, %d reads (want 2):\n%s", p.code, codeLockTimeout, restarted(marker), reqs.Load(), p.stderr)
		}
		if !strings.Contains(p.stderr.String(), "under the lock") {
			t.Errorf("not reported as the check under the lock:\n%s", p.stderr)
		}
		noHold(t, "fleet-underlock")
	})
	t.Run("stopped gracefully: no Lease, but it records trust", func(t *testing.T) {
		// A v1.37.2 apiserver deletes its identity Lease when stopped
		// gracefully; m3 still publishes a key and records trust.
		pub := string(keytest.PublicPEM(t, keytest.EC(t).Public()))
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		for key, val := range map[string]string{
			"/graceful/keys/m3.example.com":  pub,
			"/graceful/trust/m3.example.com": `{"host":"m3.example.com","trusted":[],"bundle_sha256":"","time":"2026-12-02T10:00:00Z"}`,
			"/graceful/keys/m2.example.com":  pub,
			"/graceful/trust/m2.example.com": `{"host":"m2.example.com","trusted":[],"bundle_sha256":"","time":"2026-12-02T10:00:00Z"}`,
		} {
			if _, err := cli.Put(ctx, key, val); err != nil {
				t.Fatal(err)
			}
		}
		onlyTwo := map[string]time.Duration{"m1": time.Second, "m2": 3 * time.Second}
		p, marker, _ := run(t, "fleet-graceful", func(int32) map[string]time.Duration { return onlyTwo },
			"--keys-prefix", "/graceful/keys/", "--trust-prefix", "/graceful/trust/", "--fleet-timeout", "100ms")
		if p.code != codeLockTimeout || restarted(marker) || !strings.Contains(p.stderr.String(), "m3.example.com (no identity Lease)") {
			t.Fatalf("exit %d (want %d), restarted %v:\n%s", p.code, codeLockTimeout, restarted(marker), p.stderr)
		}
		if strings.Contains(p.stderr.String(), "m2.example.com (no identity Lease)") {
			t.Errorf("m2's Lease (hostname m2) was not matched to m2.example.com:\n%s", p.stderr)
		}
		noHold(t, "fleet-graceful")
	})
	t.Run("reimaged master waits for this restart: not counted", func(t *testing.T) {
		// The kubeadm reimage deadlock: m3 came back with a new key, has
		// no identity Lease (its apiserver waits in wait-trusted for this
		// restart to trust that key) but still publishes and records
		// trust. Its waiting record lets the restart that trusts the key
		// go; one waiting for a key this restart does not load does not.
		newKey := keytest.EC(t)
		newPub := keytest.PublicPEM(t, newKey.Public())
		bundle := writeFile(t, filepath.Join(t.TempDir(), "bundle.pem"), newPub)
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		for key, val := range map[string]string{
			"/reimage/keys/m3.example.com":  string(newPub),
			"/reimage/trust/m3.example.com": `{"host":"m3.example.com","trusted":[],"bundle_sha256":"","time":"2026-12-02T10:00:00Z"}`,
			"/reimage/rotation/m3.example.com/waiting": `{"host":"m3.example.com","keys":["` + keytest.KeyID(t, newKey.Public()) +
				`"],"since":"2026-12-02T10:00:00Z","pid":42}`,
		} {
			if _, err := cli.Put(ctx, key, val); err != nil {
				t.Fatal(err)
			}
		}
		onlyTwo := map[string]time.Duration{"m1": time.Second, "m2": 3 * time.Second, "m3": 20 * time.Minute}
		prefixes := []string{"--keys-prefix", "/reimage/keys", "--trust-prefix", "/reimage/trust", "--rotation-prefix", "/reimage/rotation", "--fleet-timeout", "100ms"}
		p, marker, _ := run(t, "fleet-reimage", func(int32) map[string]time.Duration { return onlyTwo }, append(prefixes, "--preflight-file", bundle)...)
		if p.code != codeOK || !restarted(marker) || !strings.Contains(p.stderr.String(), "waiting for this restart to trust their key: m3.example.com") {
			t.Fatalf("exit %d, restarted %v:\n%s", p.code, restarted(marker), p.stderr)
		}
		other := writeFile(t, filepath.Join(t.TempDir(), "other.pem"), keytest.PublicPEM(t, keytest.EC(t).Public()))
		p, marker, _ = run(t, "fleet-reimage", func(int32) map[string]time.Duration { return onlyTwo }, append(prefixes, "--preflight-file", other)...)
		if p.code != codeLockTimeout || restarted(marker) || !strings.Contains(p.stderr.String(), "m3 (renewed 20m0s ago)") {
			t.Fatalf("a restart that does not trust m3's key: exit %d (want %d), restarted %v:\n%s", p.code, codeLockTimeout, restarted(marker), p.stderr)
		}
		noHold(t, "fleet-reimage")
	})
	t.Run("explicit minimum", func(t *testing.T) {
		p, marker, _ := run(t, "fleet-min", func(int32) map[string]time.Duration { return m3down }, "--min-live-apiservers", "1")
		if p.code != codeOK || !restarted(marker) {
			t.Fatalf("exit %d, restarted %v:\n%s", p.code, restarted(marker), p.stderr)
		}
	})
	t.Run("local apiserver down: skipped with one line", func(t *testing.T) {
		kc := writeKubeconfig(t, "https://"+strings.TrimPrefix(etcdtest.UnusedEndpoint(t), "http://"))
		marker := filepath.Join(t.TempDir(), "restarted")
		p := runBin(t, env(s), lockArgs("fleet-down", "--host", "m1", "--kubeconfig", kc, "--", "touch", marker)...)
		if p.code != codeOK || !restarted(marker) {
			t.Fatalf("exit %d, restarted %v:\n%s", p.code, restarted(marker), p.stderr)
		}
		if n := strings.Count(p.stderr.String(), "fleet check before queueing skipped"); n != 1 {
			t.Errorf("%d skip lines before queueing, want 1:\n%s", n, p.stderr)
		}
	})
	t.Run("no kubeconfig: skipped", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "restarted")
		p := runBin(t, env(s), lockArgs("fleet-none", "--host", "m1", "--", "touch", marker)...)
		if p.code != codeOK || strings.Count(p.stderr.String(), "fleet check skipped") != 1 {
			t.Fatalf("exit %d:\n%s", p.code, p.stderr)
		}
	})
	t.Run("dry run counts the wait", func(t *testing.T) {
		worst := func(more ...string) float64 {
			p := runBin(t, env(s), lockArgs("fleet-dry", append([]string{"--host", "m1", "--dry-run", "-o", "json"}, more...)...)...)
			var plan struct {
				Worst float64 `json:"worst_case_seconds"`
			}
			if p.code != codeOK || json.Unmarshal([]byte(p.stdout.String()), &plan) != nil {
				t.Fatalf("exit %d: %s\n%s", p.code, p.stdout, p.stderr)
			}
			return plan.Worst
		}
		kc := writeKubeconfig(t, "https://127.0.0.1:1")
		if d := worst("--kubeconfig", kc, "--fleet-timeout", "7m") - worst(); d != 7*60+2*5 {
			t.Errorf("--kubeconfig adds %.0f s to the worst case, want the 7 m wait and two reads (430 s)", d)
		}
	})
}
