package saferestart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// A restart command that cannot start ran nothing: exit 3 at once, no
// retry, no hold, the lock released. Caught before the lock when it is not
// found, and by the guard when exec fails anyway (a bad interpreter).
func TestRestartCommandCannotStart(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	dir := t.TempDir()
	badInterp := writeFile(t, filepath.Join(dir, "restart.sh"), []byte("#!/nonexistent/interpreter\nexit 0\n"))
	if err := os.Chmod(badInterp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"not found", []string{filepath.Join(dir, "missing"), "now"}, "the restart command " + filepath.Join(dir, "missing") + " now cannot start: nothing was restarted, no hold written"},
		{"exec fails", []string{badInterp}, "restart command could not start: " + badInterp + ": fork/exec " + badInterp + ": no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "nostart-" + strings.ReplaceAll(tc.name, " ", "-")
			p := runBin(t, env(s), lockArgs(name, append([]string{"--attempts", "3", "--"}, tc.argv...)...)...)
			if p.code != codePreflight || !strings.Contains(p.stderr.String(), tc.want) {
				t.Fatalf("exit %d, want %d with %q\n%s", p.code, codePreflight, tc.want, p.stderr)
			}
			if n := strings.Count(p.stderr.String(), "restart command started"); n != 0 {
				t.Fatalf("%d attempts started", n)
			}
			if strings.Contains(p.stderr.String(), "retrying in") {
				t.Fatalf("retried:\n%s", p.stderr)
			}
			if v, ok := getKey(t, cli, name+"-hold"); ok {
				t.Fatalf("hold written: %s", v)
			}
			if q := queueKeys(t, cli, name); len(q) != 0 {
				t.Fatalf("lock not released: %v", q)
			}
		})
	}
}

// A failed restart's hold names the host as --host gives it and the
// command as given, not the group guard running it.
func TestHoldNamesHostAndCommand(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	p := runBin(t, env(s), lockArgs("holdhost", "--attempts", "1", "--host", "m9.example", "--", "sh", "-c", "exit 4")...)
	if p.code != codeRestart {
		t.Fatalf("exit %d, want %d\n%s", p.code, codeRestart, p.stderr)
	}
	rec := holdRecord(t, cli, "holdhost-hold")
	if rec["host"] != "m9.example" || rec["reason"] != "sh -c 'exit 4' exited with status 4" {
		t.Fatalf("hold %v, want host m9.example and the command's status", rec)
	}
	st := runBin(t, env(s), "status", "--lock-name", "holdhost")
	if !strings.Contains(st.stdout.String(), "host m9.example (pid ") || strings.Contains(st.stdout.String(), "__group-guard") {
		t.Fatalf("status:\n%s", st.stdout)
	}
}

// rotate-key with a key file missing changes nothing and exits 3 (not 1,
// "worth retrying"), with --dry-run too.
func TestRotateKeyMissingKeyFiles(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	dir := t.TempDir()
	for _, dry := range []bool{false, true} {
		args := []string{"rotate-key", "--host", "m1", "--signing-key", filepath.Join(dir, "sa.key"), "--public-key", filepath.Join(dir, "sa.pub")}
		if dry {
			args = append(args, "--dry-run")
		}
		p := runBin(t, env(s), append(args, lockArgs("missing")...)...)
		want := "signing key (--signing-key): " + filepath.Join(dir, "sa.key") + ": open: no such file or directory"
		if p.code != codePreflight || !strings.Contains(p.stderr.String(), want) {
			t.Fatalf("dry run %v: exit %d, want %d with %q\n%s", dry, p.code, codePreflight, want, p.stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("files written: %v", entries)
	}
}

// Abort before the install, rollback after it, each refused (exit 3) in
// the other's state and while another rotation of the host runs (exit 5);
// no token is refused anywhere throughout, and no temporary file is left.
func TestRotateKeyAbortAndRollback(t *testing.T) {
	f := newMiniFleet(t, 2)
	m1, m2 := f.hosts[0], f.hosts[1]
	f.waitConverged(t)
	prev := fileKids(t, m1.path("sa.key"))[0]
	published := func() []string {
		t.Helper()
		v, ok := getKey(t, f.cli, keysPrefix+"/"+m1.name)
		if !ok {
			t.Fatal("m1 publishes nothing")
		}
		p := writeFile(t, filepath.Join(t.TempDir(), "published.pem"), []byte(v))
		return fileKids(t, p)
	}
	stateKey := rotationPrefix + "/" + m1.name + "/state"

	// Nothing to leave yet.
	for _, how := range []string{"--abort", "--rollback"} {
		if p := runBin(t, f.env, f.rotateArgs(m1, how)...); p.code != codePreflight {
			t.Fatalf("%s with no rotation: exit %d, want 3\n%s", how, p.code, p.stderr)
		}
	}

	// m2 is down: the rotation publishes its next key and waits. An abort
	// meanwhile is refused (exit 5); once the wait gave up, a rollback is
	// refused (not installed) and the abort withdraws the next key.
	m2.setDown(true)
	r := bin(t, f.env, f.rotateArgs(m1, "--timeout", "20s")...)
	r.stderr.waitFor(t, "waiting until every host's apiserver trusts the next key")
	if p := runBin(t, f.env, f.rotateArgs(m1, "--abort")...); p.code != codeLockTimeout {
		t.Fatalf("abort while a rotation runs: exit %d, want 5\n%s", p.code, p.stderr)
	}
	r.signal(t, syscall.SIGTERM)
	r.wait(t)
	next := fileKids(t, m1.path("sa.key.next"))[0]
	// The value is sorted by key ID, as every writer writes it.
	if got, want := published(), []string{prev, next}; !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Fatalf("published %v, want %s and %s", got, prev, next)
	}
	p := runBin(t, f.env, f.rotateArgs(m1, "--rollback")...)
	if p.code != codePreflight || !strings.Contains(p.stderr.String(), "is not installed: use rotate-key --abort") {
		t.Fatalf("rollback before the install: exit %d\n%s", p.code, p.stderr)
	}
	if p := runBin(t, f.env, f.rotateArgs(m1, "--abort")...); p.code != codeOK {
		t.Fatalf("abort: exit %d\n%s", p.code, p.stderr)
	}
	if got := published(); !slices.Equal(got, []string{prev}) {
		t.Fatalf("published %v after abort, want only %s", got, prev)
	}
	if got := fileKids(t, m1.path("sa.pub")); !slices.Equal(got, []string{prev}) {
		t.Fatalf("sa.pub %v after abort", got)
	}
	if _, ok := getKey(t, f.cli, stateKey); ok {
		t.Fatal("rotation state kept after abort")
	}
	assertNoRotationFiles(t, m1.dir, "sa.key", "sa.pub", "sa-bundle.pem", "apiserver.env")

	// The rotation again, to its end; then abort is refused and a rollback
	// makes the previous key sign again while the rolled-back one stays
	// published until retire-keys (--grace 0 here) withdraws it.
	m2.setDown(false)
	if p := runBin(t, f.env, f.rotateArgs(m1, "--timeout", "25s")...); p.code != codeOK {
		t.Fatalf("rotate-key: exit %d\n%s", p.code, p.stderr)
	}
	next = fileKids(t, m1.path("sa.key"))[0]
	assertNoRotationFiles(t, m1.dir, "sa.key", "sa.key.previous", "sa.pub", "sa-bundle.pem", "apiserver.env")
	p = runBin(t, f.env, f.rotateArgs(m1, "--abort")...)
	if p.code != codePreflight || !strings.Contains(p.stderr.String(), "use rotate-key --rollback") {
		t.Fatalf("abort after the install: exit %d\n%s", p.code, p.stderr)
	}
	if p := runBin(t, f.env, f.rotateArgs(m1, "--rollback", "--grace", "0s")...); p.code != codeOK {
		t.Fatalf("rollback: exit %d\n%s", p.code, p.stderr)
	}
	if got := fileKids(t, m1.path("sa.key"))[0]; got != prev {
		t.Fatalf("signing key %s after rollback, want %s", got, prev)
	}
	if got := published(); !slices.Contains(got, next) || !slices.Contains(got, prev) {
		t.Fatalf("published %v after rollback, want both keys until retire-keys", got)
	}
	f.waitTrust(t, "m1's record to sign with the previous key", func(rep trustRep) bool {
		for _, h := range rep.Hosts {
			if h.Host == m1.name {
				return h.Record != nil && h.Record.Signing == prev
			}
		}
		return false
	})
	if p := runBin(t, f.env, "retire-keys", "--host", m1.name, "--signing-key", m1.path("sa.key"), "--public-key", m1.path("sa.pub")); p.code != codeOK {
		t.Fatalf("retire-keys: exit %d\n%s", p.code, p.stderr)
	}
	if got := published(); !slices.Equal(got, []string{prev}) {
		t.Fatalf("published %v after retire-keys, want only %s", got, prev)
	}
	assertNoRotationFiles(t, m1.dir, "sa.key", "sa.pub", "sa-bundle.pem", "apiserver.env")
	p = runBin(t, f.env, f.rotateArgs(m1, "--rollback")...)
	if p.code != codePreflight || !strings.Contains(p.stderr.String(), "was retired") {
		t.Fatalf("rollback after retire-keys: exit %d\n%s", p.code, p.stderr)
	}
	f.waitConverged(t)
	f.checkNoRejections(t)
}

// assertNoRotationFiles fails when dir holds anything but want: no
// sa.*.next, no sa.key.previous once retired, no temporary.
func assertNoRotationFiles(t *testing.T, dir string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for _, e := range entries {
		if !slices.Contains(want, e.Name()) && !strings.HasPrefix(e.Name(), ".sa-bundle.tmp") {
			extra = append(extra, e.Name())
		}
	}
	if len(extra) > 0 {
		t.Fatalf("left in %s: %v (want only %v)", dir, extra, want)
	}
}
