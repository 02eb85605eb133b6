//go:build rehearsal

package rehearsal

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/keysync/confd/internal/etcdtest"
)

// probeInterval is the scenario's token-probe-interval (1m by default).
const probeInterval = 2 * time.Second

// tokenProbeScenario: the cross-acceptance probe of every master's
// publisher (issue 33.5), run by the shipped sa-key-publish.service and
// switched on by the shipped (commented) token-probe-* lines of
// safe-restart.toml, with examples/rbac/token-probe.yaml applied. On the
// converged fleet every publisher's row is all 1. Then m2's live bundle
// lacks m1's key (its confd stopped, the bundle rewritten, its apiserver
// restarted directly): the first answer m1's probe gets from m2's new
// apiserver is 0, the rest of the matrix stays 1. Restored: all 1 again.
func (f *fleet) tokenProbeScenario(t *testing.T) {
	start := time.Now()
	m1, m2 := f.hosts[0], f.hosts[1]
	f.applyManifest(t, "rbac/token-probe.yaml")
	p, restore := f.enableTokenProbes(t)
	defer restore()

	p.awaitMatrix(t, "every publisher's row all 1 on the converged fleet", func(issuer, verifier *host) float64 { return 1 })
	t.Logf("token probe: 3×3 accepted on the converged fleet after %s", time.Since(start).Round(time.Millisecond))

	// m2's live bundle without m1's key, as a bundle that lost it would be.
	const bundle = "/etc/kubernetes/pki/sa-bundle.pem"
	live := m2.read(bundle)
	m2.stopConfd(t)
	broken := true
	defer func() {
		if broken { // the scenario failed half-way: leave m2 as it was
			m2.write(bundle, string(live), 0o644)
			m2.systemctl(t, "restart", "kube-apiserver.service")
			m2.startConfd(t)
		}
	}()
	m2.write(bundle, string(withoutKey(t, live, m1.sa.kid)), 0o644)
	if code, out := m2.systemctl(t, "restart", "kube-apiserver.service"); code != 0 {
		t.Fatalf("restart m2's apiserver: exit %d: %s", code, out)
	}
	restarted := time.Now() // the old apiserver is gone: every later answer is the new one's
	f.await(t, 2*time.Minute, "m1's probe: m2 refusing m1's token", func() bool {
		v, at, ok := p.cell(t, m1, m2)
		if ok && at.After(restarted) && v != 0 {
			t.Fatalf("m1's probe: m2's new apiserver, whose bundle lacks m1's key, accepted m1's token (answer at %s)", at.Format(time.RFC3339Nano))
		}
		return ok && at.After(restarted) && v == 0
	})
	_, at, _ := p.cell(t, m1, m2)
	// The new apiserver authenticates before its /readyz says ready, so
	// the time is taken from its start (the restart's return).
	t.Logf("token probe: m1→m2 at 0, answered %s after m2's new apiserver started (interval %s)",
		at.Sub(restarted).Round(time.Millisecond), probeInterval)
	p.awaitMatrix(t, "one 0 in the matrix: m1's token on m2", func(issuer, verifier *host) float64 {
		if issuer == m1 && verifier == m2 {
			return 0
		}
		return 1
	})

	// Restored: m2's bundle back, its apiserver restarted, its confd again.
	broken = false
	m2.write(bundle, string(live), 0o644)
	if code, out := m2.systemctl(t, "restart", "kube-apiserver.service"); code != 0 {
		t.Fatalf("restart m2's apiserver: exit %d: %s", code, out)
	}
	m2.startConfd(t)
	p.awaitMatrix(t, "every row all 1 again", func(issuer, verifier *host) float64 { return 1 })
	f.awaitConverged(t, 2*time.Minute)
	t.Logf("token probe scenario wall time %s", time.Since(start).Round(time.Millisecond))
}

// applyManifest creates the objects of an example manifest, as kubectl
// apply would on a fresh cluster (an object already there is left).
func (f *fleet) applyManifest(t *testing.T, example string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(etcdtest.RepoRoot(), "examples", example))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("%s: %v", example, err)
		}
		if obj == nil {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		ns, _ := meta["namespace"].(string)
		kind, _ := obj["kind"].(string)
		var path string
		switch kind {
		case "ServiceAccount":
			path = "/api/v1/namespaces/" + ns + "/serviceaccounts"
		case "Role", "RoleBinding":
			path = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/" + strings.ToLower(kind) + "s"
		case "ClusterRole", "ClusterRoleBinding":
			path = "/apis/rbac.authorization.k8s.io/v1/" + strings.ToLower(kind) + "s"
		default:
			t.Fatalf("%s: kind %q not applied by the rehearsal", example, kind)
		}
		body, _ := json.Marshal(obj)
		resp, err := f.admin.Post(f.hosts[0].APIServerURL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
			t.Fatalf("%s: create %s %v: HTTP %d: %s", example, kind, meta["name"], resp.StatusCode, msg)
		}
	}
}

// enableTokenProbes gives each master the probe's kubeconfig (a client
// certificate in group keysync:token-probers, as token-probe.yaml binds),
// switches on the shipped token-probe-* lines of its safe-restart.toml with
// the fleet's apiservers and probeInterval, serves its publisher's
// /metrics, and restarts its publisher. The func it returns puts the
// shipped file back and restarts the publishers.
func (f *fleet) enableTokenProbes(t *testing.T) (*probes, func()) {
	t.Helper()
	p := &probes{f: f, addr: map[*host]string{}}
	var list []string
	for _, h := range f.hosts {
		list = append(list, strconv.Quote(h.name+"="+h.APIServerURL))
	}
	saved := map[*host]string{}
	for _, h := range f.hosts {
		cfg := string(h.read(configPath))
		saved[h] = cfg
		set := map[string]string{
			"token-probe-kubeconfig":      "", // as shipped
			"token-probe-service-account": "",
			"token-probe-interval":        strconv.Quote(probeInterval.String()),
			"token-probe-apiservers":      "[" + strings.Join(list, ", ") + "]",
		}
		var kubeconfig string
		for key, value := range set {
			re := regexp.MustCompile(`(?m)^# (` + key + `) += (.*)$`)
			m := re.FindStringSubmatch(cfg)
			if m == nil {
				t.Fatalf("%s's %s has no commented %s line as shipped", h.name, configPath, key)
			}
			if value == "" {
				value = m[2]
			}
			if key == "token-probe-kubeconfig" {
				kubeconfig, _ = strconv.Unquote(value)
			}
			cfg = re.ReplaceAllLiteralString(cfg, key+" = "+value)
		}
		p.addr[h] = fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
		cfg += "publisher-metrics-addr = " + strconv.Quote(p.addr[h]) + "\n"
		pki := h.Path("/etc/kubernetes/pki/")
		c, k := f.ca.issue(t, "keysync:token-probe:"+h.name, []string{"keysync:token-probers"}, false)
		h.write("/etc/kubernetes/pki/token-probe.crt", string(c), 0o644)
		h.write("/etc/kubernetes/pki/token-probe.key", string(k), 0o600)
		if err := os.WriteFile(kubeconfig, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: fleet
  cluster: {server: %q, certificate-authority: %q}
users:
- name: token-probe
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: token-probe@fleet
  context: {cluster: fleet, user: token-probe}
current-context: token-probe@fleet
`, h.APIServerURL, pki+"ca.crt", pki+"token-probe.crt", pki+"token-probe.key"), 0o600); err != nil {
			t.Fatal(err)
		}
		h.write(configPath, cfg, 0o644)
		h.unitCtl(t, "restart", publisherUnit)
	}
	return p, func() {
		for _, h := range f.hosts {
			h.write(configPath, saved[h], 0o644)
			h.unitCtl(t, "restart", publisherUnit)
		}
	}
}

// withoutKey is a PEM bundle without the public key kid.
func withoutKey(t *testing.T, bundle []byte, kid string) []byte {
	t.Helper()
	var out bytes.Buffer
	dropped := false
	for {
		var b *pem.Block
		b, bundle = pem.Decode(bundle)
		if b == nil {
			break
		}
		if b.Type == "PUBLIC KEY" && kidOf(b.Bytes) == kid {
			dropped = true
			continue
		}
		_ = pem.Encode(&out, b)
	}
	if !dropped {
		t.Fatalf("bundle has no key %s", kid)
	}
	return out.Bytes()
}

var probeSeries = regexp.MustCompile(`^(kube_apiserver_safe_restart_token_accepted|kube_apiserver_safe_restart_token_probe_timestamp_seconds)\{([^}]*)\} (\S+)$`)

// probes are the publishers' metrics addresses.
type probes struct {
	f    *fleet
	addr map[*host]string
}

// row reads issuer's publisher's /metrics: verifier host → accepted, and
// the time of the answer.
func (p *probes) row(t *testing.T, issuer *host) (map[string]float64, map[string]time.Time) {
	t.Helper()
	accepted, at := map[string]float64{}, map[string]time.Time{}
	resp, err := http.Get("http://" + p.addr[issuer] + "/metrics")
	if err != nil {
		return accepted, at // the publisher restarting
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := probeSeries.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range regexp.MustCompile(`(\w+)="([^"]*)"`).FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		if labels["issuer_host"] != issuer.name {
			t.Fatalf("%s's publisher exports issuer_host %q", issuer.name, labels["issuer_host"])
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("%s's publisher: %q: %v", issuer.name, sc.Text(), err)
		}
		if strings.HasSuffix(m[1], "_accepted") {
			accepted[labels["verifier_host"]] = v
		} else {
			at[labels["verifier_host"]] = time.Unix(0, int64(v*1e9))
		}
	}
	return accepted, at
}

// cell is issuer's row's value for verifier and when it was answered.
func (p *probes) cell(t *testing.T, issuer, verifier *host) (float64, time.Time, bool) {
	t.Helper()
	accepted, at := p.row(t, issuer)
	v, ok := accepted[verifier.name]
	return v, at[verifier.name], ok
}

// awaitMatrix waits until every publisher's row is want's, each of its
// cells answered, and no other verifier exported.
func (p *probes) awaitMatrix(t *testing.T, what string, want func(issuer, verifier *host) float64) {
	t.Helper()
	var why string
	defer func() {
		if t.Failed() {
			t.Logf("last matrix difference: %s", why)
		}
	}()
	p.f.await(t, 2*time.Minute, what, func() bool {
		for _, issuer := range p.f.hosts {
			row, _ := p.row(t, issuer)
			if len(row) != len(p.f.hosts) {
				why = fmt.Sprintf("%s's row: %v", issuer.name, row)
				return false
			}
			for _, verifier := range p.f.hosts {
				if v, ok := row[verifier.name]; !ok || v != want(issuer, verifier) {
					why = fmt.Sprintf("%s's row: %v", issuer.name, row)
					return false
				}
			}
		}
		return true
	})
}
