package saferestart

import (
	"github.com/keysync/confd/internal/groupguard"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
)

// guardArg is the hidden first argument that makes this binary the
// restart command's group guard (internal/groupguard, shared with confd).
const guardArg = groupguard.Arg

// groupGuard is the guard's main: the helper runs each restart attempt
// under it once the lock is held. When the helper dies the guard ends the
// command's whole group: the lock is the helper's, and the next host must
// not restart beside this one.
func groupGuard(args []string) int { return groupguard.Main(cmdkit.ProgName, args) }
