package restartcmd

import (
	"testing"
	"time"

	"github.com/keysync/confd/internal/fqdn"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/saferestart/internal/restart"
)

// The worst case a dry run prints is every bounded wait of a restart with
// these flags, enumerated here from the flags' values.
func TestWorstCaseSumsEveryWait(t *testing.T) {
	o, s := &Command{}, &cmdkit.Shared{}
	parse(t, s, o, "--dry-run")
	const op = 5 * time.Second // --command-timeout
	want := 2*time.Second +    // --dial-timeout
		3*restart.PreflightTimeout + // before queueing, before each of 2 attempts
		fqdn.Timeout + // hostname -f: no --host
		op + // the gate's probe of the running apiserver
		op + // hold check
		op + 15*time.Minute + // trust gate: read, then --trust-timeout
		2*op + // etcd session, hold check under the lock
		2*op + // restart intent write and delete
		10*time.Minute + // --lock-timeout
		2*(3*time.Minute+restart.KillGrace) + // 2 × (--restart-timeout + kill grace)
		2*(3*time.Minute+op) + // 2 × (--health-timeout + its backstop)
		5*time.Second + // --retry-delay
		op + // trust record
		30*time.Second + op + // hold write, retried
		2*op // unlock, revoke
	if got := WorstCase(&o.Restarting, &s.Etcd); got != want || want != 40*time.Minute+27*time.Second {
		t.Fatalf("worst case %s, want %s (40m27s)", got, want)
	}
	// --host skips hostname -f; --trust-timeout 0 turns the gate off; no gate.
	o, s = &Command{}, &cmdkit.Shared{}
	parse(t, s, o, "--dry-run", "--host", "m1", "--trust-timeout", "0", "--health-url", "")
	if got := WorstCase(&o.Restarting, &s.Etcd); got != want-fqdn.Timeout-op-15*time.Minute-2*(3*time.Minute+op) {
		t.Fatalf("worst case without hostname, trust gate and health gate: %s", got)
	}
}

// Each flag's wait counts: --kubeconfig's fleet check adds --fleet-timeout
// and its two reads.
func TestWorstCaseFleetCheck(t *testing.T) {
	o, s := &Command{}, &cmdkit.Shared{}
	parse(t, s, o, "--dry-run")
	base := WorstCase(&o.Restarting, &s.Etcd)
	o.Kubeconfig, o.FleetTimeout = "/etc/kubernetes/admin.conf", 10*time.Minute
	if got := WorstCase(&o.Restarting, &s.Etcd) - base; got != 10*time.Minute+2*5*time.Second {
		t.Fatalf("the fleet check adds %s, want 10m10s", got)
	}
}

// Every duration a restart's flags set is a wait that WorstCase counts, at
// least once: a wait added to a run and left out of the sum fails.
func TestWorstCaseCountsEveryWait(t *testing.T) {
	o, s := &Command{}, &cmdkit.Shared{}
	parse(t, s, o, "--dry-run", "--kubeconfig", "/k", "--health-url", "https://127.0.0.1:6443/readyz")
	base := WorstCase(&o.Restarting, &s.Etcd)
	for name, d := range map[string]*time.Duration{
		"--lock-timeout": &o.LockTimeout, "--restart-timeout": &o.RestartTimeout, "--retry-delay": &o.RetryDelay,
		"--trust-timeout": &o.TrustTimeout, "--fleet-timeout": &o.FleetTimeout, "--health-timeout": &o.HealthTimeout,
		"--dial-timeout": &s.Etcd.DialTimeout, "--command-timeout": &s.Etcd.CommandTimeout,
	} {
		was := *d
		*d += time.Hour
		if got := WorstCase(&o.Restarting, &s.Etcd) - base; got < time.Hour {
			t.Errorf("%s 1h longer adds %s to the worst case, want at least 1h", name, got)
		}
		*d = was
	}
	var sum time.Duration
	for _, w := range waits(&o.Restarting, &s.Etcd) {
		if w.name == "" || w.times < 0 {
			t.Errorf("wait %+v", w)
		}
		sum += w.each * time.Duration(w.times)
	}
	if got := WorstCase(&o.Restarting, &s.Etcd); got != sum || got != base {
		t.Fatalf("WorstCase %s, sum of waits %s", got, sum)
	}
}
