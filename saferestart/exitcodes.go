package saferestart

import "github.com/keysync/confd/saferestart/internal/restart"

// Exit codes. Each outcome has its own, so that Puppet, confd and people can
// tell them apart; they are listed in --help and README.md.
const (
	ExitOK          = int(restart.OK)
	ExitError       = int(restart.Error)
	ExitUsage       = int(restart.Usage)
	ExitPreflight   = int(restart.Preflight)
	ExitHold        = int(restart.Held)
	ExitLockTimeout = int(restart.LockTimeout)
	ExitRestart     = int(restart.Failed)
	ExitHealth      = int(restart.Unhealthy)
	ExitLeaseLost   = int(restart.LeaseLost)
	ExitInterrupted = int(restart.Interrupted)
	// ExitStale is `trust` finding a stale host: not an etcd error (1),
	// so that a monitoring check can tell "look at the fleet" from "etcd".
	ExitStale = 10
)

var exitCodeDocs = []struct {
	code int
	text string
}{
	{ExitOK, "success: restarted and ready (or the subcommand succeeded)"},
	{ExitError, "internal or etcd error (unreachable, refused, timed out)"},
	{ExitUsage, "usage error: bad flags or arguments"},
	{ExitPreflight, "preflight failed, the restart command cannot start, or the health gate's TLS/credentials were refused by the running apiserver: nothing restarted, no hold; `check`: a file is invalid, or (--require-signing-keys) lacks a key a host's trust record says is signed with; rotate-key: its key files or the rotation's state do not allow it (--abort after the install, --rollback before it or once retired); forget-host: HOST shows signs of running (its alive record, a live restart intent, a live identity Lease), is this host, or is unknown: nothing done"},
	{ExitHold, "a hold is active: restarts are refused until `unhold`; `status` exits 4 while one is (after printing the report)"},
	{ExitLockTimeout, "lock not acquired within --lock-timeout; key not trusted by every host in time (hosts named; wait-trusted: or etcd never answered); the fleet check found too few live apiservers; another rotation of this host runs (forget-host: of HOST)"},
	{ExitRestart, "restart command failed or timed out (a hold was written)"},
	{ExitHealth, "health gate failed: not ready in time, or 401/403 (a hold was written)"},
	{ExitLeaseLost, "session lease lost (or lock key deleted) while waiting or holding: command terminated, lock not released by us; a hold is written if the command had started"},
	{ExitInterrupted, "interrupted by SIGTERM/SIGINT/SIGHUP/SIGQUIT (waiting: left the queue; restarting: hold written; a second signal stops the command now)"},
	{ExitStale, "`trust`: a host is stale (publishes keys, but its trust record is missing, unparseable or lacks a published key; or its record says it signs with a key no host publishes); the report names it"},
}
