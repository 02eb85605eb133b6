package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keysync/confd/template"
)

// TestUnifiedDiffMatchesDiffU compares the -noop diff, from the first hunk
// header on, with what diff -u prints for the same two files.
func TestUnifiedDiffMatchesDiffU(t *testing.T) {
	diffPath, err := exec.LookPath("diff")
	if err != nil {
		t.Skip("no diff(1) on this machine")
	}
	many := func(n int, f func(i int) string) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			b.WriteString(f(i))
		}
		return b.String()
	}
	line := func(i int) string { return "line " + string(rune('a'+i%26)) + strings.Repeat("x", i%5) + "\n" }
	tests := []struct{ name, a, b string }{
		{"one line changed", "a\nb\nc\n", "a\nB\nc\n"},
		{"append", "a\nb\n", "a\nb\nc\n"},
		{"prepend", "b\nc\n", "a\nb\nc\n"},
		{"delete all", "a\nb\n", ""},
		{"create", "", "a\nb\n"},
		{"no newline at end, old", "a\nb", "a\nb\n"},
		{"no newline at end, new", "a\nb\n", "a\nb"},
		{"no newline at end, both changed", "a\nb", "a\nc"},
		{"no newline at end, context", "a\nb\nc\nd\ne\nf", "A\nb\nc\nd\ne\nf"},
		{"two hunks", many(20, line), strings.Replace(strings.Replace(many(20, line), "line b\n", "B\n", 1), "line s\n", "S\n", 1)},
		{"hunks merged at 6 apart", many(12, line), strings.Replace(strings.Replace(many(12, line), "line b\n", "B\n", 1), "line ixxxx\n", "I\n", 1)},
		{"single line file", "x\n", "y\n"},
		{"empty line at end", "a\n\n", "a\n"},
		{"pem bundle grows", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n-----BEGIN PUBLIC KEY-----\nBBBB\n-----END PUBLIC KEY-----\n"},
	}
	dir := t.TempDir()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, want := hunksBoth(t, diffPath, dir, tc.a, tc.b)
			if got != want {
				t.Errorf("diff:\n%s\ndiff -u:\n%s", got, want)
			}
		})
	}
}

func TestNoopShowsOnlyCountsForPrivateFiles(t *testing.T) {
	secret := "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\npassword=hunter2hunter2\n"
	for _, tc := range []struct {
		name       string
		liveMode   os.FileMode
		newMode    os.FileMode
		show       bool
		wantSecret bool
	}{
		{"0600", 0o600, 0o600, false, false},
		{"0640", 0o640, 0o640, false, false},
		{"0644 to 0600", 0o644, 0o600, false, false},
		{"0600 to 0644", 0o600, 0o644, false, false},
		{"0644", 0o644, 0o644, false, true},
		{"0600 shown", 0o600, 0o600, true, true},
	} {
		live := liveFile{exists: true, content: []byte("password=old\n"), mode: tc.liveMode}
		p := Plan{live: live, Content: template.TextOf([]byte(secret)), Mode: tc.newMode}
		out := string(p.Diff("/etc/x", tc.show))
		if got := strings.Contains(out, "hunter2"); got != tc.wantSecret {
			t.Errorf("%s: content shown = %v, want %v:\n%s", tc.name, got, tc.wantSecret, out)
		}
		if strings.Contains(out, "MIIEvQIBADAN") {
			t.Errorf("%s: private key shown:\n%s", tc.name, out)
		}
		if !tc.wantSecret && !strings.Contains(out, "/etc/x: 1 line(s) removed, 4 line(s) added; content not shown") {
			t.Errorf("%s: no line counts:\n%s", tc.name, out)
		}
	}
}

func TestNoopDiffOfPrivateDestThroughProcess(t *testing.T) {
	f := newFixture(t, "") // mode 0640
	if err := os.WriteFile(f.dest, []byte("name=zero\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	var diff bytes.Buffer
	f.s.Noop, f.s.DiffOut = true, &diff
	if _, err := f.load().Process(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(diff.String(), "name=") || !strings.Contains(diff.String(), "1 line(s) removed, 1 line(s) added") {
		t.Fatalf("noop output:\n%s", diff.String())
	}
}

// TestUnifiedDiffMatchesDiffURandom compares with diff -u over seeded
// random files of three kinds: PEM bundles gaining and losing keys (whose
// repeated BEGIN/END lines make many equally short diffs), short files of
// few distinct lines, and long files with scattered edits; files without a
// final newline included.
func TestUnifiedDiffMatchesDiffURandom(t *testing.T) {
	diffPath, err := exec.LookPath("diff")
	if err != nil {
		t.Skip("no diff(1) on this machine")
	}
	r := rand.New(rand.NewSource(1))
	pem := func(ids []int) string {
		var b strings.Builder
		b.WriteString("# bundle\n")
		for _, i := range ids {
			fmt.Fprintf(&b, "-----BEGIN PUBLIC KEY-----\nMIIB%04dAAAA\nBBBB%04dCCCC\n-----END PUBLIC KEY-----\n", i, i)
		}
		return b.String()
	}
	short := func(alpha, size int) string {
		var b strings.Builder
		for k := r.Intn(size + 1); k > 0; k-- {
			fmt.Fprintf(&b, "%c\n", 'a'+r.Intn(alpha))
		}
		s := b.String()
		if r.Intn(5) == 0 && s != "" {
			s = s[:len(s)-1]
		}
		return s
	}
	type pair struct{ a, b string }
	var cases []pair
	for n := 0; n < 60; n++ {
		var ia, ib []int
		for i := 0; i < 8; i++ {
			if r.Intn(3) > 0 {
				ia = append(ia, i)
			}
			if r.Intn(3) > 0 {
				ib = append(ib, i)
			}
		}
		cases = append(cases, pair{pem(ia), pem(ib)})
	}
	for n := 0; n < 120; n++ {
		alpha, size := 2+r.Intn(6), r.Intn(40)
		cases = append(cases, pair{short(alpha, size), short(alpha, size)})
	}
	for n := 0; n < 10; n++ {
		alpha := 3 + r.Intn(60)
		var lines []string
		for i := 500 + r.Intn(2000); i > 0; i-- {
			lines = append(lines, fmt.Sprintf("l%d\n", r.Intn(alpha)))
		}
		a := strings.Join(lines, "")
		for e := r.Intn(30); e > 0; e-- {
			p := r.Intn(len(lines))
			switch r.Intn(3) {
			case 0:
				lines = append(lines[:p], lines[p+1:]...)
			case 1:
				lines = append(lines[:p], append([]string{fmt.Sprintf("l%d\n", r.Intn(alpha+5))}, lines[p:]...)...)
			default:
				lines[p] = fmt.Sprintf("l%d\n", r.Intn(alpha+5))
			}
		}
		cases = append(cases, pair{a, strings.Join(lines, "")})
	}
	dir := t.TempDir()
	for n, c := range cases {
		got, want := hunksBoth(t, diffPath, dir, c.a, c.b)
		if got != want {
			t.Fatalf("case %d: a=%q b=%q\ndiff:\n%s\ndiff -u:\n%s", n, c.a, c.b, got, want)
		}
	}
}

// TestUnifiedDiffOfHugeRewriteEnds: two long files of the same few lines
// in different orders need a huge edit search; the diff must still end,
// and be a correct (if not minimal) diff.
func TestUnifiedDiffOfHugeRewriteEnds(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	gen := func() []string {
		out := make([]string, 60000)
		for i := range out {
			out[i] = fmt.Sprintf("%d\n", r.Intn(4))
		}
		return out
	}
	a, b := gen(), gen()
	ca, cb := diffLines(a, b)
	// The unchanged lines of both sides must be the same sequence.
	var ka, kb []string
	for i, c := range ca {
		if !c {
			ka = append(ka, a[i])
		}
	}
	for i, c := range cb {
		if !c {
			kb = append(kb, b[i])
		}
	}
	if strings.Join(ka, "") != strings.Join(kb, "") {
		t.Fatal("unchanged lines differ between the two sides")
	}
}

// hunksBoth diffs a and b with unifiedDiff and with `diff -u` (files in
// dir, diff(1) at diffPath), and returns both from the first hunk header on: the file headers
// differ by design (names, times).
func hunksBoth(t *testing.T, diffPath, dir, a, b string) (got, want string) {
	t.Helper()
	fa, fb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(fa, []byte(a), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fb, []byte(b), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(context.Background(), diffPath, "-u", fa, fb).Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		t.Fatal(err)
	}
	fromHunks := func(s string) string {
		if i := strings.Index(s, "@@"); i >= 0 {
			return s[i:]
		}
		return s
	}
	return fromHunks(unifiedDiff("a", "b", splitLines(a), splitLines(b))), fromHunks(string(out))
}
