package template

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
)

// Text is a render's output in the pieces it was written in, or, beyond
// spillAt bytes, in an unlinked temporary file. It is never copied into one
// block on the way to the destination: at 100k keys that copy alone was
// 8 MB, held beside the pieces, at the render's peak; and a large output
// held in the page cache rather than the heap leaves confd's memory bounded
// by the keys, not by what a template makes of them.
// The zero Text is empty. A Text is read-only once rendered; Release frees
// a spilled one's file (the garbage collector closes it otherwise).
type Text struct {
	pieces [][]byte
	n      int
	file   *os.File // the whole text when it spilled; pieces is nil then
}

// spillAt is the output size beyond which a render continues in a file.
// Configuration files rarely come near it; the ones that do are rendered
// from many keys, whose memory is needed anyway.
const spillAt = 1 << 20

// createSpill makes the spill file.
func createSpill() (*os.File, error) {
	f, err := os.CreateTemp("", "confd-render-")
	if err != nil {
		return nil, err
	}
	// Unlinked at once: nothing is left behind whatever happens to us, and
	// no one else can open it (it may hold secrets).
	if err := os.Remove(f.Name()); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
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

// Release frees the file of a spilled text; the text must not be used
// afterwards. It does nothing for a text in memory.
func (t Text) Release() {
	if t.file != nil {
		_ = t.file.Close()
	}
}

// Bytes is a copy of the text in one slice. For diffs and previews, not for
// the write path; a spilled text that cannot be read back comes back short
// (and says so at its end).
func (t Text) Bytes() []byte {
	if t.file != nil {
		b := make([]byte, t.n)
		k, err := t.file.ReadAt(b, 0)
		if err != nil && k < t.n {
			return append(b[:k], fmt.Sprintf("\n[confd: rendered output unreadable after %d of %d bytes: %v]\n", k, t.n, err)...)
		}
		return b
	}
	return bytes.Join(t.pieces, nil)
}

// Equal reports whether the text is b. A spilled text that cannot be read
// back is equal to nothing: the file is then rewritten, never kept wrongly.
func (t Text) Equal(b []byte) bool {
	if len(b) != t.n {
		return false
	}
	if t.file != nil {
		buf := make([]byte, min(t.n, maxPiece))
		for off := 0; off < t.n; off += len(buf) {
			part := buf[:min(len(buf), t.n-off)]
			if _, err := t.file.ReadAt(part, int64(off)); err != nil || !bytes.Equal(part, b[off:off+len(part)]) {
				return false
			}
		}
		return true
	}
	for _, p := range t.pieces {
		if !bytes.Equal(p, b[:len(p)]) {
			return false
		}
		b = b[len(p):]
	}
	return true
}

// WriteTo writes the text to w.
func (t Text) WriteTo(w io.Writer) (int64, error) {
	if t.file != nil {
		n, err := io.Copy(w, io.NewSectionReader(t.file, 0, int64(t.n)))
		if err == nil && n != int64(t.n) {
			err = fmt.Errorf("rendered output: read %d of %d bytes back", n, t.n)
		}
		return n, err
	}
	bufs := net.Buffers(slices.Clone(t.pieces)) // WriteTo consumes its copy
	return bufs.WriteTo(w)
}

// maxPiece is the largest piece a render's output grows by.
const maxPiece = 64 << 10

// textWriter collects a render's output: pieces that double from 512 bytes
// up to maxPiece, each filled before the next is made, so that a large
// output never asks for one ever larger block (a doubling buffer needs
// about twice the output in fresh contiguous memory); beyond spillAt, a
// spill file.
type textWriter struct {
	t       Text
	cur     []byte
	spill   *bufio.Writer            // to t.file, once spilled
	noSpill bool                     // a spill file could not be made: memory it is
	create  func() (*os.File, error) // makes the spill file; nil: createSpill (tests set it)
	err     error                    // writing the spill file failed
}

func (w *textWriter) Write(p []byte) (int, error) {
	n := len(p)
	w.t.n += n
	if w.spill != nil {
		if _, err := w.spill.Write(p); err != nil && w.err == nil {
			w.err = err
		}
		return n, nil // the error ends the render in text(), not mid-template
	}
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
	if w.t.n > spillAt && !w.noSpill {
		w.toFile()
	}
	return n, nil
}

// toFile moves what was written so far to a spill file, where the rest
// goes. When no file can be made or written, the output stays in memory.
func (w *textWriter) toFile() {
	create := w.create
	if create == nil {
		create = createSpill
	}
	f, err := create()
	if err != nil {
		w.noSpill = true
		return
	}
	bw := bufio.NewWriterSize(f, maxPiece)
	for _, p := range append(w.t.pieces, w.cur) {
		if _, err = bw.Write(p); err != nil {
			break
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		_ = f.Close()
		w.noSpill = true
		return
	}
	w.t.pieces, w.cur, w.t.file, w.spill = nil, nil, f, bw
}

// text is what was written; the writer must not be used afterwards.
func (w *textWriter) text() (Text, error) {
	if w.spill != nil {
		if w.err == nil {
			w.err = w.spill.Flush()
		}
		if w.err != nil {
			_ = w.t.file.Close()
			return Text{}, fmt.Errorf("render output beyond %d bytes goes to a temporary file in %s: %w", spillAt, os.TempDir(), w.err)
		}
		return w.t, nil
	}
	if len(w.cur) > 0 {
		w.t.pieces = append(w.t.pieces, w.cur)
	}
	if len(w.t.pieces) == 1 && cap(w.cur) > 2*len(w.cur) {
		// A small output alone in a roomy piece: keep only its bytes.
		w.t.pieces[0] = bytes.Clone(w.cur)
	}
	return w.t, nil
}
