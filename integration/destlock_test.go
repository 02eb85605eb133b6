package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// lines is a process's output, kept whole and handed out line by line, so
// a test awaits a log line rather than sleeping.
type lines struct {
	mu  sync.Mutex
	all strings.Builder
	ch  chan string
}

func (l *lines) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.all.String() }

// await returns once a line containing substr arrives.
func (l *lines) await(t *testing.T, substr string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case s := <-l.ch:
			if strings.Contains(s, substr) {
				return
			}
		case <-deadline:
			t.Fatalf("no line with %q within %s; output:\n%s", substr, within, l)
		}
	}
}

// startLines starts confd with its stderr (and stdout) read line by line.
func startLines(t *testing.T, args ...string) (*exec.Cmd, *lines) {
	t.Helper()
	cmd := exec.Command(confdBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	l := &lines{ch: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.all.WriteString(sc.Text() + "\n")
			l.mu.Unlock()
			select {
			case l.ch <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return cmd, l
}

// TestOnetimeBesideDaemonWaitsForTheDestination: the daemon's check_cmd is
// running (blocked on a gate the test holds) when an operator runs
// confd -onetime on the same destination from another confdir. With a short
// -dest-lock-timeout the -onetime run fails naming the daemon's PID; with
// the default it waits, deletes no stage file of the daemon's, and finds the
// file in sync once the daemon is done: one change, one check, one reload.
func TestOnetimeBesideDaemonWaitsForTheDestination(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/l/v", "one")
	ev := newEvents(t)
	tmp := t.TempDir()
	gate, reloads := filepath.Join(tmp, "gate"), filepath.Join(tmp, "reloads")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	// The check reports its stage file, waits for the gate, and fails if
	// its stage file is gone by then.
	toml := "[template]\nsrc = \"l.tmpl\"\ndest = \"DEST\"\nkeys = [\"/l\"]\n" +
		"check_cmd = \"echo {{.src}} > " + ev.path + "; cat " + gate + " >/dev/null; test -f {{.src}}\"\n" +
		"reload_cmd = \"echo reload >> " + reloads + "\"\n"
	daemonDir := newConfdir(t)
	dest := daemonDir.resource("l", toml, "{{getv \"/l/v\"}}\n")
	// The operator's confdir: another copy, the same destination.
	opDir := newConfdir(t)
	opDir.Out = daemonDir.Out
	opDir.resource("l", toml, "{{getv \"/l/v\"}}\n")

	daemon, dlog := startLines(t, append(nodeArgs(t, s), "-watch", "-confdir", daemonDir.Dir)...)
	stage := ev.next(t, 20*time.Second, dlog)

	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", opDir.Dir, "-dest-lock-timeout", "200ms")...)
	if want := fmt.Sprintf("PID %d", daemon.Process.Pid); r.code != 1 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "-dest-lock-timeout") {
		t.Errorf("-onetime under the daemon's lock: exit %d, want 1 and an error naming %s:\n%s", r.code, want, r.stderr)
	}

	op, olog := startLines(t, append(nodeArgs(t, s), "-onetime", "-confdir", opDir.Dir)...)
	olog.await(t, "Waiting up to", 20*time.Second)
	if _, err := os.Stat(stage); err != nil {
		t.Fatalf("the daemon's stage file is gone while its check_cmd runs: %v\n-onetime:\n%s", err, olog)
	}
	// Open the gate for every check to come: the blocked one through the
	// FIFO (a writer that closes: end of file), any later one through a
	// plain file in its place.
	fw, err := os.OpenFile(gate, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	plain := gate + ".open"
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(plain, gate); err != nil {
		t.Fatal(err)
	}
	fw.Close()
	if err := op.Wait(); err != nil {
		t.Fatalf("-onetime after the daemon's pass: %v\n%s", err, olog)
	}
	if got := readFile(t, dest); got != "one\n" {
		t.Errorf("dest = %q", got)
	}
	if got := readFile(t, reloads); got != "reload\n" {
		t.Errorf("reloads = %q, want exactly one\ndaemon:\n%s\n-onetime:\n%s", got, dlog, olog)
	}
	for _, bad := range []string{"check_cmd failed", "stale stage file"} {
		if strings.Contains(dlog.String()+olog.String(), bad) {
			t.Errorf("logged %q\ndaemon:\n%s\n-onetime:\n%s", bad, dlog, olog)
		}
	}
	// The lock shared by the two confdirs is not beside the destination
	// (in -lock-dir's default, /run/confd/locks).
	if names := dirNames(t, daemonDir.Out); len(names) != 1 || names[0] != "l" {
		t.Errorf("beside the destination: %v, want only l", names)
	}
}

// TestLockDirLeavesTheDestinationsDirectoryAlone: a pass with -lock-dir
// (a confd of its own user, say) keeps its lock there, the file named
// after the destination, and leaves only the destination in its directory:
// a directory that Puppet purges stays as confd 0.16 left it.
func TestLockDirLeavesTheDestinationsDirectoryAlone(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/l/v", "one")
	c := newConfdir(t)
	dest := c.resource("l", "[template]\nsrc = \"l.tmpl\"\ndest = \"DEST\"\nkeys = [\"/l\"]\n", "{{getv \"/l/v\"}}\n")
	locks := filepath.Join(t.TempDir(), "confd", "locks")
	if r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-lock-dir", locks)...); r.code != 0 {
		t.Fatalf("-onetime: exit %d\n%s", r.code, r.stderr)
	}
	if got := readFile(t, dest); got != "one\n" {
		t.Errorf("dest = %q", got)
	}
	if names := dirNames(t, c.Out); len(names) != 1 || names[0] != "l" {
		t.Errorf("beside the destination: %v, want only l", names)
	}
	if names := dirNames(t, locks); len(names) != 1 || !strings.HasSuffix(names[0], "-l.lock") {
		t.Errorf("-lock-dir holds %v, want one <hash>-l.lock", names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
