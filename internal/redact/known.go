package redact

import (
	"encoding/base64"
	"math/bits"
	"slices"
	"sort"
)

// Known secrets. The heuristics of this package recognise a key by what its
// bytes look like, which needs a part of the key that only a private key
// has: its armour or the start of its DER. A slice of the middle of an
// encoded key has neither (`base64 key.pem | sed -n 3,6p`, or base64
// wrapped at 10 columns, whose lines are each too short to judge), and looks
// like the middle of any certificate. What confd renders it knows, though:
// Secrets holds the secret values of the files a command is about, and
// Known masks their base64 encodings in the command's output by matching.
//
// A value's bytes can sit at any offset in what was encoded, so each value
// is encoded three times, starting 0, 1 and 2 bytes into a 3-byte group;
// only the characters that depend on the value alone are kept (the first
// and the last one or two also carry bits of the neighbours). The URL-safe
// alphabet is folded onto the standard one ('-' is '+', '_' is '/'), and
// the output is read as its base64 characters only: line breaks (LF or
// CRLF), blanks, '=' padding and any other character are skipped, so an
// encoding wrapped at any width, indented or behind a log prefix is one
// run again.
//
// Every run of at least MinEncoded characters of an encoding is masked,
// wherever it starts: a window from the middle of a key (`base64 key.pem |
// head -3`, `tail -c +500`) is as secret as the whole. 16 characters are
// 96 bits, so ordinary output never matches by chance; the pieces of a key
// shorter than that which remain visible are the edges of a masked run
// (one character that mixes the key with its neighbour) and pieces that a
// command cut out on purpose (`cut -c1-10`), which no masking can follow.

// MinEncoded is the shortest run of a secret's encoding that is masked.
const MinEncoded = 16

// How long a run at the end of a line must be, as a prefix of an
// encoding, before Known holds the line back to see whether the next lines
// continue it. A bare line (wrapped base64) in a run of MinEncoded
// characters or more over bare lines is held on any prefix: that is where
// a key's private part begins after its public ones. A shorter bare run is
// held from minHoldBare characters, so an ordinary "OK" or "done" is not
// delayed; this lets at most minHoldBare-1 characters of a private part
// pass when it starts among the first MinEncoded characters of output
// wrapped narrower than that. An ordinary line (words, a prefix) is held
// only when its whole last word, of minHoldWord characters or more, starts
// an encoding.
const (
	minHoldBare = 3
	minHoldWord = 6
)

// b64Val is the 6-bit value of a base64 character in either alphabet, or -1.
var b64Val = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") {
		t[c] = int8(i)
	}
	t['-'], t['_'] = 62, 63
	return t
}()

// window is MinEncoded characters packed 6 bits each, the first 8 in hi
// and the last 8 in lo, so that the order of windows is that of the text.
type window struct{ hi, lo uint64 }

const half = 1<<48 - 1

func (w window) less(o window) bool { return w.hi < o.hi || w.hi == o.hi && w.lo < o.lo }

// push shifts the character value v in at the end.
func (w window) push(v uint64) window {
	return window{(w.hi<<6 | w.lo>>42) & half, (w.lo<<6 | v) & half}
}

func (w window) hash() uint64 {
	h := w.hi*0x9e3779b97f4a7c15 ^ w.lo*0xc2b2ae3d27d4eb4f
	return h ^ h>>31
}

// Secrets is a set of secret values, compiled for Known. A nil *Secrets
// holds none. It is read-only once built and may be shared.
type Secrets struct {
	windows []window // sorted, without duplicates
	bloom   []uint64 // two bits per window in one word, by its hash
	shift   uint     // 64 - log2(len(bloom))
}

// NewSecrets compiles the base64 encodings of values at the three offsets.
// Values too short to have MinEncoded stable characters (under 13 bytes)
// are ignored; it returns nil when nothing is left.
func NewSecrets(values ...[]byte) *Secrets {
	var ws []window
	for _, v := range values {
		if len(v) < 13 {
			continue
		}
		buf := make([]byte, len(v)+2)
		enc := make([]byte, base64.RawStdEncoding.EncodedLen(len(buf)))
		for k := 0; k < 3; k++ {
			clear(buf)
			copy(buf[k:], v)
			base64.RawStdEncoding.Encode(enc, buf[:k+len(v)])
			// Character j holds bits [6j, 6j+6): stable when they all
			// lie in the value's bits [8k, 8(k+len)).
			lo, hi := (8*k+5)/6, 8*(k+len(v))/6
			var w window
			for j := lo; j < hi; j++ {
				w = w.push(uint64(b64Val[enc[j]]))
				if j-lo >= MinEncoded-1 {
					ws = append(ws, w)
				}
			}
		}
	}
	if len(ws) == 0 {
		return nil
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].less(ws[j]) })
	out := slices.Compact(ws)
	words := 16
	for words*4 < len(out) {
		words <<= 1
	}
	s := &Secrets{windows: out, bloom: make([]uint64, words), shift: uint(64 - bits.TrailingZeros(uint(words)))}
	for _, w := range out {
		h := w.hash()
		s.bloom[h>>s.shift] |= 1<<(h&63) | 1<<(h>>6&63)
	}
	return s
}

// has reports whether w is a window of some encoding.
func (s *Secrets) has(w window) bool {
	h := w.hash()
	if b := uint64(1)<<(h&63) | 1<<(h>>6&63); s.bloom[h>>s.shift]&b != b {
		return false
	}
	return s.hasPrefix(w, MinEncoded)
}

// hasPrefix reports whether the last j (<= MinEncoded) characters of w
// start some window: whether some window lies between them followed by
// the lowest characters and them followed by the highest.
func (s *Secrets) hasPrefix(w window, j int) bool {
	var lo, hi window
	for i := 0; i < MinEncoded; i++ {
		if i < j {
			v := w.char(MinEncoded - j + i)
			lo, hi = lo.push(v), hi.push(v)
		} else {
			lo, hi = lo.push(0), hi.push(63)
		}
	}
	i := sort.Search(len(s.windows), func(i int) bool { return !s.windows[i].less(lo) })
	return i < len(s.windows) && !hi.less(s.windows[i])
}

// char is the i-th of the window's characters.
func (w window) char(i int) uint64 {
	if i < 8 {
		return w.hi >> (6 * (7 - i)) & 63
	}
	return w.lo >> (6 * (15 - i)) & 63
}

// Known masks, in a stream of lines, every run of at least MinEncoded
// characters of the base64 encoding of a secret in Secrets, with Mask in
// place of each line's part of the run; lines keep their number and order.
// A run may cross any number of lines: a line whose end could start or
// continue one is held back until the lines after it decide (at most the
// lines that hold the last MinEncoded-1 base64 characters). Create it with
// NewKnown.
type Known struct {
	s    *Secrets
	w    window // the last MinEncoded characters
	n    int64  // base64 characters seen
	done int64  // characters before this are marked when in a match
	// from records, for the last MinEncoded characters, which line and
	// byte they came from.
	from      [MinEncoded]origin
	held      []heldLine
	base      int64 // sequence number of held[0]
	joinStart int64 // where a run that the next line continues may start
}

type origin struct {
	line int64
	at   int
}

type heldLine struct {
	text  string
	spans [][2]int // byte ranges to mask
	last  int64    // the character last marked in this line, or -1
}

// NewKnown returns a Known for s; with a nil s it passes lines on as they
// are.
func NewKnown(s *Secrets) *Known { return &Known{s: s} }

// Push takes the next line (without its newline) and hands emit every line
// that is ready, masked, in order.
func (k *Known) Push(l string, emit func(string)) {
	if k.s == nil {
		emit(l)
		return
	}
	seq := k.base + int64(len(k.held))
	k.held = append(k.held, heldLine{text: l, last: -1})
	bare, tail := shape(l)
	start := k.n
	tailStart := int64(-1)
	for i := 0; i < len(l); i++ {
		v := b64Val[l[i]]
		if v < 0 {
			continue
		}
		if i >= tail && tailStart < 0 {
			tailStart = k.n
		}
		k.w = k.w.push(uint64(v))
		k.from[k.n%MinEncoded] = origin{seq, i}
		k.n++
		if k.n >= MinEncoded && k.s.has(k.w) {
			k.mark()
		}
	}
	if tailStart < 0 {
		tailStart = k.n
	}
	if !bare || k.n == start {
		k.joinStart = tailStart
	}
	// The longest run at the end that a window could still complete.
	region := k.n - k.joinStart
	j := min(int64(MinEncoded-1), region)
	hold := int64(0)
	switch {
	case bare:
		least := int64(minHoldBare)
		if region >= MinEncoded {
			least = 1
		}
		for ; j >= least; j-- {
			if k.s.hasPrefix(k.w, int(j)) {
				hold = j
				break
			}
		}
	case j >= minHoldWord && k.s.hasPrefix(k.w, int(j)):
		hold = j
	}
	keep := 0
	if hold > 0 {
		keep = int(min(k.base+int64(len(k.held))-k.from[(k.n-hold)%MinEncoded].line, int64(len(k.held))))
	}
	k.release(len(k.held)-keep, emit)
}

// shape tells whether l is bare (one run of base64 characters, with '='
// padding and blanks around it: a line of wrapped base64, indented or not)
// and where its last run of base64 characters starts.
func shape(l string) (bare bool, tail int) {
	end := len(l)
	for end > 0 && (l[end-1] == ' ' || l[end-1] == '\t' || l[end-1] == '\r' || l[end-1] == '=') {
		end--
	}
	tail = end
	for tail > 0 && b64Val[l[tail-1]] >= 0 {
		tail--
	}
	if end == tail {
		// No run at the end: nothing to continue.
		return false, len(l)
	}
	i := 0
	for i < tail && (l[i] == ' ' || l[i] == '\t') {
		i++
	}
	return i == tail, tail
}

// mark records that the last MinEncoded characters are a window.
func (k *Known) mark() {
	for p := max(k.n-MinEncoded, k.done); p < k.n; p++ {
		o := k.from[p%MinEncoded]
		if o.line < k.base {
			continue // passed on already
		}
		h := &k.held[o.line-k.base]
		if h.last == p-1 && len(h.spans) > 0 {
			h.spans[len(h.spans)-1][1] = o.at + 1
		} else {
			h.spans = append(h.spans, [2]int{o.at, o.at + 1})
		}
		h.last = p
	}
	k.done = k.n
}

// release emits the first n held lines.
func (k *Known) release(n int, emit func(string)) {
	for _, h := range k.held[:n] {
		emit(h.masked())
	}
	k.held = append(k.held[:0], k.held[n:]...)
	k.base += int64(n)
}

func (h heldLine) masked() string {
	if len(h.spans) == 0 {
		return h.text
	}
	b := make([]byte, 0, len(h.text)+len(h.spans)*len(Mask))
	last := 0
	for _, sp := range h.spans {
		b = append(b, h.text[last:sp[0]]...)
		b = append(b, Mask...)
		last = sp[1]
	}
	return string(append(b, h.text[last:]...))
}

// Flush hands emit the lines held back; call it when the stream ends.
func (k *Known) Flush(emit func(string)) { k.release(len(k.held), emit) }
