//go:build rehearsal

package rehearsal

import (
	"strings"
	"testing"
	"time"
)

// The scenarios run on four fleets side by side, each of three masters
// on its own etcd: a fleet spends most of its time waiting (health settles,
// grace periods, lock hand-overs; about a third of one core), so the
// fleets take the time of the longest one rather than the sum. Within a
// fleet the scenarios run in order, each from the converged fleet the
// previous one left; each fleet starts with fresh. -run selects scenarios
// as before (TestRehearsal/(fresh|converged) matches in every fleet);
// TestRehearsal\z/... selects the first fleet only.

// TestRehearsal: the restart path and its faults.
func TestRehearsal(t *testing.T) {
	t.Parallel()
	rehearse(t, []scenario{
		{"fresh", (*fleet).fresh},
		{"converged", (*fleet).allTokens},
		{"reload-budget", (*fleet).reloadBudget},
		{"rotate", (*fleet).rotate},
		{"bad-keys", (*fleet).badKeys},
		{"own-key-missing", (*fleet).ownKeyMissing},
		{"deleted-live-key", (*fleet).deletedLiveKey},
		{"hold", (*fleet).holdAndUnhold},
		{"wrong-health-ca", (*fleet).wrongHealthCA},
		{"sigkill-helper", (*fleet).helperKilled},
		{"reload-timeout", (*fleet).reloadTimeout},
		{"gate-cut", (*fleet).gateCut},
		// Last: it changes m1's key for good.
		{"etcd-restore", (*fleet).etcdRestore},
	})
}

// TestRehearsalKeys: key rotations, a reimage and certificate renewals.
func TestRehearsalKeys(t *testing.T) {
	t.Parallel()
	rehearse(t, []scenario{
		{"fresh", (*fleet).fresh},
		{"sa-key-rotation", (*fleet).saKeyRotation},
		{"rotate-abort", (*fleet).rotateAbort},
		{"rotate-rollback", (*fleet).rotateRollback},
		{"reimaged", (*fleet).reimaged},
		{"retire-timers", (*fleet).retireTimers},
		{"ca-certificates", (*fleet).caCertificates},
	})
}

// TestRehearsalControlPlane: identity Leases, static pods, a reimaged
// kubeadm master and the external signer (last: the fleet stays in signer
// mode).
func TestRehearsalControlPlane(t *testing.T) {
	t.Parallel()
	rehearse(t, []scenario{
		{"fresh", (*fleet).fresh},
		// Before signer: it breaks and restores a confd-rendered bundle.
		{"token-probe", (*fleet).tokenProbeScenario},
		{"fleet-check", (*fleet).fleetCheck},
		{"static-pod", (*fleet).staticPod},
		{"kubeadm-reimage", (*fleet).kubeadmReimage},
		{"signer", (*fleet).signer},
	})
}

// TestRehearsalControllerManager: rotations with a real
// kube-controller-manager, the longest scenario, on a fleet of its own;
// then a master removed for good.
func TestRehearsalControllerManager(t *testing.T) {
	t.Parallel()
	rehearse(t, []scenario{
		{"fresh", (*fleet).fresh},
		{"controller-manager", (*fleet).controllerManager},
		{"stale-tokens", (*fleet).staleTokens},
		// Last: the fleet has two masters after it.
		{"forget-host", (*fleet).forgetHost},
	})
}

type scenario struct {
	name string
	run  func(*fleet, *testing.T)
}

// rehearse runs the scenarios in order on a new fleet. Outages are checked
// for overlap after every scenario.
func rehearse(t *testing.T, scenarios []scenario) {
	f := newFleet(t, 3)
	t.Cleanup(f.tl.close)
	for _, s := range scenarios {
		ok := t.Run(s.name, func(t *testing.T) {
			start := time.Now()
			s.run(f, t)
			if err := f.etcd.Alive(); err != nil {
				t.Fatal(err) // every later scenario would only time out
			}
			f.assertNoOverlap(t)
			t.Logf("%s took %s; restarts per host %v", s.name, time.Since(start).Round(time.Second), f.restarts())
		})
		if !ok && s.name == "fresh" {
			t.FailNow() // nothing else can run on a fleet that never came up
		}
	}
}

// assertNoOverlap fails the scenario for every overlap of outages not
// reported by an earlier scenario.
func (f *fleet) assertNoOverlap(t *testing.T) {
	t.Helper()
	all := f.tl.outages()
	bad := overlaps(all)
	for _, o := range bad {
		if !f.reported[o] {
			f.reported[o] = true
			t.Errorf("apiservers down together: %s", o)
		}
	}
	t.Logf("%d outages recorded, %d overlapping", len(all), len(bad))
}

// fresh brings three fresh hosts up one after the other, as a new site
// would (boot).
func (f *fleet) fresh(t *testing.T) {
	for _, h := range f.hosts {
		h.boot(t)
	}
	f.awaitConverged(t, 4*time.Minute)
}

// boot brings a new host up: the publisher unit (started; ready once it
// published), one `confd -onetime` (the
// confd.service command line with -watch swapped for -onetime), which must
// exit 0 and leave a ready apiserver, then confd.service itself.
func (h *host) boot(t *testing.T) {
	t.Helper()
	f := h.f
	h.unitCtl(t, "start", publisherUnit)
	// Beside the keys it superseded (a reimaged host's lost key).
	if got := f.etcdKeys(t, keyPrefix)[keyPrefix+h.name]; !strings.Contains(got, string(h.sa.public)) {
		t.Fatalf("%s: published key = %q", h.name, got)
	}
	env, argv := h.confdCommand(t)
	swapped := false
	for i, a := range argv {
		if a == "-watch" {
			argv[i], swapped = "-onetime", true
		}
	}
	if !swapped {
		t.Fatalf("confd.service ExecStart has no -watch: %q", argv)
	}
	p := startProcess(t, h.name+" confd -onetime", env, argv)
	select {
	case <-p.done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("%s: confd -onetime still running after 5 min:\n%s", h.name, p.out)
	}
	if code := exitCode(p.err); code != 0 {
		t.Fatalf("%s: first confd -onetime exited %d:\n%s", h.name, code, p.out)
	}
	if !f.tl.isReady(h.name) {
		t.Fatalf("%s: apiserver not ready after confd -onetime", h.name)
	}
	h.startConfd(t)
}

func (f *fleet) allTokens(t *testing.T) {
	f.assertAllTokensAccepted(t)
}

// rotate adds a key (a master about to join), replaces it, and removes
// it; each change restarts every apiserver once, one at a time, and ends
// with every token accepted everywhere.
func (f *fleet) rotate(t *testing.T) {
	extra := keyPrefix + "m4.fleet.test"
	steps := []struct {
		name   string
		change func()
	}{
		{"added", func() { f.put(t, extra, string(newSAKey(t).public)) }},
		{"replaced", func() { f.put(t, extra, string(newSAKey(t).public)) }},
		{"removed", func() { f.del(t, extra) }},
	}
	for _, s := range steps {
		before := f.restarts()
		s.change()
		f.awaitConverged(t, 4*time.Minute)
		after := f.restarts()
		for i := range after {
			if after[i] != before[i]+1 {
				t.Errorf("key %s: %s restarted %d times, want once", s.name, f.hosts[i].name, after[i]-before[i])
			}
		}
		f.assertAllTokensAccepted(t)
	}
}
