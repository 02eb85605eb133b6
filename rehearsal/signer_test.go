//go:build rehearsal

package rehearsal

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// signerUnit is the shipped unit of kube-apiserver-sa-signer.
const signerUnit = "kube-apiserver-sa-signer.service"

// signerEndpoint is the flag docs/signer.md gives the apiserver in place
// of its two key-file flags (the unit's --socket).
const signerEndpoint = "--service-account-signing-endpoint=/run/kube-apiserver-sa-signer/signer.sock"

// signer moves every master from bundle mode to the external signer, one
// at a time as docs/signer.md says (the fleet mixed after the first), then
// rotates m1's key with `rotate-key --signer` under the token probe (no
// apiserver restart, no refusal), retires the old key after the grace,
// SIGKILLs m2's signer (its unit's Restart= brings it back) and restarts
// m3 through the helper once more, its bundle now stale.
func (f *fleet) signer(t *testing.T) {
	for _, h := range f.hosts {
		before := f.restarts()
		h.moveToSigner(t)
		f.assertRestartedOnce(t, "moving "+h.name, before, h)
		f.assertAllTokensAccepted(t) // mixed fleet until the last move
		if t.Failed() {
			t.FailNow()
		}
	}
	f.signerRotation(t)
	f.signerKilled(t, f.hosts[1])
	f.signerHostRestart(t, f.hosts[2])
}

// moveToSigner is docs/signer.md's "Moving one master at a time" on a
// binary master running the shipped confd resources.
func (h *host) moveToSigner(t *testing.T) {
	t.Helper()
	// 1. Start the signer; it serves at once and says so.
	if code, out := h.systemctl(t, "start", signerUnit); code != 0 {
		t.Fatalf("%s: systemctl start %s: exit %d\n%s\n%s", h.name, signerUnit, code, out, tail(string(h.read("/var/log/kube-apiserver-sa-signer.log")), 4000))
	}
	h.f.await(t, 30*time.Second, h.name+"'s signer log saying \"published keys read from etcd\"", func() bool {
		return strings.Contains(string(h.read("/var/log/kube-apiserver-sa-signer.log")), "published keys read from etcd")
	})
	// 2. confd stops managing the apiserver's key flags and bundle on this
	// host, before the flags change (10- would render the key-file flags
	// back at the next key change, 20- would restart the apiserver): both
	// resources go, and confd, with nothing left to render (it refuses an
	// empty conf.d), is stopped and disabled.
	for _, r := range []string{"10-apiserver-sa-flags.toml", "20-sa-bundle.toml"} {
		if err := os.Remove(h.Path("/etc/confd/conf.d/" + r)); err != nil {
			t.Fatal(err)
		}
	}
	h.stopConfd(t)
	// 3. The endpoint replaces both key-file flags; the apiserver is
	// ordered after the signer; one restart through the helper (the
	// shipped kube-apiserver-safe-restart.service: lock, preflight asking
	// the signer, trust gate, health gate).
	h.write("/etc/kubernetes/apiserver-sa.env", h.Rewrite(`KUBE_APISERVER_SA_ARGS="`+signerEndpoint+`"`+"\n"), 0o644)
	h.write("/etc/systemd/system/kube-apiserver.service.d/30-sa-signer.conf",
		"[Unit]\nAfter=kube-apiserver-sa-signer.service\nWants=kube-apiserver-sa-signer.service\n", 0o644)
	if code, out := h.runUnit(t, "kube-apiserver-safe-restart.service", nil); code != 0 {
		t.Fatalf("%s: kube-apiserver-safe-restart.service: exit %d\n%s", h.name, code, tail(out, 6000))
	}
	args, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", h.systemd.mainPID()))
	if err != nil || !slices.Contains(strings.Split(string(args), "\x00"), h.Rewrite(signerEndpoint)) {
		t.Fatalf("%s: the apiserver does not run with %s (%v): %q", h.name, signerEndpoint, err, args)
	}
	// 4. The bundle is no longer kept current: the health gate of later
	// restarts must not compare the apiserver's keys with it.
	toml := string(h.read(configPath))
	line := regexp.MustCompile(`(?m)^jwks-key-file\s*=.*\n`)
	if !line.MatchString(toml) {
		t.Fatalf("%s: %s has no jwks-key-file line", h.name, configPath)
	}
	h.write(configPath, line.ReplaceAllString(toml, ""), 0o644)
}

// signerHostRestart restarts h, a signer master whose bundle is stale
// (keys rotated and retired since confd stopped), through the shipped
// kube-apiserver-safe-restart.service: exit 0, one restart, 9 of 9.
func (f *fleet) signerHostRestart(t *testing.T, h *host) {
	t.Helper()
	before := f.restarts()
	if code, out := h.runUnit(t, "kube-apiserver-safe-restart.service", nil); code != 0 {
		t.Fatalf("%s: kube-apiserver-safe-restart.service on a signer host: exit %d\n%s", h.name, code, tail(out, 6000))
	}
	f.assertRestartedOnce(t, h.name+"'s restart", before, h)
	f.assertAllTokensAccepted(t)
}

// assertRestartedOnce fails unless h's apiserver was started once since
// before and no other.
func (f *fleet) assertRestartedOnce(t *testing.T, during string, before []int64, h *host) {
	t.Helper()
	after := f.restarts()
	for i := range after {
		want := before[i]
		if f.hosts[i] == h {
			want++
		}
		if after[i] != want {
			t.Errorf("%s: %s restarted %d times", during, f.hosts[i].name, after[i]-before[i])
		}
	}
}

// systemctl runs the host's systemctl, as an operator would.
func (h *host) systemctl(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(h.Path("/bin/systemctl"), args...)
	cmd.Env = h.baseEnv()
	out, err := cmd.CombinedOutput()
	return exitCode(err), string(out)
}

// siteArgs is the site's helper flags as its units run them: the shipped
// kube-apiserver-safe-restart.service's ExecStart arguments (the
// configuration file and $SAFE_RESTART_ARGS).
func (h *host) siteArgs(t *testing.T) []string {
	t.Helper()
	_, _, argv, logf, err := h.unitExec("kube-apiserver-safe-restart.service")
	if err != nil {
		t.Fatal(err)
	}
	logf.Close()
	return argv[1:]
}

// apiserverPIDs is every host's running apiserver.
func (f *fleet) apiserverPIDs() []int {
	var pids []int
	for _, h := range f.hosts {
		pids = append(pids, h.systemd.mainPID())
	}
	return pids
}

// signerRotation is `rotate-key --signer` on m1 while the token probe runs:
// exit 0, no refusal, no apiserver (or signer) restart, m1 signing with
// the new key; then `retire-keys` after the grace: the old kid refused
// everywhere, the new one accepted.
func (f *fleet) signerRotation(t *testing.T) {
	m1 := f.hosts[0]
	oldTok := f.token(t, m1)
	old := tokenKid(oldTok)
	if old != m1.signingKid(t) {
		t.Fatalf("m1 signs with %s, its sa.key is %s", old, m1.signingKid(t))
	}
	pids, restarts := f.apiserverPIDs(), f.restarts()
	signerStarts := m1.systemd.service(signerUnit).starts.Load()
	probe := f.startTokenProbe(t)
	// When m1's tokens first carry another kid, polled 4 times a second
	// (the probe's rounds are a second apart).
	switched := make(chan time.Time, 1)
	stopWatch := make(chan struct{})
	go func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if tok, err := f.tryToken(m1); err == nil && tokenKid(tok) != old {
				switched <- time.Now()
				return
			}
		}
	}()
	start := time.Now()
	code, out := m1.helper(t, append([]string{"rotate-key", "--signer", "--signing-key", m1.Path("/etc/kubernetes/pki/sa.key"),
		"--public-key", m1.Path("/etc/kubernetes/pki/sa.pub"), "--timeout", "2m", "--trust-timeout", "2m", "--grace", "20s"}, m1.siteArgs(t)...)...)
	took := time.Since(start)
	if code != 0 {
		close(stopWatch)
		probe.finish(t)
		t.Fatalf("m1: rotate-key --signer: exit %d\n%s\nsigner:\n%s", code, tail(out, 6000), tail(string(m1.read("/var/log/kube-apiserver-sa-signer.log")), 4000))
	}
	next := m1.signingKid(t)
	if next == old {
		t.Fatalf("m1's sa.key is %s after rotate-key --signer, as before", old)
	}
	select {
	case at := <-switched:
		t.Logf("rotate-key --signer: exit 0 after %s; m1's tokens carry the new kid %s after %s", took.Round(100*time.Millisecond), next, at.Sub(start).Round(100*time.Millisecond))
	case <-time.After(30 * time.Second):
		close(stopWatch)
		t.Fatalf("m1 still signs with %s 30 s after rotate-key --signer exited 0", old)
	}
	if got := tokenKid(f.token(t, m1)); got != next {
		t.Errorf("m1's token carries %s after rotate-key --signer, want %s", got, next)
	}
	f.await(t, time.Minute, "a token signed with m1's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m1.name, next) })
	probe.finish(t)
	f.assertNoRestarts(t, "rotate-key --signer", pids, restarts)
	if n := m1.systemd.service(signerUnit).starts.Load() - signerStarts; n != 0 {
		t.Errorf("rotate-key --signer restarted m1's signer %d times, want a reload", n)
	}

	// Retire after the grace: every signer withdraws the old key, every
	// apiserver refuses it within its refresh hint, still no restart.
	st := f.rotationRecord(t, m1)
	if st == nil {
		t.Fatal("m1: no rotation state after rotate-key --signer")
	}
	time.Sleep(time.Until(st.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	newTok := f.token(t, m1)
	if code, out := m1.retireKeys(t); code != 0 {
		t.Fatalf("m1: retire-keys: exit %d\n%s", code, tail(out, 6000))
	}
	if slices.Contains(f.publishedKids(t), old) {
		t.Fatal("the old key is still published after retire-keys")
	}
	retired := time.Now()
	for _, h := range f.hosts {
		f.await(t, time.Minute, h.name+" refusing the retired kid "+old, func() bool { return !f.review(t, h, oldTok) })
		if !f.review(t, h, newTok) {
			t.Errorf("%s refused m1's token with the new kid %s after retire-keys", h.name, next)
		}
	}
	t.Logf("retire-keys: the old kid refused by every apiserver %s after it exited", time.Since(retired).Round(100*time.Millisecond))
	f.assertNoRestarts(t, "retire-keys", pids, restarts)
	m1.sa = m1.installedSAKey(t)
}

// assertNoRestarts fails unless every apiserver still runs as pids and
// the stand-in systemd started none since restarts.
func (f *fleet) assertNoRestarts(t *testing.T, during string, pids []int, restarts []int64) {
	t.Helper()
	now, nowRestarts := f.apiserverPIDs(), f.restarts()
	for i, h := range f.hosts {
		if now[i] != pids[i] || nowRestarts[i] != restarts[i] {
			t.Errorf("%s: %s's apiserver restarted (pid %d -> %d, %d starts)", during, h.name, pids[i], now[i], nowRestarts[i]-restarts[i])
		}
	}
}

// signerKilled SIGKILLs victim's signer: its apiserver's token requests
// fail (an error, or no answer within 10 s) while it is down, the other
// masters' do not; the stand-in systemd starts it again as the unit's
// Restart= and RestartSec= say; victim issues tokens again, 9 of 9.
func (f *fleet) signerKilled(t *testing.T, victim *host) {
	u := victim.unit(t, signerUnit)
	delay, err := restartSec(u.Settings["RestartSec"])
	if err != nil || u.Settings["Restart"] != "always" {
		t.Fatalf("%s: Restart=%s RestartSec=%s (%v): the scenario wants Restart=always", signerUnit, u.Settings["Restart"], u.Settings["RestartSec"], err)
	}
	svc := victim.systemd.service(signerUnit)
	pids, restarts := f.apiserverPIDs(), f.restarts()
	starts := svc.starts.Load()
	_, pid := svc.started()
	impatient := *f.admin
	impatient.Timeout = 10 * time.Second
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// While it is down (RestartSec, then its start): one request to
	// each master at once.
	type answer struct {
		h   *host
		tok string
		err error
		at  time.Time
	}
	answers := make(chan answer, len(f.hosts))
	for _, h := range f.hosts {
		go func() {
			tok, err := tryTokenWith(&impatient, h)
			answers <- answer{h, tok, err, time.Now()}
		}()
	}
	var got []answer
	for range f.hosts {
		got = append(got, <-answers)
	}
	f.await(t, time.Minute, victim.name+"'s signer started again by Restart=", func() bool {
		_, now := svc.started()
		return svc.starts.Load() == starts+1 && now != 0 && now != pid
	})
	backAt, _ := svc.started()
	back := backAt.Sub(killed)
	if back < delay {
		t.Errorf("%s's signer started again %s after it was killed, before RestartSec=%s", victim.name, back, delay)
	}
	// The apiserver may hold a TokenRequest while its signer's socket is
	// dead and answer it once a new signer runs: no token may come before
	// the new process was started.
	for _, a := range got {
		switch {
		case a.h == victim && a.err == nil && a.at.Before(backAt):
			t.Errorf("%s issued a token (kid %s) %s after its signer was SIGKILLed, before it was back", a.h.name, tokenKid(a.tok), a.at.Sub(killed).Round(time.Millisecond))
		case a.h == victim && a.err == nil:
			t.Logf("%s's TokenRequest sent with its signer down: answered only once it was back (%s after the kill)", a.h.name, a.at.Sub(killed).Round(time.Millisecond))
		case a.h == victim:
			t.Logf("%s's TokenRequest with its signer down: %v (after %s)", a.h.name, a.err, a.at.Sub(killed).Round(time.Millisecond))
		case a.err != nil:
			t.Errorf("%s affected by %s's signer being down: %v", a.h.name, victim.name, a.err)
		default:
			t.Logf("%s issued a token with %s's signer down (%s after the kill)", a.h.name, victim.name, a.at.Sub(killed).Round(time.Millisecond))
		}
	}
	var tok string
	f.await(t, time.Minute, victim.name+" issuing tokens again", func() bool {
		tok, err = f.tryToken(victim)
		return err == nil
	})
	t.Logf("%s's signer SIGKILLed: started again after %s (RestartSec=%s), tokens issued again after %s", victim.name, back.Round(time.Millisecond), delay, time.Since(killed).Round(time.Millisecond))
	for _, h := range f.hosts {
		if !f.review(t, h, tok) {
			t.Errorf("%s refused %s's token after its signer came back", h.name, victim.name)
		}
	}
	f.assertAllTokensAccepted(t)
	f.assertNoRestarts(t, "the signer's SIGKILL", pids, restarts)
}
