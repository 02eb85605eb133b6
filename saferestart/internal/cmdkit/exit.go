package cmdkit

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
