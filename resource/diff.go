package resource

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
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
		A:        difflib.SplitLines(redact(string(live.content))),
		B:        difflib.SplitLines(redact(string(content))),
		FromFile: dest,
		ToFile:   dest + " (rendered)",
		Context:  3,
	})
	b.WriteString(diff)
	return b.Bytes()
}

// redact replaces the body of every PEM private key block.
func redact(s string) string {
	if !strings.Contains(s, "PRIVATE KEY-----") {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	inKey := false
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "-----BEGIN ") && strings.HasSuffix(t, "PRIVATE KEY-----"):
			inKey = true
		case strings.HasPrefix(t, "-----END ") && inKey:
			inKey = false
		case inKey:
			lines[i] = "[private key redacted]\n"
		}
	}
	return strings.Join(lines, "")
}
