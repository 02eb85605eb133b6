package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// TestWatchRendersEveryChange: confd -watch renders at start, then on each
// change of its keys (not of neighbouring keys), and the last value always
// lands even after a burst.
func TestWatchRendersEveryChange(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/w/v", "0")
	c, ev := newConfdir(t), newEvents(t)
	dest := c.reporting(ev, "w", "/w/v")
	log := startReporting(t, ev, "0", append(nodeArgs(t, s), "-watch", "-confdir", c.Dir, "-log-level", "debug")...)
	s.Put(t, "/w/vx", "neighbour") // shares the string prefix, not the path
	s.Put(t, "/w/v", "1")
	if got := ev.next(t, 20*time.Second, log); got != "1" {
		t.Fatalf("after put = %q", got)
	}
	// A burst: every value may or may not be rendered, but the last must be,
	// and nothing may come after it.
	for i := 2; i <= 50; i++ {
		s.Put(t, "/w/v", strconv.Itoa(i))
	}
	for {
		got := ev.next(t, 20*time.Second, log)
		if got == "50" {
			break
		}
		if n, err := strconv.Atoi(got); err != nil || n < 2 || n > 50 {
			t.Fatalf("unexpected render %q", got)
		}
	}
	if got := readFile(t, dest); got != "50\n" {
		t.Errorf("dest = %q", got)
	}
}

// TestWatchSurvivesEtcdRestart: a restarted etcd (same data, new process)
// must not leave confd stuck on a dead watch.
func TestWatchSurvivesEtcdRestart(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/r/v", "before")
	c, ev := newConfdir(t), newEvents(t)
	c.reporting(ev, "r", "/r/v")
	log := startReporting(t, ev, "before", append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	s.Restart(t)
	s.Put(t, "/r/v", "after")
	if got := ev.next(t, 30*time.Second, log); got != "after" {
		t.Fatalf("after restart = %q", got)
	}
}

func TestIntervalPolls(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/i/v", "a")
	c, ev := newConfdir(t), newEvents(t)
	c.reporting(ev, "i", "/i/v")
	log := startReporting(t, ev, "a", append(nodeArgs(t, s), "-interval", "1", "-confdir", c.Dir)...)
	s.Put(t, "/i/v", "b")
	if got := ev.next(t, 20*time.Second, log); got != "b" {
		t.Fatalf("second render = %q", got)
	}
	// As in confd 0.16, a resource file added later is picked up by the next pass.
	s.Put(t, "/j/v", "added")
	c.reporting(ev, "j", "/j/v")
	if got := ev.next(t, 20*time.Second, log); got != "added" {
		t.Fatalf("new resource render = %q", got)
	}
}

// TestBindMountedDestIsWrittenInPlace: kubelet and container runtimes bind
// mount single files; rename over them fails with EBUSY.
func TestBindMountedDestIsWrittenInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace")
	}
	if err := exec.Command("unshare", "-m", "true").Run(); err != nil {
		t.Skipf("unshare -m not permitted here: %v", err)
	}
	s := etcdtest.Start(t)
	s.Put(t, "/b/v", "new")
	c := newConfdir(t)
	dest := c.resource("b", "[template]\nsrc = \"b.tmpl\"\ndest = \"DEST\"\nkeys = [\"/b\"]\nmode = \"0644\"\n", "{{getv \"/b/v\"}}\n")
	backing := filepath.Join(t.TempDir(), "backing")
	for _, p := range []string{dest, backing} {
		if err := os.WriteFile(p, []byte("old\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := strings.Join(append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir), " ")
	script := "mount --bind " + backing + " " + dest + " && " + confdBin + " " + args
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("confd in mount namespace: %v\n%s", err, out)
	}
	if got := readFile(t, backing); got != "new\n" {
		t.Errorf("bind-mounted file = %q, want the new content written in place", got)
	}
	if len(c.stageFiles()) != 0 {
		t.Errorf("stage files left: %v", c.stageFiles())
	}
}
