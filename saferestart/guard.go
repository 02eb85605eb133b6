package saferestart

import (
	"github.com/keysync/confd/internal/groupguard"
)

// guardArg is the hidden first argument that makes this binary the
// restart command's group guard (internal/groupguard, shared with confd).
const guardArg = groupguard.Arg

// groupGuard is the guard's main. The helper starts the guard early,
// while it dials etcd and waits for the lock, so that the guard's own
// start-up is off the restart's critical path; the guard runs the command
// only once the helper hands it over (its environment, which holds the
// lock's key and must stay off any command line, on the guard's stdin).
// When the helper dies the guard kills the whole group at once: the lock
// is the helper's, and the next host must not restart beside this one.
func groupGuard(args []string) int { return groupguard.Main(progName, args) }
