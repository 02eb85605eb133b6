package integration

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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

// TestWatchRendersOnlyStatesEtcdHad: random puts, deletes and transactions
// over a key and the keys below it (and a neighbour that only shares the
// string prefix) are rendered as states etcd had at some revision, never
// half of a transaction, ending on the last. A key the role lets confd
// watch as one range is rendered from the watch's changes without a read
// (confd_group_snapshots_total{source="watch"}), from the first change
// after start-up on (source="etcd" is the start-up read alone); one a
// least-privilege role
// grants exactly ("/f" and "/f/") is read on every change, since its two
// ranges may be delivered in either order.
func TestWatchRendersOnlyStatesEtcdHad(t *testing.T) {
	for _, mode := range []string{"whole", "least-privilege"} {
		t.Run(mode, func(t *testing.T) {
			s := etcdtest.Start(t)
			cli := s.Client(t)
			ctx := context.Background()
			state := map[string]string{"/f": "top0"}
			s.Put(t, "/f", "top0")
			render := func() string {
				var b strings.Builder
				if v, ok := state["/f"]; ok {
					b.WriteString("top=" + v)
				}
				var keys []string
				for k := range state {
					if k != "/f" {
						keys = append(keys, k)
					}
				}
				slices.Sort(keys)
				for _, k := range keys {
					b.WriteString(" " + k + "=" + state[k])
				}
				return b.String()
			}
			valid := map[string]bool{render(): true}
			c, ev := newConfdir(t), newEvents(t)
			c.resource("f", fmt.Sprintf("[template]\nsrc = \"f.tmpl\"\ndest = \"DEST\"\nkeys = [\"/f\"]\nreload_cmd = \"cat {{.dest}} > %s\"\n", ev.path),
				`{{if exists "/f"}}top={{getv "/f"}}{{end}}{{range gets "/f/*"}} {{.Key}}={{.Value}}{{end}}`+"\n")
			addr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
			args := append(nodeArgs(t, s), "-watch", "-confdir", c.Dir, "-metrics-addr", addr)
			var env []string
			if mode == "least-privilege" {
				s.EnableAuthExact(t, "rootpw", "reader", "pw", "/f")
				env = []string{"CONFD_PASSWORD=pw"}
				args = append(args, "-username", "reader")
				root := s.ClientConfig()
				root.Username, root.Password = "root", "rootpw"
				var err error
				if cli, err = clientv3.New(root); err != nil {
					t.Fatal(err)
				}
				defer cli.Close()
			}
			p := runDaemon(t, env, args...)
			var seen []string
			last := ev.next(t, 30*time.Second, p.out)
			if last != render() {
				t.Fatalf("start-up render %q, want %q", last, render())
			}
			// catchUp awaits the render of the state now; nothing is
			// rendered when the file would not change.
			catchUp := func() {
				for last != render() {
					last = ev.next(t, 30*time.Second, p.out)
					seen = append(seen, last)
				}
			}
			r := rand.New(rand.NewPCG(7, uint64(len(mode))))
			key := func() string { return fmt.Sprintf("/f/k%d", r.IntN(5)) }
			for i := 0; i < 150; i++ {
				var ops []clientv3.Op
				for n := 1 + r.IntN(3); n > 0; n-- {
					switch k, v := key(), fmt.Sprintf("v%d", i); r.IntN(6) {
					case 0:
						ops = append(ops, clientv3.OpDelete(k))
						delete(state, k)
					case 1:
						ops = append(ops, clientv3.OpPut("/f", "top"+v))
						state["/f"] = "top" + v
					case 2:
						ops = append(ops, clientv3.OpPut("/fx", v)) // not below /f
					default:
						ops = append(ops, clientv3.OpPut(k, v))
						state[k] = v
					}
				}
				// A transaction may touch a key only once.
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					if !strings.Contains(err.Error(), "duplicate key") {
						t.Fatal(err)
					}
					// Put the model back as etcd has it.
					resp, err := cli.Get(ctx, "/f", clientv3.WithPrefix())
					if err != nil {
						t.Fatal(err)
					}
					clear(state)
					for _, kv := range resp.Kvs {
						if k := string(kv.Key); k == "/f" || strings.HasPrefix(k, "/f/") {
							state[k] = string(kv.Value)
						}
					}
					continue
				}
				valid[render()] = true
				if r.IntN(10) == 0 { // now and then, let it catch up
					catchUp()
				}
			}
			if _, err := cli.Put(ctx, "/f/zz", "end"); err != nil {
				t.Fatal(err)
			}
			state["/f/zz"] = "end"
			valid[render()] = true
			catchUp()
			for _, got := range seen {
				if !valid[got] {
					t.Errorf("rendered %q, a state etcd never had", got)
				}
			}
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			metrics, _ := io.ReadAll(resp.Body)
			fromWatch := regexp.MustCompile(`confd_group_snapshots_total\{source="watch"\} (\d+)`).FindSubmatch(metrics)
			if mode == "whole" && (fromWatch == nil || string(fromWatch[1]) == "0") {
				t.Errorf("no pass rendered from the watch:\n%s", metrics)
			}
			// The first stream opens from the revision taken before the
			// start-up read, so it follows that read: no read after it.
			fromEtcd := regexp.MustCompile(`confd_group_snapshots_total\{source="etcd"\} (\d+)`).FindSubmatch(metrics)
			if mode == "whole" && (fromEtcd == nil || string(fromEtcd[1]) != "1") {
				t.Errorf("whole: want only the start-up read from etcd, got %q", fromEtcd)
			}
			// The series exists at 0 from start: any other value is a pass
			// that took its keys from the watch.
			if mode == "least-privilege" && fromWatch != nil && string(fromWatch[1]) != "0" {
				t.Errorf("a key watched as two ranges rendered from the watch: %s", fromWatch[0])
			}
			t.Logf("%d renders; %s", len(seen), regexp.MustCompile(`confd_group_snapshots_total.*`).FindAll(metrics, -1))

			// Every write after the start-up one was owed to changes, and
			// each is timed once. Each write ran one reload, seen above;
			// both counts are recorded after the pass's reload.
			metricsURL := "http://" + addr + "/metrics"
			waitHTTP(t, metricsURL, 200, fmt.Sprintf("confd_resource_writes_total{resource=%q} %d", filepath.Join(c.Dir, "conf.d", "f.toml"), len(seen)+1))
			waitHTTP(t, metricsURL, 200, fmt.Sprintf("confd_watch_change_to_file_seconds_count %d", len(seen)))
		})
	}
}
