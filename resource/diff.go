package resource

import (
	"bytes"
	"fmt"
	"os"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/keysync/confd/internal/redact"
)

// describeChange is what -noop prints: owner and mode changes, then a
// unified diff. Private key material is masked: a dry run's output ends up
// in terminals, tickets and CI logs.
func describeChange(dest string, live liveFile, content []byte, mode os.FileMode, uid, gid int) []byte {
	var b bytes.Buffer
	if !live.exists {
		fmt.Fprintf(&b, "%s: would be created with mode %#o, owner %d:%d\n", dest, uint32(mode.Perm()), uid, gid)
	} else {
		if live.mode != mode {
			fmt.Fprintf(&b, "%s: mode %#o -> %#o\n", dest, uint32(live.mode.Perm()), uint32(mode.Perm()))
		}
		if live.uid != uid || live.gid != gid {
			fmt.Fprintf(&b, "%s: owner %d:%d -> %d:%d\n", dest, live.uid, live.gid, uid, gid)
		}
	}
	diff, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{
		A:        difflib.SplitLines(redact.String(string(live.content))),
		B:        difflib.SplitLines(redact.String(string(content))),
		FromFile: dest,
		ToFile:   dest + " (rendered)",
		Context:  3,
	})
	b.WriteString(diff)
	return b.Bytes()
}
