package apply

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/keysync/confd/internal/redact"
)

// diffContext is the number of unchanged lines around a change, as diff -u.
const diffContext = 3

// Diff is what -noop prints for the plan: owner and mode changes, then a
// unified diff. Private key material is masked: a dry run's output ends up
// in terminals, tickets and CI logs. A file that is not world-readable
// (before or after) holds secrets by its owner's word: unless showSecrets,
// only the numbers of changed lines are printed.
func (p *Plan) Diff(dest string, showSecrets bool) []byte {
	live, content, mode, uid, gid := p.live, p.Content.Bytes(), p.Mode, p.UID, p.GID
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
		removed, added := 0, 0
		for _, c := range changes(splitLines(string(live.content)), splitLines(string(content))) {
			removed += c.i2 - c.i1
			added += c.j2 - c.j1
		}
		if removed+added > 0 {
			fmt.Fprintf(&b, "%s: %d line(s) removed, %d line(s) added; content not shown because the file is not world-readable (-noop-show-secrets shows it)\n", dest, removed, added)
		}
		return b.Bytes()
	}
	b.WriteString(unifiedDiff(dest, dest+" (rendered)",
		splitLines(redact.String(string(live.content))),
		splitLines(redact.String(string(content)))))
	return b.Bytes()
}

// splitLines cuts text after each newline; the last line has none when the
// text does not end in one.
func splitLines(s string) []string { return slices.Collect(strings.Lines(s)) }

// change is a run of changed lines: a[i1:i2] replaced by b[j1:j2], either
// side possibly empty.
type change struct{ i1, i2, j1, j2 int }

// changes turns diffLines' marks into runs.
func changes(a, b []string) []change {
	ca, cb := diffLines(a, b)
	var out []change
	for i, j := 0, 0; i < len(a) || j < len(b); {
		if i < len(a) && j < len(b) && !ca[i] && !cb[j] {
			i, j = i+1, j+1
			continue
		}
		c := change{i1: i, j1: j}
		for i < len(a) && ca[i] {
			i++
		}
		for j < len(b) && cb[j] {
			j++
		}
		c.i2, c.j2 = i, j
		out = append(out, c)
	}
	return out
}

// unifiedDiff prints a and b as diff -u does, from the hunk headers on:
// each change with up to diffContext equal lines around it, changes closer
// than 2*diffContext+1 lines in one hunk, ranges "start,count" ("start"
// alone for one line), and "\ No newline at end of file" after a last line
// without one.
func unifiedDiff(fromFile, toFile string, a, b []string) string {
	cs := changes(a, b)
	if len(cs) == 0 {
		return ""
	}
	var w strings.Builder
	fmt.Fprintf(&w, "--- %s\n+++ %s\n", fromFile, toFile)
	for len(cs) > 0 {
		n := 1
		for n < len(cs) && cs[n].i1-cs[n-1].i2 <= 2*diffContext {
			n++
		}
		// Equal lines are as many on both sides: context shifts both alike.
		first, last := cs[0], cs[n-1]
		before := min(first.i1, diffContext)
		after := min(len(a)-last.i2, diffContext)
		fmt.Fprintf(&w, "@@ -%s +%s @@\n", hunkRange(first.i1-before, last.i2+after), hunkRange(first.j1-before, last.j2+after))
		i := first.i1 - before
		for _, c := range cs[:n] {
			writeLines(&w, ' ', a[i:c.i1])
			writeLines(&w, '-', a[c.i1:c.i2])
			writeLines(&w, '+', b[c.j1:c.j2])
			i = c.i2
		}
		writeLines(&w, ' ', a[i:last.i2+after])
		cs = cs[n:]
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
