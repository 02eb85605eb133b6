package version_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/version"
)

// Built without the Makefile (go test here), the stamp has its defaults,
// never an empty line.
func TestDefaults(t *testing.T) {
	if version.Version != "dev" || version.Commit == "" || version.Date == "" {
		t.Errorf("Version %q, Commit %q, Date %q", version.Version, version.Commit, version.Date)
	}
	if got, want := version.Text("x"), "x dev\ncommit: "+version.Commit+"\ndate: "+version.Date+"\n"; got != want {
		t.Errorf("Text: %q, want %q", got, want)
	}
}

// The Makefile's version, commit and date (make -s print-version, through
// scripts/version.sh), in a repository of their own: the snapshot form
// with no tag (two of one day in commit order), the tag, a pre-release
// tag, commits past each, a dirty tree, and each sorted as dpkg sorts
// package versions.
func TestMakefileVersion(t *testing.T) {
	for _, tool := range []string{"git", "make", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s: %v", tool, err)
			}
			t.Skipf("%s: %v", tool, err)
		}
	}
	repo := t.TempDir()
	for _, f := range []string{"Makefile", "scripts/version.sh"} {
		data, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, f), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The environment of the test's git and make: no user's settings, no
	// SOURCE_DATE_EPOCH or VERSION of the caller's.
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + repo, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C"}
	run := func(env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = repo
		cmd.Env = append(append([]string{}, base...), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %q: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commitAt := func(epoch int64) string {
		t.Helper()
		d := "@" + strconv.FormatInt(epoch, 10) + " +0000"
		env := []string{"GIT_AUTHOR_DATE=" + d, "GIT_COMMITTER_DATE=" + d, "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t",
			"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t"}
		run(env, "git", "commit", "-q", "--allow-empty", "-m", "c")
		return run(nil, "git", "rev-parse", "HEAD")
	}
	printVersion := func(env ...string) []string {
		t.Helper()
		lines := strings.Split(run(env, "make", "-s", "print-version"), "\n")
		if len(lines) != 3 {
			t.Fatalf("print-version: %q", lines)
		}
		return lines
	}
	// less asserts dpkg --compare-versions a lt b.
	less := func(a, b string) {
		t.Helper()
		cmd := exec.Command("dpkg", "--compare-versions", a, "lt", b)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("dpkg says not %s < %s: %v %s", a, b, err, out)
		}
	}

	run(nil, "git", "init", "-q")
	run(nil, "git", "add", ".")
	const day1 = 1704164645 // 2024-01-02T03:04:05Z
	c1 := commitAt(day1)
	got := printVersion()
	if want := "0.0.0~git20240102030405." + c1[:12]; got[0] != want || got[1] != c1 || got[2] != "2024-01-02T03:04:05Z" {
		t.Errorf("no tag: %q, want %s, %s, 2024-01-02T03:04:05Z", got, want, c1)
	}
	snap1 := got[0]
	if got := printVersion("SOURCE_DATE_EPOCH=0"); got[2] != "1970-01-01T00:00:00Z" || got[0] != snap1 {
		t.Errorf("SOURCE_DATE_EPOCH=0: %q", got)
	}
	// A tag that is no version is not taken for one.
	run(nil, "git", "tag", "validated-candidate")
	if got := printVersion(); got[0] != snap1 {
		t.Errorf("with tag validated-candidate: %q, want %s", got[0], snap1)
	}

	// Uncommitted changes: after the clean build of the commit.
	f, err := os.OpenFile(filepath.Join(repo, "Makefile"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("# an edit\n"); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	dirty := printVersion()[0]
	if dirty != snap1+"+dirty" {
		t.Errorf("dirty: %q, want %s+dirty", dirty, snap1)
	}
	less(snap1, dirty)
	run(nil, "git", "checkout", "-q", "Makefile")

	// Later the same day: after, whatever the two hashes.
	c2 := commitAt(day1 + 3600)
	snap2 := printVersion()[0]
	if want := "0.0.0~git20240102040405." + c2[:12]; snap2 != want {
		t.Errorf("an hour later: %q, want %s", snap2, want)
	}
	less(dirty, snap2)
	less(snap2, "0.0.1")

	run(nil, "git", "tag", "v0.1.0")
	if got := printVersion()[0]; got != "0.1.0" {
		t.Errorf("at v0.1.0: %q", got)
	}
	less(snap2, "0.1.0")
	c3 := commitAt(day1 + 2*86400)
	past := printVersion()[0]
	if !regexp.MustCompile(`^0\.1\.0\+1\.g[0-9a-f]+$`).MatchString(past) || !strings.HasPrefix(c3, strings.TrimPrefix(past, "0.1.0+1.g")) {
		t.Errorf("one past v0.1.0: %q (HEAD %s)", past, c3)
	}
	less("0.1.0", past)
	less(past, "0.1.1")
	less(past, "0.2.0~rc1")

	// A pre-release sorts before its release, and so do the commits past
	// it; no - is left to be read as a packaging revision.
	run(nil, "git", "tag", "v0.2.0-rc.1")
	if got := printVersion()[0]; got != "0.2.0~rc.1" {
		t.Errorf("at v0.2.0-rc.1: %q, want 0.2.0~rc.1", got)
	}
	less(past, "0.2.0~rc.1")
	commitAt(day1 + 3*86400)
	pastRC := printVersion()[0]
	if !regexp.MustCompile(`^0\.2\.0~rc\.1\+1\.g[0-9a-f]+$`).MatchString(pastRC) {
		t.Errorf("one past v0.2.0-rc.1: %q", pastRC)
	}
	less("0.2.0~rc.1", pastRC)
	less(pastRC, "0.2.0")
}
