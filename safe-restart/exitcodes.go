package main

// Exit codes. Each outcome has its own, so that Puppet, confd and people can
// tell them apart; they are listed in --help and README.md.
const (
	exitOK          = 0 // restarted and ready (or subcommand succeeded)
	exitError       = 1 // internal or etcd error (unreachable, refused, ...)
	exitUsage       = 2 // bad flags or arguments
	exitPreflight   = 3 // preflight failed; `check`: a file is invalid
	exitHold        = 4 // a hold is active: the line is stopped
	exitLockTimeout = 5 // lock not acquired in time; key not trusted in time; rotation busy
	exitRestart     = 6 // restart command failed or timed out
	exitHealth      = 7 // health gate failed (not ready in time, or 401/403)
	exitLeaseLost   = 8 // session lease lost while holding or waiting
	exitInterrupted = 9 // SIGTERM/SIGINT
)

var exitCodeDocs = []struct {
	code int
	text string
}{
	{exitOK, "success: restarted and ready (or the subcommand succeeded)"},
	{exitError, "internal or etcd error (unreachable, refused, timed out)"},
	{exitUsage, "usage error: bad flags or arguments"},
	{exitPreflight, "preflight failed, nothing locked or restarted; `check`: a file is invalid"},
	{exitHold, "a hold is active: restarts are refused until `unhold`"},
	{exitLockTimeout, "lock not acquired within --lock-timeout; key not trusted by every host in time (hosts named); another rotation of this host runs"},
	{exitRestart, "restart command failed or timed out (a hold was written)"},
	{exitHealth, "health gate failed: not ready in time, or 401/403 (a hold was written)"},
	{exitLeaseLost, "session lease lost while waiting or holding: command terminated, lock not released by us"},
	{exitInterrupted, "interrupted by SIGTERM/SIGINT (waiting: left the queue; restarting: hold written)"},
}
