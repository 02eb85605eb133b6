package template

import (
	"bytes"
	"io"
)

// Text is a render's output in the pieces it was written in. It is never
// copied into one block on the way to the file: at 100k keys that copy
// alone was 8 MB, held beside the pieces, at the render's peak.
// The zero Text is empty. A Text is read-only once rendered.
type Text struct {
	pieces [][]byte
	n      int
}

// TextOf is b as a Text of one piece; b must not change afterwards.
func TextOf(b []byte) Text {
	if len(b) == 0 {
		return Text{}
	}
	return Text{pieces: [][]byte{b}, n: len(b)}
}

// Len is the length in bytes.
func (t Text) Len() int { return t.n }

// Bytes is the text in one slice: the piece itself when there is one, else
// a copy. For diffs and previews, not for the write path.
func (t Text) Bytes() []byte {
	switch len(t.pieces) {
	case 0:
		return []byte{}
	case 1:
		return t.pieces[0]
	}
	out := make([]byte, 0, t.n)
	for _, p := range t.pieces {
		out = append(out, p...)
	}
	return out
}

// Equal reports whether the text is b.
func (t Text) Equal(b []byte) bool {
	if len(b) != t.n {
		return false
	}
	for _, p := range t.pieces {
		if !bytes.Equal(p, b[:len(p)]) {
			return false
		}
		b = b[len(p):]
	}
	return true
}

// WriteTo writes the pieces to w in order.
func (t Text) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for _, p := range t.pieces {
		k, err := w.Write(p)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// maxPiece is the largest piece a render's output grows by.
const maxPiece = 64 << 10

// textWriter collects a render's output: pieces that double from 512 bytes
// up to maxPiece, each filled before the next is made, so that a large
// output never asks for one ever larger block (a doubling buffer needs
// about twice the output in fresh contiguous memory).
type textWriter struct {
	t   Text
	cur []byte
}

func (w *textWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if len(w.cur) == cap(w.cur) {
			if w.cur != nil {
				w.t.pieces = append(w.t.pieces, w.cur)
			}
			w.cur = make([]byte, 0, min(max(2*cap(w.cur), 512), maxPiece))
		}
		k := copy(w.cur[len(w.cur):cap(w.cur)], p)
		w.cur = w.cur[:len(w.cur)+k]
		p = p[k:]
	}
	w.t.n += n
	return n, nil
}

// text is what was written; the writer must not be used afterwards.
func (w *textWriter) text() Text {
	if len(w.cur) > 0 {
		w.t.pieces = append(w.t.pieces, w.cur)
	}
	if len(w.t.pieces) == 1 && cap(w.cur) > 2*len(w.cur) {
		// A small output alone in a roomy piece: keep only its bytes.
		w.t.pieces[0] = bytes.Clone(w.cur)
	}
	return w.t
}
