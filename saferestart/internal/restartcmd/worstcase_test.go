package restartcmd

import (
	"testing"
	"time"

	"github.com/keysync/confd/internal/fqdn"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// The worst case a dry run prints is every bounded wait of a restart with
// these flags, enumerated here from the flags' values.
func TestWorstCaseSumsEveryWait(t *testing.T) {
	o, s := &Command{}, &cmdkit.Shared{}
	parse(t, s, o, "--dry-run")
	const op = 5 * time.Second // --command-timeout
	want := 2*time.Second +    // --dial-timeout
		3*preflightTimeout + // before queueing, before each of 2 attempts
		fqdn.Timeout + // hostname -f: no --host
		op + // the gate's probe of the running apiserver
		op + // hold check
		op + 15*time.Minute + // trust gate: read, then --trust-timeout
		2*op + // etcd session, hold check under the lock
		2*op + // restart intent write and delete
		10*time.Minute + // --lock-timeout
		2*(3*time.Minute+killGrace) + // 2 × (--restart-timeout + kill grace)
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
