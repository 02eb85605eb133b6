package resource

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
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
			fa, fb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
			if err := os.WriteFile(fa, []byte(tc.a), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(fb, []byte(tc.b), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(context.Background(), diffPath, "-u", fa, fb).Output()
			var ee *exec.ExitError
			if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
				t.Fatal(err)
			}
			want := string(out)
			if i := strings.Index(want, "@@"); i >= 0 {
				want = want[i:]
			}
			got := unifiedDiff("a", "b", splitLines([]byte(tc.a)), splitLines([]byte(tc.b)))
			if i := strings.Index(got, "@@"); i >= 0 {
				got = got[i:]
			}
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
		out := string(describeChange("/etc/x", live, []byte(secret), tc.newMode, 0, 0, tc.show))
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
