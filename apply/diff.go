package apply

import (
	"bytes"
	"fmt"
	"os"
	"strings"

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
// text does not end in one (go-difflib's SplitLines added a phantom empty
// line).
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

// op is a run of equal lines ('e') or a change ('c': lines I1..I2 of a
// replaced by J1..J2 of b, either side possibly empty).
type op struct {
	tag            byte
	i1, i2, j1, j2 int
}

// opcodes turns diffLines' marks into runs.
func opcodes(a, b []string) []op {
	ca, cb := diffLines(a, b)
	var ops []op
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		if i < len(a) && j < len(b) && !ca[i] && !cb[j] {
			o := op{tag: 'e', i1: i, j1: j}
			for i < len(a) && j < len(b) && !ca[i] && !cb[j] {
				i++
				j++
			}
			o.i2, o.j2 = i, j
			ops = append(ops, o)
			continue
		}
		o := op{tag: 'c', i1: i, j1: j}
		for i < len(a) && ca[i] {
			i++
		}
		for j < len(b) && cb[j] {
			j++
		}
		o.i2, o.j2 = i, j
		ops = append(ops, o)
	}
	return ops
}

func changedLines(a, b []string) (removed, added int) {
	for _, o := range opcodes(a, b) {
		if o.tag != 'e' {
			removed += o.i2 - o.i1
			added += o.j2 - o.j1
		}
	}
	return removed, added
}

// hunks groups the runs as diff -u does: each change with up to context
// equal lines around it, and changes closer than 2*context+1 lines in one
// hunk.
func hunks(ops []op, context int) [][]op {
	var out [][]op
	var cur []op
	for k, o := range ops {
		if o.tag != 'e' {
			cur = append(cur, o)
			continue
		}
		n := o.i2 - o.i1
		switch {
		case k == 0: // leading context
			if n > context {
				o.i1, o.j1 = o.i2-context, o.j2-context
			}
			cur = append(cur, o)
		case k == len(ops)-1: // trailing context
			if n > context {
				o.i2, o.j2 = o.i1+context, o.j1+context
			}
			cur = append(cur, o)
		case n > 2*context:
			cur = append(cur, op{'e', o.i1, o.i1 + context, o.j1, o.j1 + context})
			out = append(out, cur)
			cur = []op{{'e', o.i2 - context, o.i2, o.j2 - context, o.j2}}
		default:
			cur = append(cur, o)
		}
	}
	if len(cur) > 0 && !(len(cur) == 1 && cur[0].tag == 'e') {
		out = append(out, cur)
	}
	return out
}

// unifiedDiff prints a and b as diff -u does, from the hunk headers on:
// ranges "start,count" ("start" alone for one line), and "\ No newline at
// end of file" after a last line without one.
func unifiedDiff(fromFile, toFile string, a, b []string) string {
	groups := hunks(opcodes(a, b), diffContext)
	if len(groups) == 0 {
		return ""
	}
	var w strings.Builder
	fmt.Fprintf(&w, "--- %s\n+++ %s\n", fromFile, toFile)
	for _, g := range groups {
		first, last := g[0], g[len(g)-1]
		fmt.Fprintf(&w, "@@ -%s +%s @@\n", hunkRange(first.i1, last.i2), hunkRange(first.j1, last.j2))
		for _, o := range g {
			if o.tag == 'e' {
				writeLines(&w, ' ', a[o.i1:o.i2])
				continue
			}
			writeLines(&w, '-', a[o.i1:o.i2])
			writeLines(&w, '+', b[o.j1:o.j2])
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
