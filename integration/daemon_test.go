package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
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

// syncBuf is confd's output, written by the process and read by the test.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemonProc is a long-running confd the test signals and awaits.
type daemonProc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
	code int
}

func runDaemon(t *testing.T, env []string, args ...string) *daemonProc {
	t.Helper()
	p := &daemonProc{cmd: exec.Command(confdBin, args...), out: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			// A goroutine dump says where it hangs.
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = p.cmd.Process.Kill()
			}
			t.Errorf("confd did not stop on SIGTERM; output:\n%s", p.out)
		}
	})
	return p
}

// waitLog waits until confd has logged want (n-th occurrence).
func (p *daemonProc) waitLog(t *testing.T, want string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for strings.Count(p.out.String(), want) < n {
		select {
		case <-p.done:
			t.Fatalf("confd exited (%d) before logging %q; output:\n%s", p.code, want, p.out)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("confd did not log %q within %s; output:\n%s", want, within, p.out)
		}
	}
}

func (p *daemonProc) exit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(within):
		t.Fatalf("confd still running after %s; output:\n%s", within, p.out)
		return -1
	}
}

// namedReporting is a resource whose reload_cmd reports "NAME=VALUE".
func (c *confdir) namedReporting(ev *events, name, key, extra string) string {
	c.t.Helper()
	return c.resource(name,
		fmt.Sprintf("[template]\nsrc = %q\ndest = \"DEST\"\nkeys = [%q]\nreload_cmd = \"echo %s=$(cat {{.dest}}) > %s\"\n%s", name+".tmpl", key, name, ev.path, extra),
		fmt.Sprintf("{{if exists %q}}{{getv %q}}{{else}}none{{end}}\n", key+"/v", key+"/v"))
}

func expectEvents(t *testing.T, ev *events, log fmt.Stringer, want ...string) {
	t.Helper()
	for _, w := range want {
		if got := ev.next(t, 30*time.Second, log); got != w {
			t.Fatalf("event %q, want %q (all wanted: %q)", got, w, want)
		}
	}
}

// expectGroupEvents expects every event of groups, each group's in its
// order; independent groups are processed concurrently, so theirs may
// interleave.
func expectGroupEvents(t *testing.T, ev *events, log fmt.Stringer, groups ...[]string) {
	t.Helper()
	next := make([]int, len(groups))
	total := 0
	for _, g := range groups {
		total += len(g)
	}
	for n := 0; n < total; n++ {
		got := ev.next(t, 30*time.Second, log)
		ok := false
		for i, g := range groups {
			if next[i] < len(g) && g[next[i]] == got {
				next[i]++
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("event %q, want the next of each of %q (seen so far: %v)", got, groups, next)
		}
	}
}

// expectQuiet fails when an event arrives within d: what must not happen
// can only be shown by waiting.
func expectQuiet(t *testing.T, ev *events, d time.Duration) {
	t.Helper()
	select {
	case l := <-ev.lines:
		t.Fatalf("unexpected event %q", l)
	case <-time.After(d):
	}
}

// TestWatchOrderedGroupsUnderWait: two resources on one key render in
// file-name order; under -wait a del+put and a burst of puts give one
// render each; a resource on two sibling prefixes hears both.
func TestWatchOrderedGroupsUnderWait(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/sa/v", "k0")
	s.Put(t, "/x/v", "x0")
	c, ev := newConfdir(t), newEvents(t)
	c.namedReporting(ev, "20-flags", "/sa", "")
	c.namedReporting(ev, "10-bundle", "/sa", "")
	c.resource("30-two", fmt.Sprintf("[template]\nsrc = \"30-two.tmpl\"\ndest = \"DEST\"\nkeys = [\"/x\", \"/y\"]\nreload_cmd = \"echo two=$(cat {{.dest}}) > %s\"\n", ev.path),
		"{{getv \"/x/v\"}}{{if exists \"/y/v\"}}+{{getv \"/y/v\"}}{{end}}\n")
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir, "-wait", "300ms:3s")...)
	expectGroupEvents(t, ev, p.out, []string{"10-bundle=k0", "20-flags=k0"}, []string{"two=x0"})
	// A key replaced: delete then put; one restart, in order.
	cli := s.Client(t)
	if _, err := cli.Delete(t.Context(), "/sa/v"); err != nil {
		t.Fatal(err)
	}
	s.Put(t, "/sa/v", "k1")
	expectEvents(t, ev, p.out, "10-bundle=k1", "20-flags=k1")
	for i := 2; i <= 7; i++ {
		s.Put(t, "/sa/v", fmt.Sprintf("k%d", i))
	}
	expectEvents(t, ev, p.out, "10-bundle=k7", "20-flags=k7")
	s.Put(t, "/y/v", "y1")
	expectEvents(t, ev, p.out, "two=x0+y1")
	s.Put(t, "/xy/v", "neighbour") // a string prefix of neither key's path
	expectQuiet(t, ev, time.Second)
}

// TestWatchRestoreFromOlderBackup: etcd restored to an older revision is
// noticed, logged, and everything re-read; later changes render.
func TestWatchRestoreFromOlderBackup(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v))
			s.Put(t, "/r/v", "old")
			backup := s.Backup(t)
			c, ev := newConfdir(t), newEvents(t)
			c.namedReporting(ev, "r", "/r", "")
			for i := 0; i < 20; i++ {
				s.Put(t, "/r/other", fmt.Sprint(i)) // revisions a restore takes back
			}
			s.Put(t, "/r/v", "newer")
			p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
			expectEvents(t, ev, p.out, "r=newer")
			s.RestoreBackup(t, backup)
			p.waitLog(t, "lower than revision", 1, 30*time.Second)
			expectEvents(t, ev, p.out, "r=old") // the re-read brought the restored value back
			s.Put(t, "/r/v", "after-restore")
			expectEvents(t, ev, p.out, "r=after-restore")
		})
	}
}

// TestWatchOutageIsLoud: a stalled etcd is logged when the watch breaks
// and when it is back, /readyz and confd_watch_up follow, and a change
// made after it is rendered.
func TestWatchOutageIsLoud(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/o/v", "a")
	c, ev := newConfdir(t), newEvents(t)
	c.namedReporting(ev, "o", "/o", "")
	addr := fmt.Sprintf("127.0.0.1:%d", etcdtest.FreePort(t))
	// SIGSTOPped, etcd is as silent as during a long defrag: only the
	// stall timeout tells (a lost connection would end the watch at once).
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-watch-stall-timeout", "3s", "-confdir", c.Dir, "-metrics-addr", addr)...)
	expectEvents(t, ev, p.out, "o=a")
	waitHTTP(t, "http://"+addr+"/readyz", 200, "")
	waitHTTP(t, "http://"+addr+"/metrics", 200, "confd_watch_up 1")
	waitHTTP(t, "http://"+addr+"/healthz", 200, "ok")
	s.Pause()
	p.waitLog(t, "etcd watch broken", 1, 30*time.Second)
	waitHTTP(t, "http://"+addr+"/readyz", 503, "")
	waitHTTP(t, "http://"+addr+"/metrics", 200, "confd_watch_up 0")
	s.Resume()
	p.waitLog(t, "etcd watch back after", 1, 30*time.Second)
	s.Put(t, "/o/v", "b")
	expectEvents(t, ev, p.out, "o=b")
	waitHTTP(t, "http://"+addr+"/readyz", 200, "")
	waitHTTP(t, "http://"+addr+"/metrics", 200, `confd_resource_renders_total{resource="`+filepath.Join(c.Dir, "conf.d", "o.toml")+`",result="ok"} 2`)
}

// waitHTTP polls url until it answers code with a body containing want.
func waitHTTP(t *testing.T, url string, code int, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == code && strings.Contains(string(b), want) {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: want %d with %q; last answer: %.2000s", url, code, want, last)
}

// TestWatchPasswordPastTokenTTL: with a 2 s auth token TTL, confd keeps
// reading and watching after its token expired, on 3.4 and 3.6.
func TestWatchPasswordPastTokenTTL(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v), etcdtest.WithArgs("--auth-token-ttl=2"))
			s.Put(t, "/secure/v", "a")
			s.EnableAuth(t, "rootpw", "reader", "s3cret-pw", "/secure")
			c, ev := newConfdir(t), newEvents(t)
			c.namedReporting(ev, "s", "/secure", "")
			p := runDaemon(t, []string{"CONFD_PASSWORD=s3cret-pw"}, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir, "-username", "reader", "-resync", "3s")...)
			expectEvents(t, ev, p.out, "s=a")
			time.Sleep(3 * time.Second) // the token's TTL must pass: nothing to await
			s.PutAs(t, "root", "rootpw", "/secure/v", "b")
			expectEvents(t, ev, p.out, "s=b")
			// A restarted etcd forgets every token: a new watch and a resync read need a new one.
			s.Restart(t)
			time.Sleep(3 * time.Second)
			s.PutAs(t, "root", "rootpw", "/secure/v", "c")
			expectEvents(t, ev, p.out, "s=c")
			p.waitLog(t, "Periodic full reconcile", 2, 30*time.Second)
			if out := p.out.String(); strings.Contains(out, "invalid auth token") || strings.Contains(out, "s3cret-pw") {
				t.Errorf("token refused or password logged:\n%s", out)
			}
		})
	}
}

// TestWatchClientCertificateRenewed: an expired client certificate is
// reported as expired; renewed on disk, it is used without a restart.
func TestWatchClientCertificateRenewed(t *testing.T) {
	for _, v := range etcdtest.Versions {
		t.Run(v, func(t *testing.T) {
			s := etcdtest.Start(t, etcdtest.WithVersion(v), etcdtest.WithTLS())
			s.Put(t, "/c/v", "a")
			dir := t.TempDir()
			cert, key := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
			expires := time.Now().Add(4 * time.Second)
			cp, kp := s.TLS.Authority.Issue(t, "root", false, expires)
			writeFile(t, cert, cp)
			writeFile(t, key, kp)
			c, ev := newConfdir(t), newEvents(t)
			c.namedReporting(ev, "c", "/c", "")
			p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir,
				"-client-ca-keys", s.TLS.CA, "-client-cert", cert, "-client-key", key)...)
			expectEvents(t, ev, p.out, "c=a")
			time.Sleep(time.Until(expires) + time.Second) // the certificate must expire: nothing to await
			s.Restart(t)                                  // new connections need a handshake
			p.waitLog(t, "expired at", 1, 30*time.Second)
			cp, kp = s.TLS.Authority.Issue(t, "root", false, time.Now().Add(time.Hour))
			writeFile(t, key+".new", kp)
			writeFile(t, cert+".new", cp)
			for _, f := range []string{key, cert} {
				if err := os.Rename(f+".new", f); err != nil {
					t.Fatal(err)
				}
			}
			p.waitLog(t, "etcd watch back after", 1, 30*time.Second)
			s.Put(t, "/c/v", "b")
			expectEvents(t, ev, p.out, "c=b")
		})
	}
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSIGHUPReadsNewResource: a resource added to conf.d renders after
// SIGHUP, and its keys are watched from then on.
func TestSIGHUPReadsNewResource(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/h1/v", "a")
	s.Put(t, "/h2/v", "b")
	c, ev := newConfdir(t), newEvents(t)
	c.namedReporting(ev, "h1", "/h1", "")
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	expectEvents(t, ev, p.out, "h1=a")
	c.namedReporting(ev, "h2", "/h2", "")
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ev, p.out, "h2=b")
	s.Put(t, "/h2/v", "b2")
	expectEvents(t, ev, p.out, "h2=b2")
	if p.code != 0 || strings.Contains(p.out.String(), "panic") {
		t.Fatalf("confd after SIGHUP: %s", p.out)
	}
}

// TestSIGTERMDuringReload: the running reload finishes, nothing new
// starts, confd exits 0; a second SIGTERM ends a running check at once and
// leaves no stage file.
func TestSIGTERMDuringReload(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/t/v", "a")
	c, ev := newConfdir(t), newEvents(t)
	c.resource("t", fmt.Sprintf("[template]\nsrc = \"t.tmpl\"\ndest = \"DEST\"\nkeys = [\"/t\"]\nreload_cmd = \"echo started > %[1]s; sleep 2; echo finished > %[1]s\"\n", ev.path), "{{getv \"/t/v\"}}\n")
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	expectEvents(t, ev, p.out, "started")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	expectEvents(t, ev, p.out, "finished")
	if code := p.exit(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM; output:\n%s", code, p.out)
	}

	// Second signal during a check: ends it now.
	c2, ev2 := newConfdir(t), newEvents(t)
	c2.resource("u", fmt.Sprintf("[template]\nsrc = \"u.tmpl\"\ndest = \"DEST\"\nkeys = [\"/t\"]\ncheck_cmd = \"echo checking > %s; sleep 60\"\n", ev2.path), "{{getv \"/t/v\"}}\n")
	p2 := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c2.Dir)...)
	expectEvents(t, ev2, p2.out, "checking")
	_ = p2.cmd.Process.Signal(syscall.SIGTERM)
	p2.waitLog(t, "stopping", 1, 10*time.Second)
	_ = p2.cmd.Process.Signal(syscall.SIGTERM)
	p2.exit(t, 10*time.Second)
	if left := c2.stageFiles(); len(left) != 0 {
		t.Errorf("stage files left: %v", left)
	}
}

// TestNothingToProcessExits2: a daemon mode with no resource is a
// configuration error, not a restart loop.
func TestNothingToProcessExits2(t *testing.T) {
	s := etcdtest.Start(t)
	c := newConfdir(t)
	for _, mode := range [][]string{{"-watch"}, {"-interval", "1"}} {
		r := confd(t, nil, append(append(nodeArgs(t, s), "-confdir", c.Dir), mode...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "nothing to process") {
			t.Errorf("%v with empty conf.d: exit %d, stderr %q", mode, r.code, r.stderr)
		}
	}
}

// TestStaleStageFilesRemovedAtStart: what a killed confd left is cleaned.
func TestStaleStageFilesRemovedAtStart(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/st/v", "a")
	c := newConfdir(t)
	dest := c.resource("st", "[template]\nsrc = \"st.tmpl\"\ndest = \"DEST\"\nkeys = [\"/st\"]\n", "{{getv \"/st/v\"}}\n")
	stale := filepath.Join(filepath.Dir(dest), ".st.0123456789ab")
	other := filepath.Join(filepath.Dir(dest), ".st.not-ours")
	writeFile(t, stale, []byte("half"))
	writeFile(t, other, []byte("keep"))
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale stage file still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file not named like a stage file was removed: %v", err)
	}
	if !strings.Contains(r.stderr, "removed stale stage file") {
		t.Errorf("removal not logged: %s", r.stderr)
	}
}

// TestSystemdNotify: with NOTIFY_SOCKET, confd sends READY=1 once it has
// rendered everything, and feeds the watchdog.
func TestSystemdNotify(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/n/v", "a")
	c, ev := newConfdir(t), newEvents(t)
	c.namedReporting(ev, "n", "/n", "")
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	p := runDaemon(t, []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=1000000"}, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	var seen []string
	for _, want := range []string{"READY=1", "WATCHDOG=1"} {
		for !contains(seen, want) {
			select {
			case m := <-msgs:
				seen = append(seen, m)
			case <-time.After(30 * time.Second):
				t.Fatalf("no %s; got %q; output:\n%s", want, seen, p.out)
			}
		}
	}
	expectEvents(t, ev, p.out, "n=a")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestWatchRetryListens: a resource failing its check backs off, but a
// fixed key is rendered at once, not after the backoff.
func TestWatchRetryListens(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/f/v", "bad")
	c, ev := newConfdir(t), newEvents(t)
	c.resource("f", fmt.Sprintf("[template]\nsrc = \"f.tmpl\"\ndest = \"DEST\"\nkeys = [\"/f\"]\ncheck_cmd = \"grep -q good {{.src}}\"\nreload_cmd = \"cat {{.dest}} > %s\"\n", ev.path), "{{getv \"/f/v\"}}\n")
	p := runDaemon(t, nil, append(nodeArgs(t, s), "-watch", "-confdir", c.Dir)...)
	p.waitLog(t, "will retry in 8s", 1, 60*time.Second) // backoff grown past the bound below
	start := time.Now()
	s.Put(t, "/f/v", "good")
	expectEvents(t, ev, p.out, "good")
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("fixed key rendered after %s: the retry waited for its backoff", took)
	}
}
