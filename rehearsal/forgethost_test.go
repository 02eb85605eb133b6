//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// forgetHost: m3 is removed for good (issue 31 point 10). forget-host
// refuses while m3's apiserver's identity Lease is live; m3 is shut down
// and forgotten from m1. The tokens m3 signed stay accepted by m1 and m2
// until its key is retired; m1's restart passes the fleet check without
// m3's apiserver, and m2's rotation does not wait for m3 to trust its new
// key; once the grace is over, retire-keys from m2 retires m3's key, its
// published value goes, every bundle and apiserver drops it, and m3's
// tokens are refused. Last of its fleet: the fleet has two masters after.
// It first refuses while m3's key publisher runs (its alive record).
func (f *fleet) forgetHost(t *testing.T) {
	m1, m2, m3 := f.hosts[0], f.hosts[1], f.hosts[2]
	f.ensureServiceAccount(t)
	tok := f.token(t, m3)
	kc := m1.writeKubeconfig()
	f.await(t, time.Minute, "m3's identity Lease renewed", func() bool {
		age, ok := f.leaseAges(t, m1)[m3.name]
		return ok && age < 15*time.Second
	})
	// Refused while m3's key publisher runs (its alive record), then, the
	// publisher stopped as the runbook says, while its apiserver serves.
	if code, out := m1.helper(t, "forget-host", m3.name, "--kubeconfig", kc, "--dry-run"); code != 3 || !strings.Contains(out, m3.name+"/alive exists") {
		t.Fatalf("forget-host while m3's publisher runs: exit %d, want 3 naming its alive record:\n%s", code, out)
	}
	m3.unitCtl(t, "stop", publisherUnit)
	if code, out := m1.helper(t, "forget-host", m3.name, "--kubeconfig", kc, "--dry-run"); code != 3 || !strings.Contains(out, "identity Lease of apiserver "+m3.name) {
		t.Fatalf("forget-host while m3 serves: exit %d, want 3 naming its Lease:\n%s", code, out)
	}

	// m3 shut down for good: its confd, controller-manager and apiserver.
	m3.stopConfd(t)
	m3.systemd.stopControllerManager()
	f.tl.outOfService(m3.name)
	m3.systemd.stopUnit()
	f.hosts = f.hosts[:2]
	code, out := m1.helper(t, "forget-host", m3.name, "--kubeconfig", kc, "--grace", "30s")
	if code != 0 || !strings.Contains(out, m3.name+" forgotten") {
		t.Fatalf("forget-host %s: exit %d:\n%s", m3.name, code, out)
	}
	for _, h := range f.hosts {
		if !f.review(t, h, tok) {
			t.Errorf("%s refused m3's token right after forget-host: its key is superseded, not retired", h.name)
		}
	}
	if code, out := m1.helper(t, "trust"); code != 0 || !strings.Contains(out, "GONE: removed by forget-host") {
		t.Errorf("trust after forget-host: exit %d, want 0 showing m3 gone:\n%s", code, out)
	}

	// m1's restart counts the live apiservers: m3 is no longer expected.
	args := append(m1.gateArgs(), "restart", "--host", m1.name, "--kubeconfig", kc, "--fleet-lease-age", "15s", "--fleet-timeout", "20s")
	if code, out := m1.helper(t, args...); code != 0 || !strings.Contains(out, "fleet check before queueing: 1 of 1 other apiservers live") {
		t.Fatalf("m1's restart with m3 forgotten: exit %d:\n%s", code, out)
	}
	f.awaitConverged(t, 2*time.Minute)

	// m2 rotates: the wait for its next key is the two masters'.
	probe := f.startTokenProbe(t)
	f.fullRotation(t, m2, probe)
	probe.finish(t)

	// After the grace: m3's key retired from m2, its value deleted.
	key := "/kubernetes/service-account-keys-rotation/" + m3.name + "/kept"
	var rec struct {
		Superseded map[string]struct {
			RetireAfter time.Time `json:"retire_after"`
		} `json:"superseded"`
		Forgotten time.Time `json:"forgotten"`
	}
	if err := json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &rec); err != nil || rec.Forgotten.IsZero() || len(rec.Superseded) != 1 {
		t.Fatalf("m3's key record %q: %v", f.etcdKeys(t, key)[key], err)
	}
	for _, s := range rec.Superseded {
		time.Sleep(time.Until(s.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	}
	if code, out := m2.retireKeys(t); code != 0 {
		t.Fatalf("retire-keys on m2: exit %d:\n%s", code, out)
	}
	if v, ok := f.etcdKeys(t, keyPrefix)[keyPrefix+m3.name]; ok {
		t.Fatalf("m3's value after its key was retired: %q", v)
	}
	f.awaitConverged(t, 4*time.Minute)
	for _, h := range f.hosts {
		if f.review(t, h, tok) {
			t.Errorf("%s still accepts m3's token after its key was retired", h.name)
		}
	}
	if code, out := m1.helper(t, "trust", "-o", "json"); code != 0 || strings.Contains(out, `"host": "`+m3.name+`"`) {
		t.Errorf("trust after retirement: exit %d, want 0 without m3:\n%s", code, out)
	}
	f.assertAllTokensAccepted(t)
}
