package saferestart

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/keysync/confd/internal/etcdtest"
)

// etcdVersions are the server versions the lock's fault tests run on: the
// default (toolbin.Etcd) and Debian's 3.4 (/usr/bin).
var etcdVersions = []struct {
	name string
	opts []etcdtest.Option
}{
	{"etcd3.6", nil},
	{"etcd3.4", []etcdtest.Option{etcdtest.WithVersion("3.4")}},
}

// TestFaults runs each fault against a real etcd of every supported
// version, in parallel, each under its own lock name.
func TestFaults(t *testing.T) {
	for _, v := range etcdVersions {
		t.Run(v.name, func(t *testing.T) {
			s := etcdtest.Start(t, v.opts...)
			cli := s.Client(t)
			for name, f := range map[string]func(*testing.T, *etcdtest.Server, *clientv3.Client){
				"HelperKilledTakesCommandWithIt": testHelperKilled,
				"HangupAndQuitLikeTerm":          testHangupAndQuit,
				"SecondSignalStopsCommand":       testSecondSignal,
				"LeaseLostDuringGateHolds":       testLeaseLostDuringGate,
				"WrongHealthCANothingRestarted":  testWrongHealthCA,
				"HoldNeverOverwritten":           testHoldNeverOverwritten,
				"LockKeyDeletedIsLost":           testLockKeyDeleted,
				"EtcdctlLockInterop":             testEtcdctlInterop,
				"PreflightAgainUnderTheLock":     testPreflightAgain,
			} {
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					f(t, s, cli)
				})
			}
		})
	}
}

// awaitGone blocks until process pid has ended, through a pidfd: the
// kernel says when, no polling of /proc.
func awaitGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH {
		return // already gone and reaped
	}
	if err != nil {
		t.Fatalf("pidfd_open %d: %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(waitLimit/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd: %v", err)
		}
		if n == 0 {
			t.Fatalf("process %d still runs %s after its helper died", pid, waitLimit)
		}
		return
	}
}

func holdRecord(t *testing.T, cli *clientv3.Client, key string) map[string]any {
	t.Helper()
	v, ok := getKey(t, cli, key)
	if !ok {
		t.Fatalf("no hold at %s", key)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		t.Fatalf("hold %s: %v", v, err)
	}
	return rec
}

// SIGKILL of the helper mid-command (confd's timeout kill, OOM): the
// command must die with it, before the next host can take the lock.
// Its own children (here a background sleep, like a service it launched)
// go too.
func testHelperKilled(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	g := newGate(t, dir, "killed")
	childFile := filepath.Join(dir, "child")
	a := bin(t, env(s), lockArgs("killed", "--host", "victim", "--ttl", "2", "--", "sh", "-c", fmt.Sprintf("sleep 300 & echo $! > %q; %s", childFile, g.script()))...)
	pid := g.awaitReady(t)
	data, err := os.ReadFile(childFile)
	if err != nil {
		t.Fatal(err)
	}
	child, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	a.signal(t, syscall.SIGKILL)
	a.wait(t)
	awaitGone(t, pid)
	awaitGone(t, child)

	// Its restart intent outlives it (issue 34 point 5): once its lock
	// lease is gone (TTL 2 s), another host's run queues, takes the lock and
	// refuses, naming the victim, running nothing; status shows the line
	// held. The victim's retry is not stopped by its own intent, and its
	// success clears it.
	ran := filepath.Join(dir, "other-ran")
	other := runBin(t, env(s), lockArgs("killed", "--host", "other", "--", "touch", ran)...)
	if other.code != codeHold || !strings.Contains(other.stderr.String(), "host victim") || !strings.Contains(other.stderr.String(), "died mid-restart") {
		t.Fatalf("other host after the victim's SIGKILL: exit %d, want %d naming the victim\n%s", other.code, codeHold, other.stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the other host ran its restart command under the orphaned intent")
	}
	if st := runBin(t, env(s), "--lock-name", "killed", "status"); st.code != codeHold || !strings.Contains(st.stdout.String(), "hold:    ACTIVE") || !strings.Contains(st.stdout.String(), "intent:  victim ORPHANED") {
		t.Fatalf("status: exit %d\n%s%s", st.code, st.stdout, st.stderr)
	}
	if retry := runBin(t, env(s), lockArgs("killed", "--host", "victim", "--", "true")...); retry.code != codeOK {
		t.Fatalf("the victim's retry: exit %d, want %d\n%s", retry.code, codeOK, retry.stderr)
	}
	if again := runBin(t, env(s), lockArgs("killed", "--host", "other", "--", "touch", ran)...); again.code != codeOK {
		t.Fatalf("other host after the victim's retry: exit %d\n%s", again.code, again.stderr)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("the other host's restart did not run: %v", err)
	}
}

// SIGHUP and SIGQUIT are handled like SIGTERM: the running command is let
// finish, the gate skipped, a hold written, the lock released.
func testHangupAndQuit(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT} {
		name := "sig" + strings.ToLower(sig.String()[:3]) + fmt.Sprint(int(sig))
		g := newGate(t, t.TempDir(), name)
		a := bin(t, env(s), lockArgs(name, "--", "sh", "-c", g.script())...)
		g.awaitReady(t)
		a.signal(t, sig)
		a.stderr.waitFor(t, "interrupted while the restart command runs")
		g.release(t)
		if code := a.wait(t); code != codeInterrupted {
			t.Fatalf("%s: exit %d, want %d", sig, code, codeInterrupted)
		}
		if rec := holdRecord(t, cli, name+"-hold"); !strings.Contains(fmt.Sprint(rec["reason"]), "interrupted") {
			t.Fatalf("%s: hold %v", sig, rec)
		}
		if keys := queueKeys(t, cli, name); len(keys) != 0 {
			t.Fatalf("%s: lock not released: %v", sig, keys)
		}
	}
}

// A second SIGTERM stops the command at once.
func testSecondSignal(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	g := newGate(t, t.TempDir(), "force")
	a := bin(t, env(s), lockArgs("force", "--", "sh", "-c", g.script())...)
	pid := g.awaitReady(t)
	a.signal(t, syscall.SIGTERM)
	a.stderr.waitFor(t, "interrupted while the restart command runs")
	a.signal(t, syscall.SIGTERM)
	awaitGone(t, pid)
	if code := a.wait(t); code != codeInterrupted {
		t.Fatalf("exit %d, want %d", code, codeInterrupted)
	}
	if rec := holdRecord(t, cli, "force-hold"); !strings.Contains(fmt.Sprint(rec["reason"]), "second signal") {
		t.Fatalf("hold %v", rec)
	}
}

// A helper cut from etcd while it waits for the apiserver: the next host
// may take the lock, so this one must stop the line, once etcd is back.
func testLeaseLostDuringGate(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	h := newHealthServer(t, http.StatusServiceUnavailable)
	proxy := etcdtest.NewProxy(t, s.Endpoint)
	a := bin(t, env(s), append(lockArgs("gatecut", "--endpoints", proxy.Endpoint(), "--ttl", "2", "--dial-timeout", "500ms",
		"--command-timeout", "1s"), append(h.args(), "--", "true")...)...)
	a.stderr.waitFor(t, "holding the lock until the apiserver is ready")
	h.awaitProbes(t, h.probes.Load()+2)
	proxy.Cut()
	a.stderr.waitFor(t, "LOCK LOST while waiting for the apiserver")
	a.stderr.waitFor(t, "cannot write the hold")
	proxy.Restore()
	if code := a.wait(t); code != codeLeaseLost {
		t.Fatalf("exit %d, want %d", code, codeLeaseLost)
	}
	if rec := holdRecord(t, cli, "gatecut-hold"); !strings.Contains(fmt.Sprint(rec["reason"]), "lock lost while waiting for the apiserver") {
		t.Fatalf("hold %v", rec)
	}
}

// A health CA that does not sign the running apiserver's certificate: the
// gate could never pass, so nothing is locked, restarted or held.
func testWrongHealthCA(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	h := newHealthServer(t, http.StatusOK)
	wrong := writeFile(t, filepath.Join(t.TempDir(), "other-ca.pem"), etcdtest.NewCA(t, "not the apiserver's CA").PEM)
	runs := filepath.Join(t.TempDir(), "runs")
	args := append(lockArgs("wrongca"), h.args()...)
	for i, a := range args {
		if a == "--health-cacert" {
			args[i+1] = wrong
		}
	}
	p := runBin(t, env(s), append(args, "--", "sh", "-c", "echo run >> "+runs)...)
	if p.code != codePreflight {
		t.Fatalf("exit %d, want %d", p.code, codePreflight)
	}
	if _, err := os.Stat(runs); err == nil {
		t.Fatal("the command ran")
	}
	if !strings.Contains(p.stderr.String(), "certificate") {
		t.Fatalf("stderr does not say why:\n%s", p.stderr)
	}
	if _, ok := getKey(t, cli, "wrongca-hold"); ok {
		t.Fatal("hold written")
	}
	if keys := queueKeys(t, cli, "wrongca"); len(keys) != 0 {
		t.Fatalf("lock touched: %v", keys)
	}
}

// An operator's hold and its reason survive a failed run (--ignore-hold):
// the failure is kept beside it.
func testHoldNeverOverwritten(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	if p := runBin(t, env(s), "--lock-name", "keep", "hold", "--reason", "maintenance window"); p.code != codeOK {
		t.Fatalf("hold: exit %d\n%s", p.code, p.stderr)
	}
	if p := runBin(t, env(s), lockArgs("keep", "--ignore-hold", "--attempts", "1", "--", "false")...); p.code != codeRestart {
		t.Fatalf("exit %d, want %d", p.code, codeRestart)
	}
	if p := runBin(t, env(s), "--lock-name", "keep", "hold", "--reason", "second operator"); p.code != codeOK {
		t.Fatalf("hold: exit %d\n%s", p.code, p.stderr)
	}
	rec := holdRecord(t, cli, "keep-hold")
	also, _ := rec["also"].([]any)
	if rec["reason"] != "maintenance window" || len(also) != 2 ||
		!strings.Contains(fmt.Sprint(also[0]), "false") || !strings.Contains(fmt.Sprint(also[1]), "second operator") {
		t.Fatalf("hold overwritten: %v", rec)
	}
	st := runBin(t, env(s), "--lock-name", "keep", "status")
	if !strings.Contains(st.stdout.String(), "maintenance window") {
		t.Fatalf("status does not show the first reason:\n%s", st.stdout)
	}
}

// Deleting the holder's key hands the lock on: the holder takes that as
// lock loss, stops its command, and (the command having run) stops the line.
func testLockKeyDeleted(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	g := newGate(t, t.TempDir(), "delkey")
	a := bin(t, env(s), lockArgs("delkey", "--", "sh", "-c", g.script())...)
	pid := g.awaitReady(t)
	key := queueKeys(t, cli, "delkey")[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	awaitGone(t, pid)
	if code := a.wait(t); code != codeLeaseLost {
		t.Fatalf("exit %d, want %d", code, codeLeaseLost)
	}
	if rec := holdRecord(t, cli, "delkey-hold"); !strings.Contains(fmt.Sprint(rec["reason"]), "lock lost") {
		t.Fatalf("hold %v", rec)
	}
}

// The helper and this server version's etcdctl exclude each other.
func testEtcdctlInterop(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	g := newGate(t, t.TempDir(), "interop")
	ctl := startProc(t, env(s), s.Tool(t, "etcdctl"), "lock", "interopv", "--", "sh", "-c", g.script())
	g.awaitReady(t)
	ran := filepath.Join(t.TempDir(), "ran")
	b := bin(t, env(s), lockArgs("interopv", "--", "touch", ran)...)
	waitQueue(t, cli, "interopv", 2)
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("ran while etcdctl held the lock")
	}
	g.release(t)
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	if code := b.wait(t); code != codeOK {
		t.Fatalf("exit %d", code)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatal("never ran")
	}
}

// A file that breaks while the helper waits in the queue is caught by the
// preflight that runs again once the lock is held: nothing runs, no hold.
func testPreflightAgain(t *testing.T, s *etcdtest.Server, cli *clientv3.Client) {
	dir := t.TempDir()
	ca := etcdtest.NewCA(t, "preflight again")
	file := writeFile(t, filepath.Join(dir, "ca.pem"), ca.PEM)
	g := newGate(t, dir, "pfa")
	ctl := startProc(t, env(s), s.Tool(t, "etcdctl"), "lock", "pfa", "--", "sh", "-c", g.script())
	g.awaitReady(t)
	ran := filepath.Join(dir, "ran")
	b := bin(t, env(s), lockArgs("pfa", "--preflight-file", file, "--", "touch", ran)...)
	waitQueue(t, cli, "pfa", 2)
	writeFile(t, file, append([]byte("\xef\xbb\xbf"), ca.PEM...))
	g.release(t)
	if code := ctl.wait(t); code != 0 {
		t.Fatalf("etcdctl exit %d", code)
	}
	if code := b.wait(t); code != codePreflight {
		t.Fatalf("exit %d, want %d\n%s", code, codePreflight, b.stderr)
	}
	if !strings.Contains(b.stderr.String(), "ca.pem: line 1") {
		t.Fatalf("stderr does not name the file and line:\n%s", b.stderr)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the command ran")
	}
	if _, ok := getKey(t, cli, "pfa-hold"); ok {
		t.Fatal("hold written although nothing ran")
	}
	if keys := queueKeys(t, cli, "pfa"); len(keys) != 0 {
		t.Fatalf("lock not released: %v", keys)
	}
}
