package redact

import "strings"

// minRunLine is the shortest base64 run that starts or continues a block of
// lines (wrapped base64 output); a block's last line may be shorter.
const minRunLine = 16

// Held output is bounded: past these, a block is judged on what was held
// (and, if it is a key, the rest of the block is masked as it arrives).
const (
	maxHeldLines = 1024
	maxHeldBytes = 256 << 10
)

// Lines masks private keys in a stream of lines (each without its
// newline), for output that is logged as it arrives. The zero value is
// ready to use.
//
// Lines of base64 text (wrapped `base64 FILE` output) are held back until
// their block ends, because a key is recognised only by decoding the block
// as a whole: its first line alone may be a comment's bytes, and a PEM
// armour or DER header may straddle two lines. Then every line of the block
// is masked if it decodes to a key, and passed on unchanged if not (a public
// bundle stays readable). Other lines are passed on at once.
type Lines struct {
	inKey bool
	// prefix is the diff marker or indentation in front of the BEGIN
	// armour, kept on masked body lines so a diff stays readable.
	prefix string

	held      []string
	heldBytes int
	first     int // run length of the first held line
	// inEncKey: the held part of the current block was a key, and the
	// block goes on past what could be held.
	inEncKey bool
	// whole: the whole text is at hand (String), so any line ending in a
	// long enough run opens a block, and nothing bounds what is held.
	whole bool
}

// Push takes the next line and hands emit every line that is ready, masked,
// in order.
func (f *Lines) Push(l string, emit func(string)) { f.pushEncoded(f.armour(l), emit) }

// pushEncoded is Push after the armour: base64 runs and blocks.
func (f *Lines) pushEncoded(l string, emit func(string)) {
	start, end, ok := tailRun(l)
	n := end - start
	if ok && f.inEncKey {
		emit(l[:start] + Mask + l[end:])
		f.inEncKey = n >= minRunLine
		return
	}
	if ok && len(f.held) > 0 {
		switch joins(f.first, n, l[start:end]) {
		case joinMiddle:
			f.hold(l, n, emit)
			return
		case joinLast:
			f.held = append(f.held, l)
			f.Flush(emit)
			return
		}
	}
	f.Flush(emit)
	if ok && n >= minRunLine && (f.whole || holdable(l[:start], l[start:end])) {
		f.hold(l, n, emit)
		return
	}
	emit(maskRuns(l))
}

// holdable tells whether a line may open a block that is held back: only
// a bare run (wrapped base64 output has no prefix) that looks encoded. An
// ordinary line that ends in a long word ("lock=kube-apiserver-restart")
// must reach the log at once, not when the next line comes.
func holdable(prefix, run string) bool {
	return strings.TrimSpace(prefix) == "" && (len(run) >= 40 || strings.ContainsAny(run, "0123456789+/"))
}

func (f *Lines) hold(l string, n int, emit func(string)) {
	if len(f.held) == 0 {
		f.first = n
	}
	f.held = append(f.held, l)
	f.heldBytes += len(l)
	if !f.whole && (len(f.held) >= maxHeldLines || f.heldBytes >= maxHeldBytes) {
		f.inEncKey = f.release(emit)
	}
}

// How a line with a base64 run of n characters relates to a block whose
// first run has first: wrapped base64 has lines of one length (give or
// take a glued diff marker), and a shorter last one.
const (
	joinNone = iota
	joinMiddle
	joinLast
)

func joins(first, n int, run string) int {
	switch {
	case n >= first-1 && n <= first+1:
		return joinMiddle
	case n < first-1 && (strings.HasSuffix(run, "=") || (n-first%4)%4 != 1):
		// No base64 text is 1 mod 4 characters long (a glued diff
		// marker is the first line's remainder): a short word after a
		// block ("after") is not part of it. One that could be is masked
		// with it only if the block is a key.
		return joinLast
	}
	return joinNone
}

// Flush hands emit the lines held back; call it when the stream ends.
func (f *Lines) Flush(emit func(string)) {
	f.release(emit)
	f.inEncKey = false
}

// release judges and emits the held lines; it reports whether they were a key.
func (f *Lines) release(emit func(string)) bool {
	key := maskBlock(f.held)
	for _, l := range f.held {
		emit(l)
	}
	f.held, f.heldBytes = f.held[:0], 0
	return key
}

// maskEncodedLines masks, in place, base64 runs that decode to a key:
// single long runs anywhere in a line, and blocks of lines that end in
// base64 runs, judged as a whole. The lines are without their newlines.
func maskEncodedLines(lines []string) {
	f := Lines{whole: true}
	out := lines[:0] // emit never runs ahead of the line pushed
	emit := func(l string) { out = append(out, l) }
	for _, l := range lines {
		f.pushEncoded(l, emit)
	}
	f.Flush(emit)
}

// maskBlock masks, in place, a block of lines that each end in a base64
// run: all of the runs if they decode to a key together, else each long
// run that does on its own. It reports whether the block was a key.
func maskBlock(block []string) bool {
	if len(block) > 1 && blockIsKey(block) {
		for k, l := range block {
			s, e, _ := tailRun(l)
			block[k] = l[:s] + Mask + l[e:]
		}
		return true
	}
	for k, l := range block {
		block[k] = maskRuns(l)
	}
	return false
}

// blockIsKey decodes a block's runs as one text; when every run starts
// with the same "+" or "-" (a diff's marker glued to the text), also
// without it.
func blockIsKey(block []string) bool {
	var all, trimmed strings.Builder
	marker := byte(0)
	same := true
	for k, l := range block {
		s, e, _ := tailRun(l)
		run := l[s:e]
		if k < len(block)-1 {
			run = strings.TrimRight(run, "=")
		}
		all.WriteString(run)
		if k == 0 {
			marker = run[0]
		}
		if run[0] != marker || (marker != '+' && marker != '-') {
			same = false
		} else {
			trimmed.WriteString(run[1:])
		}
	}
	return EncodedKey(all.String()) || same && EncodedKey(trimmed.String())
}

// maskRuns replaces every base64 run of at least minRun characters in l
// that decodes to a key.
func maskRuns(l string) string {
	if len(l) < minRun || !hasRun(l, minRun) {
		return l
	}
	rs := runs(l, minRun)
	var b strings.Builder
	last := 0
	for _, r := range rs {
		if !EncodedKey(l[r[0]:r[1]]) {
			continue
		}
		b.WriteString(l[last:r[0]])
		b.WriteString(Mask)
		last = r[1]
	}
	if last == 0 {
		return l
	}
	b.WriteString(l[last:])
	return b.String()
}

// tailRun finds the base64 run that ends l (before trailing blanks and
// quotes) and starts at the line's start or after a blank or punctuation:
// the shape of a line of wrapped base64, bare or behind a diff marker,
// indentation or a log prefix. It needs at least 2 characters.
func tailRun(l string) (start, end int, ok bool) {
	end = len(strings.TrimRight(l, " \t\r\"',;"))
	start = end
	for start > 0 && (isB64(l[start-1]) || l[start-1] == '=' && end-start < 2) {
		start--
	}
	if end-start < 2 || strings.Contains(l[start:end], Mask) {
		return 0, 0, false
	}
	// "=" only at the end.
	if i := strings.IndexByte(l[start:end], '='); i >= 0 && strings.TrimRight(l[start+i:end], "=") != "" {
		return 0, 0, false
	}
	return start, end, true
}
