package saferestart

import "github.com/keysync/confd/saferestart/internal/cmdkit"

var exitCodeDocs = []struct {
	code int
	text string
}{
	{cmdkit.ExitOK, "success: restarted and ready (or the subcommand succeeded)"},
	{cmdkit.ExitError, "internal or etcd error (unreachable, refused, timed out)"},
	{cmdkit.ExitUsage, "usage error: bad flags or arguments"},
	{cmdkit.ExitPreflight, "preflight failed, the restart command cannot start, or the health gate's TLS/credentials were refused by the running apiserver: nothing restarted, no hold; `check`: a file is invalid, or (--require-signing-keys) lacks a key a host's trust record says is signed with; rotate-key: its key files or the rotation's state do not allow it (--abort after the install, --rollback before it or once retired); forget-host: HOST shows signs of running (its alive record, a live restart intent, a live identity Lease), is this host, or is unknown: nothing done"},
	{cmdkit.ExitHold, "a hold is active: restarts are refused until `unhold`; `status` exits 4 while one is (after printing the report)"},
	{cmdkit.ExitLockTimeout, "lock not acquired within --lock-timeout; key not trusted by every host in time (hosts named; wait-trusted: or etcd never answered); the fleet check found too few live apiservers; another rotation of this host runs (forget-host: of HOST)"},
	{cmdkit.ExitRestart, "restart command failed or timed out (a hold was written)"},
	{cmdkit.ExitHealth, "health gate failed: not ready in time, or 401/403 (a hold was written)"},
	{cmdkit.ExitLeaseLost, "session lease lost (or lock key deleted) while waiting or holding: command terminated, lock not released by us; a hold is written if the command had started"},
	{cmdkit.ExitInterrupted, "interrupted by SIGTERM/SIGINT/SIGHUP/SIGQUIT (waiting: left the queue; restarting: hold written; a second signal stops the command now)"},
	{cmdkit.ExitStale, "`trust`: a host is stale (publishes keys, but its trust record is missing, unparseable or lacks a published key; or its record says it signs with a key no host publishes); the report names it"},
}
