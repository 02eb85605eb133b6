//go:build rehearsal

package rehearsal

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keysync/confd/internal/pemcheck"
)

// tokenProbe is a client that keeps requesting tokens from every apiserver
// and presenting each to every apiserver, counting refusals. A refusal only
// counts when the verifier was ready before and after the request and was
// not restarted in between: a token refused by an apiserver still starting
// up says nothing about keys.
type tokenProbe struct {
	f        *fleet
	anon     *http.Client
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	accepted int
	refused  []string
	kids     map[string]map[string]int // signer -> kid -> tokens accepted everywhere
}

func (f *fleet) startTokenProbe(t *testing.T) *tokenProbe {
	f.ensureServiceAccount(t)
	p := &tokenProbe{f: f, anon: httpClient(t, f.ca.pem, nil, nil), stop: make(chan struct{}), done: make(chan struct{}), kids: map[string]map[string]int{}}
	go p.run()
	return p
}

func (p *tokenProbe) run() {
	defer close(p.done)
	// Paced: a round a second is still hundreds of checks per scenario, and
	// an unpaced client on a loaded 2-core machine slows the apiservers'
	// /readyz into timeouts that look like outages.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		for _, signer := range p.f.hosts {
			tok, err := p.f.tryToken(signer)
			if err != nil {
				continue // signer restarting
			}
			kid := tokenKid(tok)
			all := true
			for _, v := range p.f.hosts {
				gen, ready := p.f.tl.generation(v.name), p.f.tl.isReady(v.name)
				code, err := tryReview(p.anon, v, tok)
				stable := ready && p.f.tl.isReady(v.name) && gen == p.f.tl.generation(v.name)
				p.mu.Lock()
				switch {
				case err == nil && code == http.StatusCreated:
					p.accepted++
				case err == nil && code == http.StatusUnauthorized && stable:
					p.refused = append(p.refused, fmt.Sprintf("%s %s refused a token of %s (kid %s)", time.Now().Format(time.RFC3339Nano), v.name, signer.name, kid))
					all = false
				default:
					all = false
				}
				p.mu.Unlock()
			}
			if all {
				p.mu.Lock()
				if p.kids[signer.name] == nil {
					p.kids[signer.name] = map[string]int{}
				}
				p.kids[signer.name][kid]++
				p.mu.Unlock()
			}
		}
	}
}

// finish stops the probe and fails the test on any refusal.
func (p *tokenProbe) finish(t *testing.T) {
	t.Helper()
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.refused {
		t.Errorf("token refused: %s", r)
	}
	t.Logf("token probe: %d presentations accepted, %d refused; tokens accepted everywhere by signer and kid: %v", p.accepted, len(p.refused), p.kids)
	if p.accepted == 0 {
		t.Error("token probe: nothing was accepted at all")
	}
}

// acceptedEverywhere reports whether a token of signer with kid was
// accepted by every apiserver.
func (p *tokenProbe) acceptedEverywhere(signer, kid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kids[signer][kid] > 0
}

func tokenKid(tok string) string {
	head, _, _ := strings.Cut(tok, ".")
	data, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return "?"
	}
	var h struct {
		Kid string `json:"kid"`
	}
	_ = json.Unmarshal(data, &h)
	return h.Kid
}

// restartFlags are the flags of the shipped bundle resource's reload_cmd on
// h, as confd would run it there ({{.dest}} and $SAFE_RESTART_ARGS filled in).
func (h *host) restartFlags(t *testing.T) []string {
	t.Helper()
	toml := string(h.read("/etc/confd/conf.d/20-sa-bundle.toml"))
	m := regexp.MustCompile(`(?m)^reload_cmd\s*=\s*"(.*)"\s*$`).FindStringSubmatch(toml)
	if m == nil {
		t.Fatal("20-sa-bundle.toml has no reload_cmd")
	}
	line := strings.ReplaceAll(m[1], "{{.dest}}", h.Path("/etc/kubernetes/pki/sa-bundle.pem"))
	env, err := h.unit(t, "confd.service").Env(h.baseEnv())
	if err != nil {
		t.Fatal(err)
	}
	argv, _, err := Command(line, env)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(argv[0], "/kube-apiserver-safe-restart") {
		t.Fatalf("reload_cmd does not run the helper: %q", argv)
	}
	return argv[1:]
}

func (h *host) rotateKey(t *testing.T, more ...string) (int, string) {
	t.Helper()
	return h.helper(t, h.rotateKeyArgs(t, more...)...)
}

// rotateKeyArgs is rotate-key's command line on h: the shipped reload_cmd's
// restart flags, plus more.
func (h *host) rotateKeyArgs(t *testing.T, more ...string) []string {
	t.Helper()
	args := append([]string{"rotate-key", "--signing-key", h.Path("/etc/kubernetes/pki/sa.key"), "--public-key", h.Path("/etc/kubernetes/pki/sa.pub")}, more...)
	return append(args, h.restartFlags(t)...)
}

// rotationState is h's rotation record in etcd.
func (f *fleet) rotationState(t *testing.T, h *host) (phase, next string) {
	t.Helper()
	var st struct {
		Phase string `json:"phase"`
		Next  string `json:"next"`
	}
	key := "/kubernetes/service-account-keys-rotation/" + h.name + "/state"
	if err := json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &st); err != nil {
		t.Fatalf("rotation state of %s: %v", h.name, err)
	}
	return st.Phase, st.Next
}

func (h *host) retireKeys(t *testing.T) (int, string) {
	t.Helper()
	return h.helper(t, "retire-keys", "--signing-key", h.Path("/etc/kubernetes/pki/sa.key"), "--public-key", h.Path("/etc/kubernetes/pki/sa.pub"))
}

// saKeyRotation rotates m1's key with rotate-key while a client keeps
// requesting tokens from every master and presenting each to every master:
// not one refusal. rotate-key is SIGKILLed after each step (generate,
// publish, during the wait, install, during the restart) and run again,
// each run resuming where the last stopped; once with m3's confd down (the
// rotation waits, times out naming m3, installs nothing). The old key goes
// from every bundle and apiserver only after the (shortened) grace period.
func (f *fleet) saKeyRotation(t *testing.T) {
	m1, m3 := f.hosts[0], f.hosts[2]
	old := m1.sa.kid
	// Keys earlier scenarios published for hosts that do not exist: no
	// record will ever say they trust anything, so every wait would time out.
	stray := false
	for key := range f.etcdKeys(t, keyPrefix) {
		if !slices.ContainsFunc(f.hosts, func(h *host) bool { return key == keyPrefix+h.name }) {
			f.del(t, key)
			stray = true
		}
	}
	if stray {
		f.awaitConverged(t, 4*time.Minute)
	}
	probe := f.startTokenProbe(t)
	defer probe.finish(t)

	signing := func() string { return keyKidOfPrivate(t, m1.read("/etc/kubernetes/pki/sa.key")) }
	run := m1.rotateKeyArgs(t, "--timeout", "4m", "--grace", "40s")
	// wantPhase: the states the kill may leave. The kill lands a moment
	// after the line is read, and the helper goes on meanwhile.
	killedAt := func(step, msg string, resumed bool, wantPhase ...string) {
		t.Helper()
		out := m1.helperKilledAt(t, msg, run...)
		if resumed != strings.Contains(out, "resuming the rotation") {
			t.Errorf("rotate-key killed at %s: resumed = %v, want %v:\n%s", step, !resumed, resumed, tail(out, 4000))
		}
		if phase, _ := f.rotationState(t, m1); !slices.Contains(wantPhase, phase) {
			t.Errorf("rotate-key killed at %s: state %q, want one of %q", step, phase, wantPhase)
		}
		t.Logf("rotate-key SIGKILLed at %s", step)
	}
	// m3's confd goes down before the next key is published: a later stop
	// could come after m3 rendered it and its apiserver restarted trusting
	// it (the killed runs below may get that far before SIGKILL lands), and
	// the rotation would then not wait for m3.
	m3.stopConfd(t)
	// After generate, publishing is two quick etcd writes, which a loaded
	// machine may let the helper finish before the kill lands: either
	// state resumes through the publish step, which the next kill checks.
	killedAt("generate", "next key pair ready", false, "generated", "published")
	_, next := f.rotationState(t, m1)
	if signing() != old {
		t.Fatal("m1's signing key changed at the generate step")
	}
	killedAt("publish", "published the current and the next public key", true, "published")
	if pub, err := pemcheck.Parse("published", []byte(f.etcdKeys(t, keyPrefix+m1.name)[keyPrefix+m1.name])); err != nil || len(pub.Blocks) != 2 {
		t.Errorf("m1's published value after the publish step: %v, want the current and the next key", err)
	}

	killedAt("wait-trusted", "waiting until every host's apiserver trusts the next key", true, "published")
	code, out := m1.rotateKey(t, "--timeout", "45s", "--grace", "40s")
	if code != 5 || !strings.Contains(out, "m3.fleet.test") {
		t.Fatalf("rotate-key with m3 down: exit %d, want 5 naming m3:\n%s", code, tail(out, 4000))
	}
	if kid := keyKidOfPrivate(t, m1.read("/etc/kubernetes/pki/sa.key")); kid != old {
		t.Fatalf("m1 signs with %s after a failed wait, want still %s", kid, old)
	}
	code, out = m1.helper(t, "wait-trusted", "--public-key", m1.Path("/etc/kubernetes/pki/sa.pub"), "--timeout", "3s")
	if code != 5 || !strings.Contains(out, "m3.fleet.test") {
		t.Fatalf("wait-trusted with m3 down: exit %d, want 5 naming m3:\n%s", code, out)
	}

	m3.startConfd(t)
	killedAt("install", "next key installed as the signing key", true, "installing")
	if got := signing(); got != next {
		t.Fatalf("m1 signs with %s after the install step, want the next key %s", got, next)
	}
	// During the restart itself: the helper dies once the old apiserver is
	// stopped; its restart command must not outlive it, and the re-run
	// restarts again under the lock.
	outcome := m1.killHelperAtNextRestart("rotate-key's SIGKILL", nil)
	if code, out := m1.rotateKey(t, "--timeout", "4m", "--grace", "40s"); code == 0 {
		t.Fatalf("rotate-key killed during the restart exited 0:\n%s", tail(out, 4000))
	}
	select {
	case msg := <-outcome:
		if msg != "" {
			t.Error(msg)
		}
	case <-time.After(time.Minute):
		t.Fatal("rotate-key's restart never reached systemd")
	}
	if phase, _ := f.rotationState(t, m1); phase != "installing" {
		t.Errorf("rotate-key killed during the restart: state %q, want installing", phase)
	}

	code, out = m1.rotateKey(t, "--timeout", "4m", "--grace", "40s")
	if code != 0 || !strings.Contains(out, "resuming the rotation") {
		t.Fatalf("rotate-key resumed: exit %d:\n%s", code, tail(out, 6000))
	}
	if got := signing(); got != next || next == old {
		t.Fatalf("m1 signs with %s, want the next key %s (old %s)", got, next, old)
	}
	f.awaitConverged(t, 4*time.Minute)
	if !slices.Contains(f.publishedKids(t), old) {
		t.Fatal("the old key was withdrawn at once")
	}
	code, out = m1.helper(t, "trust", "-o", "json")
	var rep struct {
		Hosts []struct {
			Host   string
			Stale  bool
			Record *struct {
				Trusted []string
				Signing string
			}
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("trust -o json: exit %d\n%s", code, out)
	}
	for _, h := range rep.Hosts {
		if h.Stale || h.Record == nil || !slices.Contains(h.Record.Trusted, next) || !slices.Contains(h.Record.Trusted, old) {
			t.Errorf("trust: %s %+v, want trusting the old and the new key", h.Host, h.Record)
		}
		if h.Host == m1.name && (h.Record == nil || h.Record.Signing != next) {
			t.Errorf("trust: %s signs with %+v, want %s", h.Host, h.Record, next)
		}
	}
	f.await(t, time.Minute, "a token signed with m1's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m1.name, next) })

	// Retire: not before the grace period, then gone everywhere.
	if code, out := m1.retireKeys(t); code != 0 {
		t.Fatalf("retire-keys early: exit %d\n%s", code, out)
	}
	if !slices.Contains(f.publishedKids(t), old) {
		t.Fatal("retire-keys withdrew the old key before the grace period was over")
	}
	var st struct {
		RetireAfter time.Time `json:"retire_after"`
	}
	if err := json.Unmarshal([]byte(f.etcdKeys(t, "/kubernetes/service-account-keys-rotation/")["/kubernetes/service-account-keys-rotation/"+m1.name+"/state"]), &st); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(st.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	if code, out := m1.retireKeys(t); code != 0 {
		t.Fatalf("retire-keys: exit %d\n%s", code, out)
	}
	if slices.Contains(f.publishedKids(t), old) {
		t.Fatal("old key still published after retire-keys")
	}
	f.awaitConverged(t, 4*time.Minute) // every bundle and JWKS hold exactly the published keys
	m1.sa = m1.installedSAKey(t)
	if m1.sa.kid != next {
		t.Fatalf("m1's sa.key holds %s after the rotation, want %s", m1.sa.kid, next)
	}
}

// installedSAKey is the key pair in the host's sa.key now: after a
// rotation later scenarios (a certificate for the key, a comparison with
// what the host publishes) must use the key on disk, not the one the
// fleet started with.
func (h *host) installedSAKey(t *testing.T) saKey {
	t.Helper()
	data := h.read("/etc/kubernetes/pki/sa.key")
	f, err := pemcheck.Parse("sa.key", data)
	if err != nil || len(f.Blocks) != 1 || f.Blocks[0].Public == nil {
		t.Fatalf("%s: sa.key: %v", h.name, err)
	}
	der, err := x509.MarshalPKIXPublicKey(f.Blocks[0].Public)
	if err != nil {
		t.Fatal(err)
	}
	return saKey{private: data, public: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), kid: kidOf(der)}
}

// keyKidOfPrivate is the kid of the public half of a private key PEM.
func keyKidOfPrivate(t *testing.T, pemData []byte) string {
	t.Helper()
	f, err := pemcheck.Parse("sa.key", pemData)
	if err != nil || len(f.Blocks) != 1 {
		t.Fatalf("sa.key: %v", err)
	}
	kid, err := pemcheck.KeyID(f.Blocks[0].Public)
	if err != nil {
		t.Fatal(err)
	}
	return kid
}

// reimaged: m2 is reinstalled and comes back with a new service-account key
// pair (the old private key is lost) and without its rendered files, and
// boots as a new host would (publisher, one confd -onetime, confd.service),
// the shipped wait-trusted drop-in running before its apiserver starts.
// While a client keeps requesting tokens from every master and presenting
// each to every master, not one is refused; at the moment m2's apiserver
// starts with the new key, every other master's trust record lists it. Its
// publisher keeps the lost key published as superseded (a short grace from
// the shipped configuration file), so a token m2 signed before the reimage
// is accepted by every apiserver, m2's included, once the fleet rendered
// and restarted. The key is left superseded for retire-timers, which
// retires it after the grace and checks that every apiserver then refuses
// that token.
func (f *fleet) reimaged(t *testing.T) {
	m2 := f.hosts[1]
	anon := httpClient(t, f.ca.pem, nil, nil)
	var oldToken string
	f.ensureServiceAccount(t) // as the probe does: the scenario may run right after fresh
	f.await(t, time.Minute, "a token signed by m2 before its reimage", func() bool {
		tok, err := f.tryToken(m2)
		oldToken = tok
		return err == nil
	})
	old := m2.sa.kid
	if got := tokenKid(oldToken); got != old {
		t.Fatalf("m2's token before the reimage carries kid %s, want %s", got, old)
	}
	probe := f.startTokenProbe(t)
	defer probe.finish(t)

	// Out of service, as its operator takes it down: its downtime is not
	// a restart's and is not checked for overlap.
	f.tl.outOfService(m2.name)
	m2.stopConfd(t)
	m2.unitCtl(t, "stop", publisherUnit)
	m2.systemd.stopUnit()
	// A new disk: the publisher's state (the tombstones it saw) is gone.
	if err := os.RemoveAll(m2.Path("/var/lib/kube-apiserver-safe-restart")); err != nil {
		t.Fatal(err)
	}
	m2.sa = newSAKey(t)
	m2.write("/etc/kubernetes/pki/sa.key", string(m2.sa.private), 0o600)
	m2.write("/etc/kubernetes/pki/sa.pub", string(m2.sa.public), 0o644)
	for _, gone := range []string{"/etc/kubernetes/pki/sa-bundle.pem", "/etc/kubernetes/apiserver-sa.env"} {
		if err := os.Remove(m2.Path(gone)); err != nil {
			t.Fatal(err)
		}
	}
	// The site's configuration, as the new image ships it: a grace short
	// enough for the rehearsal.
	cfg := string(m2.read(configPath))
	m2.write(configPath, cfg+"\n# Superseded keys stay published this long.\ngrace = \"40s\"\n", 0o644)
	defer m2.write(configPath, cfg, 0o644)

	untrusted := make(chan string, 1)
	m2.systemd.onNextRestart(func(phase string, _ int, _ net.Conn) {
		if phase != "starting" {
			return
		}
		var why []string
		for _, o := range f.hosts {
			if o == m2 {
				continue
			}
			var rec struct {
				Trusted []string `json:"trusted"`
			}
			// Not f.etcdKeys: this runs on the stand-in's goroutine, where
			// t.Fatal must not be called.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := f.cli.Get(ctx, "/kubernetes/service-account-keys-trust/"+o.name)
			cancel()
			if err == nil && len(resp.Kvs) == 1 {
				err = json.Unmarshal(resp.Kvs[0].Value, &rec)
			}
			if err != nil || !slices.Contains(rec.Trusted, m2.sa.kid) {
				why = append(why, fmt.Sprintf("%s trusts %v (%v)", o.name, rec.Trusted, err))
			}
		}
		untrusted <- strings.Join(why, "; ")
	})
	m2.boot(t)
	select {
	case why := <-untrusted:
		if why != "" {
			t.Errorf("m2's apiserver started with its new key %s before every other master trusted it: %s", m2.sa.kid, why)
		}
	default:
		t.Error("m2 booted without a restart through its systemd")
	}
	f.awaitConverged(t, 4*time.Minute)
	if !slices.Contains(f.publishedKids(t), old) {
		t.Fatalf("m2's lost key %s was withdrawn by its reimage", old)
	}
	f.await(t, time.Minute, "a token signed with m2's new key accepted everywhere", func() bool { return probe.acceptedEverywhere(m2.name, m2.sa.kid) })
	if !strings.Contains(string(m2.read("/var/log/kube-apiserver.log")), "systemd: ExecStartPre") {
		t.Error("the wait-trusted drop-in never ran before m2's apiserver")
	}
	accepted := 0
	for _, h := range f.hosts {
		if code, err := tryReview(anon, h, oldToken); err != nil || code != http.StatusCreated {
			t.Errorf("%s: the token m2 signed before its reimage: %d %v, want accepted", h.name, code, err)
		} else {
			accepted++
		}
	}
	t.Logf("the token m2 signed before its reimage (kid %s): accepted by %d of %d apiservers", old, accepted, len(f.hosts))

	// The lost key stays published until the grace is over; the shipped
	// retire units of every master retire it (retire-timers, next).
	f.superseded = &supersededKey{host: m2, kid: old, token: oldToken}

}
