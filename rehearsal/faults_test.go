//go:build rehearsal

package rehearsal

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// bundleRefusals counts the bundle updates a host's confd refused: by its
// check_cmd, or already in the template (publicKeys fails the render on a
// private key or a certificate, so such a value is never even staged).
func bundleRefusals(l *logBuf) int {
	return l.count("check_cmd failed", "sa-bundle.pem") + l.count("20-sa-bundle.toml", "publicKeys:")
}

// bundlesChangedSince takes every host's live bundle and the restart
// counts now; the func it returns says what changed since ("" when
// nothing did).
func (f *fleet) bundlesChangedSince() func() string {
	live := map[string]string{}
	for _, h := range f.hosts {
		live[h.name] = string(h.read("/etc/kubernetes/pki/sa-bundle.pem"))
	}
	before := f.restarts()
	return func() string {
		for _, h := range f.hosts {
			if string(h.read("/etc/kubernetes/pki/sa-bundle.pem")) != live[h.name] {
				return h.name + ": live bundle changed"
			}
		}
		if after := f.restarts(); fmt.Sprint(after) != fmt.Sprint(before) {
			return fmt.Sprintf("restarts %v -> %v", before, after)
		}
		return ""
	}
}

// badKeys publishes keys kube-apiserver would misread or must never see;
// each is refused by every host's check_cmd: live bundles stay byte for
// byte, nothing restarts. Removing it brings nothing back either.
func (f *fleet) badKeys(t *testing.T) {
	other := newSAKey(t)
	bad := []struct{ name, value string }{
		{"private-key", string(other.private)},
		{"byte-order-mark", "\xef\xbb\xbf" + string(other.public)},
		{"leading-space", "  " + string(other.public)},
		{"garbage", "-----BEGIN PUBLIC KEY-----\nZ2FyYmFnZQ==\n-----END PUBLIC KEY-----\n"},
		// Not here: a certificate. It is key material (publicKeys renders
		// its public key), as kube-apiserver takes it.
	}
	key := keyPrefix + "zz-bad.fleet.test"
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			refused := map[string]int{}
			for _, h := range f.hosts {
				refused[h.name] = bundleRefusals(h.confd.out)
			}
			changed := f.bundlesChangedSince()
			f.put(t, key, b.value)
			// Two refusals after the put: at most one check can have started
			// before it, so the second saw this key (confd retries a refused
			// render after 0.5 s).
			f.await(t, 2*time.Minute, "refused on every host", func() bool {
				if changed() != "" {
					return true
				}
				for _, h := range f.hosts {
					if bundleRefusals(h.confd.out) < refused[h.name]+2 {
						return false
					}
				}
				return true
			})
			if why := changed(); why != "" {
				t.Errorf("%s key accepted: %s", b.name, why)
			}
			f.del(t, key)
			f.await(t, time.Minute, "flag files without the bad key", func() bool {
				for _, h := range f.hosts {
					if strings.Contains(string(h.read("/etc/kubernetes/apiserver-sa.env")), "zz-bad") {
						return false
					}
				}
				return true
			})
			if t.Failed() {
				f.recover(t)
			} else if why := changed(); why != "" {
				t.Errorf("after removing the %s key: %s", b.name, why)
			}
		})
	}
}

// ownKeyMissing: one master's key disappears from etcd. Its own check
// refuses the bundle that lacks it (its apiserver would refuse the tokens
// it signs), so its live bundle stays and it does not restart; the others
// refuse it too, for its trust record (deleted-live-key). Its publisher is
// stopped first (running, it would publish the key again at once);
// started again, it brings the fleet back.
func (f *fleet) ownKeyMissing(t *testing.T) {
	h := f.hosts[2]
	live := h.read("/etc/kubernetes/pki/sa-bundle.pem")
	refused := h.confd.out.count("check_cmd failed", "sa-bundle.pem")
	before := h.systemd.restarts.Load()
	h.unitCtl(t, "stop", publisherUnit)
	f.del(t, keyPrefix+h.name)
	f.await(t, 2*time.Minute, h.name+" refusing a bundle without its own key", func() bool {
		return h.confd.out.count("check_cmd failed", "sa-bundle.pem") >= refused+2 ||
			string(h.read("/etc/kubernetes/pki/sa-bundle.pem")) != string(live)
	})
	if string(h.read("/etc/kubernetes/pki/sa-bundle.pem")) != string(live) {
		t.Errorf("%s: a bundle without its own key went live", h.name)
	}
	if n := h.systemd.restarts.Load(); n != before {
		t.Errorf("%s restarted %d times without its own key", h.name, n-before)
	}
	h.unitCtl(t, "start", publisherUnit)
	f.awaitConverged(t, 5*time.Minute)
	f.assertAllTokensAccepted(t)
}

// deletedLiveKey: a live master's key deleted from etcd with the client, as
// an `etcdctl del` by mistake would (issue 31.3). Its trust record says its
// apiserver signs with that key, so every host's check_cmd refuses the
// bundle without it, naming the master and the key: no apiserver's bundle
// drops it, nothing restarts. The victim's publisher is stopped meanwhile
// (running, it would publish the key again at once); the key is put back,
// the publisher started again, and the fleet is converged again. Then the
// same delete with the publisher running: the key is back by itself.
func (f *fleet) deletedLiveKey(t *testing.T) {
	victim := f.hosts[1]
	victim.unitCtl(t, "stop", publisherUnit)
	key := keyPrefix + victim.name
	value, ok := f.etcdKeys(t, key)[key]
	if !ok {
		t.Fatalf("%s publishes no key at %s", victim.name, key)
	}
	refused := map[string]int{}
	naming := func(h *host) int {
		return h.confd.out.count("check_cmd failed", "sa-bundle.pem", victim.name, victim.sa.kid)
	}
	for _, h := range f.hosts {
		refused[h.name] = naming(h)
	}
	dropped := f.bundlesChangedSince()
	f.del(t, key)
	// Two refusals naming the key after the delete: at most one check can
	// have started before it, so the second saw the bundle without it.
	f.await(t, 2*time.Minute, "a bundle without "+victim.name+"'s key refused on every host", func() bool {
		if dropped() != "" {
			return true
		}
		for _, h := range f.hosts {
			if naming(h) < refused[h.name]+2 {
				return false
			}
		}
		return true
	})
	if why := dropped(); why != "" {
		t.Errorf("%s's live signing key %s dropped: %s", victim.name, victim.sa.kid, why)
	}
	f.put(t, key, value)
	victim.unitCtl(t, "start", publisherUnit)
	f.awaitConverged(t, 5*time.Minute)
	if t.Failed() {
		f.recover(t)
		return
	}
	if why := dropped(); why != "" {
		t.Errorf("after restoring the key: %s", why)
		return
	}

	// The same mistake with the victim's publisher running: it publishes
	// the key again by itself (within its 30 s reconcile interval; at once
	// when etcd's watch tells it), no bundle drops it, nothing restarts.
	alive := "/kubernetes/service-account-keys-rotation/" + victim.name + "/alive"
	f.await(t, time.Minute, victim.name+"'s publisher running", func() bool {
		_, ok := f.etcdKeys(t, alive)[alive]
		return ok
	})
	deleted := time.Now()
	f.del(t, key)
	f.await(t, time.Minute, victim.name+"'s key published again by its publisher", func() bool {
		_, ok := f.etcdKeys(t, key)[key]
		return ok
	})
	t.Logf("%s's key deleted with its publisher running: published again after %s", victim.name, time.Since(deleted).Round(time.Millisecond))
	f.awaitConverged(t, 5*time.Minute)
	if why := dropped(); why != "" {
		t.Errorf("after the publisher put the key back: %s", why)
	}
}

// recover puts the fleet back after a scenario failed: no hold, converged.
func (f *fleet) recover(t *testing.T) {
	t.Helper()
	if _, ok := f.hold(t); ok {
		if code, out := f.hosts[0].helper(t, "unhold"); code != 0 {
			t.Fatalf("unhold exited %d: %s", code, out)
		}
	}
	f.awaitConverged(t, 5*time.Minute)
}

// holdAndUnhold: one host's apiserver never becomes ready after its
// restart (its base flags point at an etcd that is not there). Its helper
// stops the line with a hold naming it; no later host restarts. The
// operator fixes the host, restarts it once past the hold, and `unhold`
// lets the rest of the fleet through.
func (f *fleet) holdAndUnhold(t *testing.T) {
	broken := f.hosts[2]
	nowhere := strings.Replace(f.etcd.Endpoint, "127.0.0.1:", "127.0.0.1:1", 1) // a port nobody serves
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(nowhere, "https://"), time.Second); err == nil {
		t.Fatalf("%s unexpectedly serves", nowhere)
	}
	broken.writeAPIServerEnv(nowhere)
	defer broken.writeAPIServerEnv(exampleEtcdURL)
	failed := map[string]int{}
	for _, h := range f.hosts {
		failed[h.name] = h.confd.out.count("reload_cmd failed")
	}
	f.put(t, keyPrefix+"m5.fleet.test", string(newSAKey(t).public))
	f.await(t, 5*time.Minute, "a hold", func() bool { _, ok := f.hold(t); return ok })
	rec, _ := f.hold(t)
	// Every host here has the machine's host name; the reason names the
	// apiserver that failed by its URL.
	if !strings.Contains(rec, broken.APIServerURL) {
		t.Errorf("hold record does not name %s's apiserver %s: %s", broken.name, broken.APIServerURL, rec)
	}
	// Every host still owing a restart tries and is refused by the hold.
	restarted := f.restarts()
	want := len(f.publishedKids(t))
	f.await(t, 2*time.Minute, "every other host restarted before the hold or refused by it", func() bool {
		for _, h := range f.hosts {
			if h == broken {
				continue
			}
			kids, err := f.jwksKids(h)
			if !(err == nil && len(kids) == want) && h.confd.out.count("reload_cmd failed") <= failed[h.name] {
				return false
			}
		}
		return true
	})
	if got := f.restarts(); fmt.Sprint(got) != fmt.Sprint(restarted) {
		t.Errorf("restarts while the hold stood: %v -> %v", restarted, got)
	}
	if f.tl.isReady(broken.name) {
		t.Errorf("%s ready with its etcd gone?", broken.name)
	}
	// The operator's way back: fix, restart this host past the hold, unhold.
	broken.writeAPIServerEnv(exampleEtcdURL)
	code, out := broken.runUnit(t, "kube-apiserver-safe-restart.service", func(argv []string) []string {
		if strings.HasSuffix(argv[0], "kube-apiserver-safe-restart") {
			return append(argv, "--ignore-hold")
		}
		return argv
	})
	if code != 0 {
		t.Fatalf("kube-apiserver-safe-restart.service --ignore-hold on %s exited %d:\n%s", broken.name, code, out)
	}
	if code, out := broken.helper(t, "unhold"); code != 0 {
		t.Fatalf("unhold exited %d: %s", code, out)
	}
	f.awaitConverged(t, 5*time.Minute)
	f.assertAllTokensAccepted(t)
}

// helperKilled SIGKILLs one host's helper while its restart command runs
// (the apiserver is stopped, not yet started). The command must die with
// the helper; the fleet converges without two apiservers down at once.
// The restart goes on in systemd, and the helper's restart intent outlives
// it (issue 34 point 5): until the victim's retry succeeds, another host's
// restart exits 4 naming the victim, where it used to restart as soon as
// the victim's lock lease expired, while the victim's apiserver might
// still be down.
func (f *fleet) helperKilled(t *testing.T) {
	victim, other := f.hosts[1], f.hosts[0]
	// The other host's restart queues behind the victim's lock before the
	// kill, so that it takes the lock once the dead helper's lease expires,
	// ahead of the victim's retry (confd's, queued after the kill): it
	// must meet the orphaned intent.
	blocked := &process{name: other.name + " kube-apiserver-safe-restart restart", out: newLogBuf(), done: make(chan struct{})}
	blocked.cmd = exec.Command(other.Path("/usr/local/bin/kube-apiserver-safe-restart"), other.withConfig(append([]string{"restart"}, other.restartFlags(t)...))...)
	blocked.cmd.Env, blocked.cmd.Stdout, blocked.cmd.Stderr = other.helperEnv(t), blocked.out, blocked.out
	blocked.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	defer func() {
		if blocked.cmd.Process != nil {
			select {
			case <-blocked.done:
			default:
				_ = syscall.Kill(-blocked.cmd.Process.Pid, syscall.SIGKILL)
				<-blocked.done
			}
		}
	}()
	outcome := victim.killHelperAtNextRestart("the helper's SIGKILL", func() string {
		if err := blocked.cmd.Start(); err != nil {
			close(blocked.done)
			return fmt.Sprintf("start %s: %v", blocked.name, err)
		}
		go func() { blocked.err = blocked.cmd.Wait(); close(blocked.done) }()
		if !blocked.out.waitFor("waiting for the lock", blocked.done, 2*time.Minute) {
			return fmt.Sprintf("%s never queued for the lock:\n%s", blocked.name, tail(blocked.out.String(), 4000))
		}
		return ""
	})
	f.put(t, keyPrefix+"m6.fleet.test", string(newSAKey(t).public))
	select {
	case msg := <-outcome:
		if msg != "" {
			t.Error(msg)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the victim's restart never came")
	}
	select {
	case <-blocked.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("%s still runs 3 minutes after the victim's SIGKILL:\n%s", blocked.name, tail(blocked.out.String(), 4000))
	}
	out := blocked.out.String()
	if code := exitCode(blocked.err); code != 4 || !strings.Contains(out, "host "+victim.name) || !strings.Contains(out, "died mid-restart") {
		t.Errorf("%s after %s's helper was killed: exit %d, want 4 naming %s:\n%s", blocked.name, victim.name, code, victim.name, tail(out, 4000))
	}
	f.awaitConverged(t, 5*time.Minute)
	if rec, ok := f.hold(t); ok {
		t.Errorf("hold after a killed helper's retry succeeded: %s", rec)
		f.recover(t)
	}
	if left := f.etcdKeys(t, holdKey+"/intent/"); len(left) != 0 {
		t.Errorf("restart intents left after the fleet converged: %v", left)
	}
}

// killHelperAtNextRestart SIGKILLs the helper behind h's next restart once
// systemd has stopped the old apiserver, after before (if any) returned ""
// (else what it returns is the outcome, and no helper is killed); the
// channel then says "" if the helper's systemctl exited within 15 s, or
// what went wrong.
func (h *host) killHelperAtNextRestart(what string, before func() string) <-chan string {
	outcome := make(chan string, 1)
	h.systemd.onNextRestart(func(phase string, caller int, conn net.Conn) {
		if phase != "stopped" {
			return
		}
		helper, err := helperOf(caller)
		if err != nil {
			outcome <- err.Error()
			return
		}
		if before != nil {
			if msg := before(); msg != "" {
				outcome <- msg
				return
			}
		}
		_ = syscall.Kill(helper, syscall.SIGKILL)
		outcome <- awaitHangUp(conn, 15*time.Second, what)
	})
	return outcome
}

// helperOf finds the kube-apiserver-safe-restart process that runs pid
// (directly or through its own __group-guard process).
func helperOf(pid int) (int, error) {
	for p, i := pid, 0; i < 4; i++ {
		parent, err := parentPID(p)
		if err != nil {
			return 0, fmt.Errorf("no helper above systemctl %d: %w", pid, err)
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", parent))
		if strings.Contains(string(cmdline), "kube-apiserver-safe-restart") && !strings.Contains(string(cmdline), "__group-guard") {
			return parent, nil
		}
		p = parent
	}
	return 0, fmt.Errorf("no kube-apiserver-safe-restart among systemctl %d's ancestors", pid)
}

// awaitHangUp waits until the caller on conn (the restart command, the
// host's systemctl) has exited; "" if it did within d.
func awaitHangUp(conn net.Conn, d time.Duration, after string) string {
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(d))
	_, err := conn.Read(make([]byte, 1))
	_ = conn.SetReadDeadline(time.Time{})
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Sprintf("the helper's restart command (systemctl) still runs %s after %s", d, after)
	}
	return ""
}

// reloadTimeout: confd's reload_cmd_timeout kills the helper while its
// restart command runs. The command must die with it. For this scenario
// only, the victim's 20-sa-bundle.toml has a 20 s timeout instead of 45m:
// the one edit of an example in the rehearsal besides paths, made so that
// the timeout can be seen in a test's time.
func (f *fleet) reloadTimeout(t *testing.T) {
	victim := f.hosts[2]
	res := "/etc/confd/conf.d/20-sa-bundle.toml"
	orig := string(victim.read(res))
	short := strings.Replace(orig, `reload_cmd_timeout = "45m"`, `reload_cmd_timeout = "20s"`, 1)
	if short == orig {
		t.Fatalf("%s has no reload_cmd_timeout = \"30m\"", res)
	}
	victim.stopConfd(t)
	victim.write(res, short, 0o644)
	victim.startConfd(t)
	defer func() {
		victim.stopConfd(t)
		victim.write(res, orig, 0o644)
		victim.startConfd(t)
	}()
	outcome := make(chan string, 1)
	victim.systemd.onNextRestart(func(phase string, caller int, conn net.Conn) {
		if phase == "stopped" {
			outcome <- awaitHangUp(conn, 50*time.Second, "confd's 20 s reload_cmd_timeout")
		}
	})
	timedOut := victim.confd.out.count("reload_cmd failed")
	f.del(t, keyPrefix+"m6.fleet.test")
	select {
	case msg := <-outcome:
		if msg != "" {
			t.Error(msg)
		}
	case <-time.After(5 * time.Minute):
		t.Fatal("the victim's restart never came")
	}
	f.await(t, time.Minute, "confd reporting the timeout", func() bool { return victim.confd.out.count("reload_cmd failed") > timedOut })
	f.awaitConverged(t, 5*time.Minute)
	if rec, ok := f.hold(t); ok {
		t.Logf("hold after confd's timeout kill: %s", rec)
		f.recover(t)
	}
}

// gateCut runs kube-apiserver-safe-restart.service on one host with its
// etcd link cut while the health gate waits for the new apiserver: the
// helper loses its lease (exit 8) and, once etcd answers again, a hold
// must be written, because an apiserver restarted under a lost lock is
// in an unknown state.
func (f *fleet) gateCut(t *testing.T) {
	victim := f.hosts[0]
	l := etcdtest.NewProxy(t, f.etcd.Endpoint)
	unit := "kube-apiserver-safe-restart.service"
	text := string(victim.read("/etc/systemd/system/" + unit))
	// etcd is in the configuration file; a flag beats it.
	cutUnit := strings.Replace(text, " --config ", " --endpoints "+l.Endpoint()+" --config ", 1)
	if cutUnit == text {
		t.Fatalf("%s does not read the configuration file", unit)
	}
	victim.write("/etc/systemd/system/"+unit, cutUnit, 0o644)
	defer victim.write("/etc/systemd/system/"+unit, text, 0o644)
	cut := make(chan struct{})
	victim.systemd.onNextRestart(func(phase string, caller int, conn net.Conn) {
		if phase == "done" { // systemctl returned: the helper is in its gate
			l.Cut()
			close(cut)
		}
	})
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		// A settle longer than the lease takes to be judged lost (TTL 10 s):
		// the gate is surely still waiting when the helper finds out.
		code, out := victim.runUnit(t, unit, func(argv []string) []string {
			if strings.HasSuffix(argv[0], "kube-apiserver-safe-restart") {
				return append(argv, "--health-settle=20s")
			}
			return argv
		})
		done <- result{code, out}
	}()
	select {
	case <-cut:
	case r := <-done:
		t.Fatalf("%s exited %d before its gate:\n%s", unit, r.code, r.out)
	}
	// Heal the partition after the lease is surely gone (TTL 10 s): a hold
	// must still be written by a helper that kept trying.
	select {
	case r := <-done:
		t.Logf("%s exited %d while cut", unit, r.code)
		l.Restore()
		f.checkGateCut(t, victim, r.code, r.out)
		return
	case <-time.After(15 * time.Second):
	}
	l.Restore()
	r := <-done
	f.checkGateCut(t, victim, r.code, r.out)
}

func (f *fleet) checkGateCut(t *testing.T, victim *host, code int, out string) {
	if code != 8 {
		t.Errorf("exit %d after losing the lease in the gate, want 8:\n%s", code, out)
	}
	rec, ok := f.hold(t)
	if !ok {
		t.Errorf("no hold after %s lost its lease during the gate:\n%s", victim.name, out)
	} else {
		t.Logf("hold: %s", rec)
	}
	if ok {
		if code, out := victim.helper(t, "unhold"); code != 0 {
			t.Fatalf("unhold exited %d: %s", code, out)
		}
	}
	f.awaitConverged(t, 5*time.Minute)
}

// wrongHealthCA: the unit's --health-cacert names a CA that did not sign
// the apiserver's certificate. The helper must find out before restarting:
// exit 3, the apiserver untouched, no hold.
func (f *fleet) wrongHealthCA(t *testing.T) {
	h := f.hosts[1]
	unit := "/etc/systemd/system/kube-apiserver-safe-restart.service"
	orig := string(h.read(unit))
	h.write("/etc/kubernetes/pki/other-ca.crt", string(newClusterCA(t).pem), 0o644)
	if !strings.Contains(string(h.read(configPath)), `health-cacert = "`+h.Path("/etc/kubernetes/pki/ca.crt")+`"`) {
		t.Fatalf("%s has no health-cacert for ca.crt", configPath)
	}
	// A flag beats the configuration file.
	wrong := strings.Replace(orig, " --config ", " --health-cacert "+h.Path("/etc/kubernetes/pki/other-ca.crt")+" --config ", 1)
	if wrong == orig {
		t.Fatalf("%s does not read the configuration file", unit)
	}
	h.write(unit, wrong, 0o644)
	defer h.write(unit, orig, 0o644)
	before := f.restarts()
	code, out := h.runUnit(t, "kube-apiserver-safe-restart.service", nil)
	if code != 3 {
		t.Errorf("wrong health CA: exit %d, want 3:\n%s", code, out)
	}
	if got := f.restarts(); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("restarted with a health CA that cannot work: %v -> %v", before, got)
	}
	if rec, ok := f.hold(t); ok {
		t.Errorf("hold written for a restart that never happened: %s", rec)
	}
	h.write(unit, orig, 0o644)
	f.recover(t)
}
