package template

import (
	"bytes"
	"crypto/sha256"
	"math/rand"
	"os"
	"testing"
)

// render writes b into a textWriter in writes of the given sizes.
func render(b []byte, sizes []int) Text { return writeText(nil, b, sizes) }

// writeText is render with create making the spill file.
func writeText(create func() (*os.File, error), b []byte, sizes []int) Text {
	w := textWriter{create: create}
	for i := 0; len(b) > 0; i++ {
		n := min(sizes[i%len(sizes)], len(b))
		_, _ = w.Write(b[:n])
		b = b[n:]
	}
	t, err := w.text()
	if err != nil {
		panic(err)
	}
	return t
}

// TestTextHoldsWhatWasWritten: whatever the writes and however the pieces
// fall, the text's bytes, length, written form and hash are what was
// written, and Equal tells it from every one-byte change and from a
// shorter or longer slice.
func TestTextHoldsWhatWasWritten(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	for _, n := range []int{0, 1, 511, 512, 513, 5000, maxPiece - 1, maxPiece, maxPiece + 1, 3*maxPiece + 17, spillAt, spillAt + 1, 3*spillAt + 5} {
		want := make([]byte, n)
		rnd.Read(want)
		for _, sizes := range [][]int{{1}, {7, 300}, {maxPiece}, {n + 1}} {
			if n > spillAt && sizes[0] == 1 {
				continue // a million one-byte writes prove nothing more
			}
			txt := render(want, sizes)
			if spilled := txt.file != nil; spilled != (n > spillAt) {
				t.Fatalf("n=%d sizes=%v: spilled %v", n, sizes, spilled)
			}
			if txt.Len() != n || !bytes.Equal(txt.Bytes(), want) {
				t.Fatalf("n=%d sizes=%v: %d bytes back, want %d", n, sizes, len(txt.Bytes()), n)
			}
			var out bytes.Buffer
			if k, err := txt.WriteTo(&out); err != nil || k != int64(n) || !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("n=%d sizes=%v: WriteTo wrote %d, %v", n, sizes, k, err)
			}
			h := sha256.Sum256(want)
			sum := sha256.New()
			_, _ = txt.WriteTo(sum)
			if !bytes.Equal(sum.Sum(nil), h[:]) {
				t.Fatalf("n=%d sizes=%v: hash differs", n, sizes)
			}
			if !txt.Equal(want) || !txt.Equal(bytes.Clone(want)) {
				t.Fatalf("n=%d sizes=%v: not equal to what was written", n, sizes)
			}
			if txt.Equal(append(bytes.Clone(want), 'x')) || (n > 0 && txt.Equal(want[:n-1])) {
				t.Fatalf("n=%d sizes=%v: equal to a longer or shorter slice", n, sizes)
			}
			for _, i := range []int{0, n / 2, n - 1, 511, 512, maxPiece - 1, maxPiece, spillAt - 1, spillAt, n - maxPiece} {
				if i < 0 || i >= n {
					continue
				}
				other := bytes.Clone(want)
				other[i] ^= 0x01
				if txt.Equal(other) {
					t.Fatalf("n=%d sizes=%v: equal with byte %d changed", n, sizes, i)
				}
			}
		}
	}
	if !TextOf(nil).Equal(nil) || TextOf(nil).Len() != 0 || TextOf([]byte("a")).Equal(nil) {
		t.Fatal("empty texts")
	}
}

// TestSmallTextKeepsNoSpareRoom: a short render does not keep the first
// piece's spare capacity (1000 small resources would each hold 512 bytes).
func TestSmallTextKeepsNoSpareRoom(t *testing.T) {
	txt := render([]byte("v1"), []int{2})
	if len(txt.pieces) != 1 || cap(txt.pieces[0]) > 16 {
		t.Fatalf("pieces %d, capacity %d; want one of capacity at most 16 (a size class)", len(txt.pieces), cap(txt.pieces[0]))
	}
}

// TestSpilledTextLeavesMemoryAndNoFile: beyond spillAt, a render keeps at
// most one buffer's worth in memory, its file has no name, and Release
// closes it.
func TestSpilledTextLeavesMemoryAndNoFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("TMPDIR", dir)
	txt := render(bytes.Repeat([]byte("0123456789abcdef"), spillAt/8), []int{100})
	if txt.file == nil || txt.pieces != nil {
		t.Fatalf("file %v, %d pieces in memory: want a file and none", txt.file, len(txt.pieces))
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the spill file has a name: %v", entries)
	}
	txt.Release()
	if _, err := txt.file.Stat(); err == nil {
		t.Error("Release left the spill file open")
	}
}

// TestSpillFallsBackToMemory: when no spill file can be made, or the first
// write to it fails (a full disk), the render stays in memory, whole.
func TestSpillFallsBackToMemory(t *testing.T) {
	want := bytes.Repeat([]byte("x"), 2*spillAt)
	for name, create := range map[string]func() (*os.File, error){
		"no file":   func() (*os.File, error) { return nil, os.ErrPermission },
		"disk full": func() (*os.File, error) { return os.OpenFile("/dev/full", os.O_RDWR, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			txt := writeText(create, want, []int{4096})
			if txt.file != nil || !txt.Equal(want) {
				t.Fatalf("file %v, equal %v: want the whole text in memory", txt.file, txt.Equal(want))
			}
		})
	}
}
