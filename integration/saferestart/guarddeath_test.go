package saferestart

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// guardDeathRuns is how many times the guard is killed.
const guardDeathRuns = 3

// TestGuardKilledNoOverlap: SIGKILL of the restart command's group guard
// while the command runs. The helper must kill the command's group and
// see it gone before it releases the lock: an `etcdctl lock` contender's
// command, queued behind it, must not run beside the orphaned command.
// Both commands append ticks to one file; no tick of one may fall inside
// the other's run. (Before the fix the helper released the lock at once
// and never signalled the group: both ran together.)
func TestGuardKilledNoOverlap(t *testing.T) {
	s := etcdtest.Start(t)
	cli := s.Client(t)
	total := 0
	for run := 1; run <= guardDeathRuns; run++ {
		dir := t.TempDir()
		ticks := filepath.Join(dir, "ticks")
		ready := filepath.Join(dir, "ready")
		if err := syscall.Mkfifo(ready, 0o600); err != nil {
			t.Fatal(err)
		}
		lockName := fmt.Sprintf("guarddeath%d", run)
		holdKey := lockName + "-hold"
		tick := func(id string) string {
			return fmt.Sprintf(`echo "tick $(date +%%s%%N) %s" >> %q; sleep 0.01`, id, ticks)
		}
		// $PPID of the command is its group guard.
		a := bin(t, env(s), lockArgs(lockName, "--hold-key", holdKey, "--attempts", "3", "--",
			"sh", "-c", fmt.Sprintf(`echo $PPID > %q; while :; do %s; done`, ready, tick("A")))...)
		data, err := os.ReadFile(ready) // blocks until the command runs
		if err != nil {
			t.Fatal(err)
		}
		guard, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			t.Fatalf("ready: %q", data)
		}
		ctl := etcdctl(t, env(s), "lock", lockName, "--", "sh", "-c", fmt.Sprintf(`for i in 1 2 3 4 5 6 7 8 9 10; do %s; done`, tick("B")))
		waitQueue(t, cli, lockName, 2)
		if err := syscall.Kill(guard, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if code := a.wait(t); code != codeRestart {
			t.Fatalf("run %d: helper exit %d, want %d", run, code, codeRestart)
		}
		if code := ctl.wait(t); code != 0 {
			t.Fatalf("run %d: etcdctl exit %d", run, code)
		}
		if rec := holdRecord(t, cli, holdKey); !strings.Contains(fmt.Sprint(rec["reason"]), "group guard died") {
			t.Errorf("run %d: hold %v", run, rec)
		}
		if !strings.Contains(a.stderr.String(), "group guard died") {
			t.Errorf("run %d: the log does not say the guard died:\n%s", run, a.stderr)
		}
		n, as, bs := overlappingTicks(t, ticks, "A", "B")
		t.Logf("run %d: %d ticks of the killed command, %d of etcdctl's, %d overlapping", run, as, bs, n)
		if as == 0 || bs != 10 {
			t.Fatalf("run %d: %d A ticks, %d B ticks", run, as, bs)
		}
		total += n
	}
	if total != 0 {
		t.Fatalf("%d overlapping ticks in %d runs, want 0", total, guardDeathRuns)
	}
	t.Logf("overlapping ticks: 0 in %d runs", guardDeathRuns)
}

// overlappingTicks counts the ticks of either id that fall within the
// other's span (first to last tick).
func overlappingTicks(t *testing.T, path, a, b string) (overlap, na, nb int) {
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
			continue // a line cut by the kill
		}
		ns, err := strconv.ParseInt(w[1], 10, 64)
		if err != nil {
			continue
		}
		ts[w[2]] = append(ts[w[2]], ns)
	}
	span := func(v []int64) (lo, hi int64) {
		if len(v) == 0 {
			return 0, -1
		}
		lo, hi = v[0], v[0]
		for _, x := range v {
			lo, hi = min(lo, x), max(hi, x)
		}
		return lo, hi
	}
	count := func(v []int64, lo, hi int64) int {
		n := 0
		for _, x := range v {
			if x >= lo && x <= hi {
				n++
			}
		}
		return n
	}
	alo, ahi := span(ts[a])
	blo, bhi := span(ts[b])
	return count(ts[a], blo, bhi) + count(ts[b], alo, ahi), len(ts[a]), len(ts[b])
}
