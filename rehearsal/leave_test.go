//go:build rehearsal

package rehearsal

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// rotationRecord is h's rotation state in etcd, nil when there is none.
type rotationRecord struct {
	Phase       string    `json:"phase"`
	Previous    string    `json:"previous"`
	Next        string    `json:"next"`
	RetireAfter time.Time `json:"retire_after"`
	RolledBack  bool      `json:"rolled_back"`
}

func (f *fleet) rotationRecord(t *testing.T, h *host) *rotationRecord {
	t.Helper()
	key := "/kubernetes/service-account-keys-rotation/" + h.name + "/state"
	v, ok := f.etcdKeys(t, key)[key]
	if !ok {
		return nil
	}
	var st rotationRecord
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		t.Fatalf("rotation state of %s: %v", h.name, err)
	}
	return &st
}

// publishedBy is the key ids h publishes.
func (f *fleet) publishedBy(t *testing.T, h *host) []string {
	t.Helper()
	kids := bundleKids([]byte(f.etcdKeys(t, keyPrefix+h.name)[keyPrefix+h.name]))
	slices.Sort(kids)
	return kids
}

// signingKid is the kid of h's sa.key.
func (h *host) signingKid(t *testing.T) string {
	t.Helper()
	return keyKidOfPrivate(t, h.read("/etc/kubernetes/pki/sa.key"))
}

// pubKids is the key ids in h's sa.pub.
func (h *host) pubKids(t *testing.T) []string {
	t.Helper()
	kids := bundleKids(h.read("/etc/kubernetes/pki/sa.pub"))
	slices.Sort(kids)
	return kids
}

// assertKeyFiles fails unless h's key files (sa.key*, sa.pub*, and
// temporaries beside them) are exactly want: no sa.*.next after an abort,
// no sa.key.previous once retired, no temporary once a step is done.
func (h *host) assertKeyFiles(t *testing.T, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(h.Path("/etc/kubernetes/pki"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		n := strings.TrimPrefix(e.Name(), ".")
		if strings.HasPrefix(n, "sa.key") || strings.HasPrefix(n, "sa.pub") {
			got = append(got, e.Name())
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: key files %v, want %v", h.name, got, want)
	}
}

// assertTrust checks `trust -o json` on h: no stale host, every host
// trusting every kid in trusted, signer signing with signing.
func (f *fleet) assertTrust(t *testing.T, h, signer *host, signing string, trusted ...string) {
	t.Helper()
	code, out := h.helper(t, "trust", "-o", "json")
	var rep struct {
		Hosts []struct {
			Host   string
			Stale  bool
			Record *struct {
				Trusted []string
				Signing string
			}
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("trust -o json: exit %d\n%s", code, out)
	}
	for _, r := range rep.Hosts {
		if r.Stale || r.Record == nil {
			t.Errorf("trust: %s stale or without a record: %+v", r.Host, r.Record)
			continue
		}
		for _, k := range trusted {
			if !slices.Contains(r.Record.Trusted, k) {
				t.Errorf("trust: %s trusts %v, not %s", r.Host, r.Record.Trusted, k)
			}
		}
		if r.Host == signer.name && r.Record.Signing != signing {
			t.Errorf("trust: %s signs with %s, want %s", r.Host, r.Record.Signing, signing)
		}
	}
}

// count is how many tokens of signer with kid every apiserver accepted.
func (p *tokenProbe) count(signer, kid string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kids[signer][kid]
}

// fullRotation rotates h's key with rotate-key as the runbook gives it and
// waits until the fleet serves both keys and a token signed with the new
// one was accepted everywhere; it returns the new kid. Nothing retired.
func (f *fleet) fullRotation(t *testing.T, h *host, probe *tokenProbe) string {
	t.Helper()
	old := h.signingKid(t)
	code, out := h.rotateKey(t, "--timeout", "4m", "--grace", "40s")
	if code != 0 || strings.Contains(out, "resuming the rotation") {
		t.Fatalf("%s: rotate-key: exit %d, want 0 and a new rotation:\n%s", h.name, code, tail(out, 6000))
	}
	next := h.signingKid(t)
	if next == old {
		t.Fatalf("%s signs with %s after rotate-key, as before", h.name, old)
	}
	if got := f.publishedBy(t, h); !slices.Contains(got, old) || !slices.Contains(got, next) {
		t.Fatalf("%s publishes %v after rotate-key, want %s and %s", h.name, got, old, next)
	}
	f.awaitConverged(t, 4*time.Minute)
	f.await(t, time.Minute, "a token signed with "+h.name+"'s new key accepted everywhere", func() bool { return probe.acceptedEverywhere(h.name, next) })
	return next
}

// retireAfterGrace runs retire-keys on h before the grace is over (nothing
// withdrawn) and after it: kid leaves h's sa.pub, its published value and
// every apiserver.
func (f *fleet) retireAfterGrace(t *testing.T, h *host, kid string) {
	t.Helper()
	st := f.rotationRecord(t, h)
	if st == nil || st.Phase != "installed" {
		t.Fatalf("%s: rotation state %+v before retire-keys, want installed", h.name, st)
	}
	// Early only with a margin: on a loaded machine the scenario may
	// already have used up most of the grace.
	if left := time.Until(st.RetireAfter); left > 10*time.Second {
		if code, out := h.retireKeys(t); code != 0 {
			t.Fatalf("%s: retire-keys early: exit %d\n%s", h.name, code, out)
		}
		if !slices.Contains(f.publishedBy(t, h), kid) {
			t.Fatalf("%s: retire-keys withdrew %s before the grace period was over", h.name, kid)
		}
	} else {
		t.Logf("%s: only %s of the grace left: retire-keys not tried early", h.name, left.Round(time.Second))
	}
	time.Sleep(time.Until(st.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	if code, out := h.retireKeys(t); code != 0 {
		t.Fatalf("%s: retire-keys: exit %d\n%s", h.name, code, out)
	}
	if got := f.publishedBy(t, h); slices.Contains(got, kid) {
		t.Fatalf("%s still publishes %s after retire-keys: %v", h.name, kid, got)
	}
	if got := h.pubKids(t); slices.Contains(got, kid) {
		t.Fatalf("%s's sa.pub still holds %s after retire-keys: %v", h.name, kid, got)
	}
	if st := f.rotationRecord(t, h); st == nil || st.Phase != "retired" {
		t.Errorf("%s: rotation state %+v after retire-keys, want retired", h.name, st)
	}
	f.awaitConverged(t, 4*time.Minute) // kid gone from every bundle and JWKS
	h.assertKeyFiles(t, "sa.key", "sa.pub")
}

// rotateAbort: m2's rotation cannot finish (m3's confd is down, so m3
// never trusts the next key): rotate-key publishes the next key, waits and
// exits 5 naming m3. The operator leaves it with `rotate-key --abort`: the
// next key leaves sa.pub, m2's published value and then every apiserver,
// its files are gone, the state is cleared, m2 never signed with it. A
// later rotation starts afresh and finishes. Not one token refused.
func (f *fleet) rotateAbort(t *testing.T) {
	m2, m3 := f.hosts[1], f.hosts[2]
	probe := f.startTokenProbe(t)
	defer probe.finish(t)
	old := m2.signingKid(t)

	m3.stopConfd(t)
	code, out := m2.rotateKey(t, "--timeout", "20s", "--grace", "40s")
	if code != 5 || !strings.Contains(out, m3.name) {
		t.Fatalf("rotate-key with m3 down: exit %d, want 5 naming %s:\n%s", code, m3.name, tail(out, 4000))
	}
	st := f.rotationRecord(t, m2)
	if st == nil || st.Phase != "published" || st.Next == "" {
		t.Fatalf("rotation state after the wait gave up: %+v, want published", st)
	}
	next := st.Next
	if got := f.publishedBy(t, m2); !slices.Equal(got, sorted(old, next)) {
		t.Fatalf("m2 publishes %v after the publish step, want %s and %s", got, old, next)
	}

	// Not installed: a rollback is refused, nothing changed.
	code, out = m2.rotateKey(t, "--rollback")
	if code != 3 || !strings.Contains(out, "use rotate-key --abort") {
		t.Fatalf("rotate-key --rollback before the install: exit %d, want 3:\n%s", code, tail(out, 4000))
	}
	code, out = m2.rotateKey(t, "--abort")
	if code != 0 {
		t.Fatalf("rotate-key --abort: exit %d:\n%s", code, tail(out, 4000))
	}
	if got := m2.signingKid(t); got != old {
		t.Fatalf("m2 signs with %s after the abort, want %s", got, old)
	}
	if got := m2.pubKids(t); !slices.Equal(got, []string{old}) {
		t.Errorf("m2's sa.pub holds %v after the abort, want only %s", got, old)
	}
	if got := f.publishedBy(t, m2); !slices.Equal(got, []string{old}) {
		t.Errorf("m2 publishes %v after the abort, want only %s", got, old)
	}
	if st := f.rotationRecord(t, m2); st != nil {
		t.Errorf("rotation state after the abort: %+v, want none", st)
	}
	m2.assertKeyFiles(t, "sa.key", "sa.pub")
	if code, out := m2.rotateKey(t, "--abort"); code != 3 {
		t.Errorf("a second rotate-key --abort: exit %d, want 3 (nothing to abort):\n%s", code, tail(out, 4000))
	}

	m3.startConfd(t)
	f.awaitConverged(t, 4*time.Minute)
	if slices.Contains(f.publishedKids(t), next) {
		t.Fatalf("the aborted key %s is still published", next)
	}
	if n := probe.count(m2.name, next); n != 0 {
		t.Errorf("%d tokens of m2 signed with the aborted key %s", n, next)
	}

	// A rotation after the abort starts afresh (a new key) and finishes.
	newer := f.fullRotation(t, m2, probe)
	if newer == next {
		t.Errorf("the rotation after the abort installed the aborted key %s", next)
	}
	f.retireAfterGrace(t, m2, old)
	m2.sa = m2.installedSAKey(t)
	if m2.sa.kid != newer {
		t.Fatalf("m2's sa.key holds %s after the rotation, want %s", m2.sa.kid, newer)
	}
}

// rotateRollback: m3's key rotated to the end, then `rotate-key --rollback`
// before retire-keys: the previous key signs again (one restart of m3,
// through the lock, no other master restarted), the rolled-back key stays
// published and trusted (a token signed with it before the rollback is
// still accepted everywhere) until retire-keys after the grace withdraws
// it. Not one token refused.
func (f *fleet) rotateRollback(t *testing.T) {
	m3 := f.hosts[2]
	probe := f.startTokenProbe(t)
	defer probe.finish(t)
	old := m3.signingKid(t)

	next := f.fullRotation(t, m3, probe)
	m3.assertKeyFiles(t, "sa.key", "sa.key.previous", "sa.pub")
	signedWithNext := f.token(t, m3)
	if kid := tokenKid(signedWithNext); kid != next {
		t.Fatalf("m3's token carries kid %s after the rotation, want %s", kid, next)
	}
	if code, out := m3.rotateKey(t, "--abort"); code != 3 || !strings.Contains(out, "use rotate-key --rollback") {
		t.Fatalf("rotate-key --abort after the install: exit %d, want 3:\n%s", code, tail(out, 4000))
	}

	before, oldTokens := f.restarts(), probe.count(m3.name, old)
	code, out := m3.rotateKey(t, "--rollback", "--grace", "40s")
	if code != 0 {
		t.Fatalf("rotate-key --rollback: exit %d:\n%s", code, tail(out, 6000))
	}
	for _, want := range []string{"lock acquired", "restart done and ready; lock released", "rollback done"} {
		if !strings.Contains(out, want) {
			t.Errorf("rotate-key --rollback never logged %q:\n%s", want, tail(out, 6000))
		}
	}
	after := f.restarts()
	for i, h := range f.hosts {
		want := int64(0)
		if h == m3 {
			want = 1
		}
		if after[i]-before[i] != want {
			t.Errorf("rollback restarted %s %d times, want %d", h.name, after[i]-before[i], want)
		}
	}
	if got := m3.signingKid(t); got != old {
		t.Fatalf("m3 signs with %s after the rollback, want the previous key %s", got, old)
	}
	if got := keyKidOfPrivate(t, m3.read("/etc/kubernetes/pki/sa.key.previous")); got != next {
		t.Errorf("sa.key.previous holds %s after the rollback, want the rolled-back key %s", got, next)
	}
	if got := f.publishedBy(t, m3); !slices.Equal(got, sorted(old, next)) {
		t.Errorf("m3 publishes %v after the rollback, want %s and %s until retire-keys", got, old, next)
	}
	st := f.rotationRecord(t, m3)
	if st == nil || st.Phase != "installed" || !st.RolledBack || st.Next != old || st.Previous != next {
		t.Errorf("rotation state after the rollback: %+v, want installed, rolled back, next %s, previous %s", st, old, next)
	}
	m3.assertKeyFiles(t, "sa.key", "sa.key.previous", "sa.pub")
	f.awaitConverged(t, 4*time.Minute)
	f.await(t, time.Minute, "a token signed with m3's previous key accepted everywhere after the rollback", func() bool { return probe.count(m3.name, old) > oldTokens })
	if kid := tokenKid(f.token(t, m3)); kid != old {
		t.Errorf("m3's token carries kid %s after the rollback, want %s", kid, old)
	}
	for _, h := range f.hosts {
		if !f.review(t, h, signedWithNext) {
			t.Errorf("%s refused a token m3 signed with the rolled-back key before the rollback", h.name)
		}
	}
	f.assertTrust(t, m3, m3, old, old, next)

	f.retireAfterGrace(t, m3, next)
	for _, h := range f.hosts {
		if f.review(t, h, signedWithNext) {
			t.Errorf("%s still accepts a token signed with the retired key %s", h.name, next)
		}
	}
	code, out = m3.rotateKey(t, "--rollback")
	if code != 3 || !strings.Contains(out, "was retired") {
		t.Errorf("rotate-key --rollback after retire-keys: exit %d, want 3:\n%s", code, tail(out, 4000))
	}
}

func sorted(kids ...string) []string {
	slices.Sort(kids)
	return kids
}
