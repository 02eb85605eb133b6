package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// confdKillRuns is how many times confd is SIGKILLed mid-reload.
const confdKillRuns = 3

// TestConfdKilledReloadNeverOverlaps: confd -onetime SIGKILLed while its
// reload_cmd runs. The command's group guard gives the reload SIGTERM (the
// command's own trap runs), and the next confd's owed reload waits for the
// old one to be gone. Both reloads append ticks to one file: no tick of
// one may fall inside the other's run. (Before the guard, the killed
// confd's reload kept running beside the next one's.)
func TestConfdKilledReloadNeverOverlaps(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "new")
	total := 0
	for run := 1; run <= confdKillRuns; run++ {
		c := newConfdir(t)
		dir := t.TempDir()
		ticks, ready, armed, termed := filepath.Join(dir, "ticks"), filepath.Join(dir, "ready"), filepath.Join(dir, "armed"), filepath.Join(dir, "termed")
		release := filepath.Join(dir, "release")
		if err := syscall.Mkfifo(ready, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(armed, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		tick := func(id string) string {
			return fmt.Sprintf(`echo "tick $(date +%%s%%N) %s" >> %s; sleep 0.01`, id, ticks)
		}
		// The first run reports confd's pid (its parent is the guard,
		// whose parent is confd), then ticks; on SIGTERM it goes on
		// ticking and printing (as a helper writing its hold would still
		// work and log; its output pipe's reader, confd, is gone) until
		// the test has seen the next confd wait for it.
		script := filepath.Join(dir, "reload.sh")
		body := fmt.Sprintf(`if [ -e %[1]s ]; then
  rm %[1]s
  trap 'echo term > %[2]s; while [ ! -e %[6]s ]; do echo cleaning up; %[4]s; done; exit 1' TERM
  cut -d' ' -f4 /proc/$PPID/stat > %[3]s
  while :; do %[4]s; done
fi
for i in 1 2 3 4 5 6 7 8 9 10; do %[5]s; done
`, armed, termed, ready, tick("A"), tick("B"), release)
		if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
			t.Fatal(err)
		}
		c.resource("app", "[template]\nsrc = \"app.tmpl\"\ndest = \"DEST\"\nkeys = [\"/w\"]\nreload_cmd = \"exec sh "+script+"\"\n", "{{getv \"/w/v\"}}\n")
		args := append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-command-grace", "30s")
		first := exec.Command(confdBin, args...)
		var firstErr strings.Builder
		first.Stderr = &firstErr
		first.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := first.Start(); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(ready) // blocks until the reload runs
		if err != nil {
			t.Fatal(err)
		}
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(data))); pid != first.Process.Pid {
			t.Fatalf("the reload's grandparent is %q, not confd %d", data, first.Process.Pid)
		}
		_ = first.Process.Kill()
		_ = first.Wait()
		r := confdWaitingForOldReload(t, args, release)
		if t.Failed() {
			t.Fatalf("ticks %q termed %q", readFileOr(ticks), readFileOr(termed))
		}
		if r.code != 0 {
			t.Fatalf("run %d: the next confd exit %d:\n%s", run, r.code, r.stderr)
		}
		if readFileOr(termed) != "term\n" {
			t.Errorf("run %d: the killed confd's reload did not get SIGTERM", run)
		}
		n, as, bs := tickOverlap(t, ticks, "A", "B")
		t.Logf("run %d: %d ticks of the killed confd's reload, %d of the next one's, %d overlapping", run, as, bs, n)
		if as == 0 || bs != 10 {
			t.Fatalf("run %d: %d A ticks, %d B ticks\n%s", run, as, bs, r.stderr)
		}
		total += n
	}
	if total != 0 {
		t.Fatalf("%d overlapping ticks in %d runs, want 0", total, confdKillRuns)
	}
	t.Logf("overlapping ticks: 0 in %d runs", confdKillRuns)
}

// tickOverlap counts the ticks of either id that fall within the other's
// span (first to last tick).
func tickOverlap(t *testing.T, path, a, b string) (overlap, na, nb int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ts := map[string][]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		if len(w) != 3 || w[0] != "tick" {
			continue
		}
		if ns, err := strconv.ParseInt(w[1], 10, 64); err == nil {
			ts[w[2]] = append(ts[w[2]], ns)
		}
	}
	within := func(v []int64, of []int64) int {
		if len(of) == 0 {
			return 0
		}
		lo, hi := of[0], of[0]
		for _, x := range of {
			lo, hi = min(lo, x), max(hi, x)
		}
		n := 0
		for _, x := range v {
			if x >= lo && x <= hi {
				n++
			}
		}
		return n
	}
	return within(ts[a], ts[b]) + within(ts[b], ts[a]), len(ts[a]), len(ts[b])
}

// confdWaitingForOldReload runs confd until it logs that it waits for an
// earlier run of its command, then creates release (which lets that run
// end), and returns when confd has ended.
func confdWaitingForOldReload(t *testing.T, args []string, release string) result {
	t.Helper()
	cmd := exec.Command(confdBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	sc := bufio.NewScanner(stderr)
	released := false
	for sc.Scan() {
		log.WriteString(sc.Text() + "\n")
		if !released && strings.Contains(sc.Text(), "waiting for an earlier run of this command to end") {
			if err := os.WriteFile(release, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			released = true
		}
	}
	err = cmd.Wait()
	r := result{stderr: log.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	}
	if !released {
		t.Errorf("confd did not wait for the killed confd's reload (exit %d):\n%s", r.code, r.stderr)
	}
	return r
}
