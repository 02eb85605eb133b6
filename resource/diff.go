package resource

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/pmezard/go-difflib/difflib"

	"github.com/keysync/confd/internal/redact"
)

// diffContext is the number of unchanged lines around a change, as diff -u.
const diffContext = 3

// describeChange is what -noop prints: owner and mode changes, then a
// unified diff. Private key material is masked: a dry run's output ends up
// in terminals, tickets and CI logs. A file that is not world-readable
// (before or after) holds secrets by its owner's word: unless showSecrets,
// only the numbers of changed lines are printed.
func describeChange(dest string, live liveFile, content []byte, mode os.FileMode, uid, gid int, showSecrets bool) []byte {
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
	private := mode.Perm()&0o004 == 0 || live.exists && live.mode.Perm()&0o004 == 0
	if private && !showSecrets {
		removed, added := changedLines(splitLines(live.content), splitLines(content))
		if removed+added > 0 {
			fmt.Fprintf(&b, "%s: %d line(s) removed, %d line(s) added; content not shown because the file is not world-readable (-noop-show-secrets shows it)\n", dest, removed, added)
		}
		return b.Bytes()
	}
	b.WriteString(unifiedDiff(dest, dest+" (rendered)",
		splitLines([]byte(redact.String(string(live.content)))),
		splitLines([]byte(redact.String(string(content))))))
	return b.Bytes()
}

// splitLines cuts text after each newline; the last line has none when the
// text does not end in one. (difflib.SplitLines adds a phantom empty line.)
func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	lines := strings.SplitAfter(string(b), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// matcher compares whole lines without difflib's "popular line" heuristic,
// which would treat the repeated lines of a PEM bundle as junk.
func matcher(a, b []string) *difflib.SequenceMatcher {
	return difflib.NewMatcherWithJunk(a, b, false, nil)
}

func changedLines(a, b []string) (removed, added int) {
	for _, op := range matcher(a, b).GetOpCodes() {
		if op.Tag != 'e' {
			removed += op.I2 - op.I1
			added += op.J2 - op.J1
		}
	}
	return removed, added
}

// unifiedDiff prints a and b as diff -u does, from the hunk headers on:
// ranges "start,count" ("start" alone for one line), and "\ No newline at
// end of file" after a last line without one.
func unifiedDiff(fromFile, toFile string, a, b []string) string {
	groups := matcher(a, b).GetGroupedOpCodes(diffContext)
	if len(groups) == 0 {
		return ""
	}
	var w strings.Builder
	fmt.Fprintf(&w, "--- %s\n+++ %s\n", fromFile, toFile)
	for _, g := range groups {
		first, last := g[0], g[len(g)-1]
		fmt.Fprintf(&w, "@@ -%s +%s @@\n", hunkRange(first.I1, last.I2), hunkRange(first.J1, last.J2))
		for _, op := range g {
			if op.Tag == 'e' {
				writeLines(&w, ' ', a[op.I1:op.I2])
				continue
			}
			if op.Tag == 'r' || op.Tag == 'd' {
				writeLines(&w, '-', a[op.I1:op.I2])
			}
			if op.Tag == 'r' || op.Tag == 'i' {
				writeLines(&w, '+', b[op.J1:op.J2])
			}
		}
	}
	return w.String()
}

// hunkRange is diff -u's range: 1-based start and count, the count left out
// when it is 1, and an empty range named by the line before it.
func hunkRange(start, stop int) string {
	switch n := stop - start; n {
	case 1:
		return fmt.Sprintf("%d", start+1)
	case 0:
		return fmt.Sprintf("%d,0", start)
	default:
		return fmt.Sprintf("%d,%d", start+1, n)
	}
}

func writeLines(w *strings.Builder, marker byte, lines []string) {
	for _, l := range lines {
		w.WriteByte(marker)
		w.WriteString(l)
		if !strings.HasSuffix(l, "\n") {
			w.WriteString("\n\\ No newline at end of file\n")
		}
	}
}
