//go:build rehearsal

package rehearsal

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/toolbin"
)

// The controller-manager's unit on a master, and the flags file its
// systemd unit reads (what rotate-key's --controller-manager-flags-file
// names).
const (
	cmUnit      = "kube-controller-manager.service"
	cmFlagsFile = "/etc/kubernetes/controller-manager.env"
)

// controllerManager is the stand-in systemd's second unit,
// kube-controller-manager.service: started, stopped and restarted like the
// apiserver (`systemctl restart kube-controller-manager.service`), without
// ExecStartPre or readiness tracking.
type controllerManager struct {
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	restarts int
	port     int
}

// restartControllerManager is `systemctl restart kube-controller-manager.service`.
func (s *systemd) restartControllerManager() error {
	cm := &s.cm
	cm.mu.Lock()
	defer cm.mu.Unlock()
	h := s.h
	cm.stopLocked(syscall.SIGTERM)
	_, env, argv, logf, err := h.unitExec(cmUnit)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s systemd: starting kube-controller-manager\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Started and waited for on one locked thread, as the apiserver is
	// (see systemd.restart: Pdeathsig follows the thread).
	exited, err := startOnLockedThread(cmd)
	if err != nil {
		return err
	}
	cm.cmd, cm.exited = cmd, exited
	cm.restarts++
	return nil
}

// stopControllerManager is `systemctl stop kube-controller-manager.service`.
func (s *systemd) stopControllerManager() {
	s.cm.mu.Lock()
	defer s.cm.mu.Unlock()
	s.cm.stopLocked(syscall.SIGTERM)
}

func (cm *controllerManager) stopLocked(sig syscall.Signal) {
	stopGroup(cm.cmd, cm.exited, sig, 30*time.Second)
	cm.cmd = nil
}

func (cm *controllerManager) restartCount() int {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	return cm.restarts
}

// installControllerManager gives h kube-controller-manager as a
// binary-deployed master has it: its unit reading its flags from
// cmFlagsFile, only its token controllers (the rest would only load the
// machine), signing with h's sa.key, talking to h's own apiserver; no
// leader election, so that the master running it leads.
func (h *host) installControllerManager(t *testing.T, kcm string) {
	t.Helper()
	if _, err := os.Lstat(h.Path("/usr/local/bin/kube-controller-manager")); err != nil {
		if err := os.Symlink(kcm, h.Path("/usr/local/bin/kube-controller-manager")); err != nil {
			t.Fatal(err)
		}
	}
	if h.systemd.cm.port == 0 {
		h.systemd.cm.port = etcdtest.FreePort(t)
	}
	kc := h.writeKubeconfig()
	if err := os.MkdirAll(h.Path("/var/lib/kubernetes/controller-manager"), 0o700); err != nil {
		t.Fatal(err)
	}
	args := strings.Join([]string{
		"--kubeconfig=" + h.Restore(kc), "--controllers=serviceaccount-token-controller,serviceaccount-controller",
		"--service-account-private-key-file=/etc/kubernetes/pki/sa.key", "--root-ca-file=/etc/kubernetes/pki/ca.crt",
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(h.systemd.cm.port),
		"--cert-dir=/var/lib/kubernetes/controller-manager", "--use-service-account-credentials=false",
	}, " ")
	h.write(cmFlagsFile, h.Rewrite(`KUBE_CONTROLLER_MANAGER_ARGS="`+args+`"`+"\n"), 0o644)
	h.write("/etc/systemd/system/"+cmUnit, h.Rewrite(`[Service]
EnvironmentFile=/etc/kubernetes/controller-manager.env
ExecStart=/usr/local/bin/kube-controller-manager $KUBE_CONTROLLER_MANAGER_ARGS
`), 0o644)
}

func (h *host) cmHealthURL() string {
	return fmt.Sprintf("https://127.0.0.1:%d/healthz", h.systemd.cm.port)
}

// awaitControllerManager waits for h's kube-controller-manager's /healthz.
func (f *fleet) awaitControllerManager(t *testing.T, h *host) {
	t.Helper()
	c := httpClient(t, nil, nil, nil)
	c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true // its self-signed serving certificate
	f.await(t, 2*time.Minute, h.name+"'s kube-controller-manager healthy", func() bool {
		resp, err := c.Get(h.cmHealthURL())
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// legacySecret creates (or, with del, deletes) the legacy token Secret
// name for service account fleet through h's apiserver.
func (f *fleet) legacySecret(t *testing.T, h *host, name string, del bool) {
	t.Helper()
	url := h.APIServerURL + "/api/v1/namespaces/default/secrets"
	var req *http.Request
	if del {
		req, _ = http.NewRequest(http.MethodDelete, url+"/"+name, nil)
	} else {
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":%q,"annotations":{"kubernetes.io/service-account.name":"fleet"}},"type":"kubernetes.io/service-account-token"}`, name)
		req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.admin.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := map[bool]int{false: http.StatusCreated, true: http.StatusOK}[del]; resp.StatusCode != want {
		t.Fatalf("%s secret %s: HTTP %d", req.Method, name, resp.StatusCode)
	}
}

// legacyToken waits until the token controller filled Secret name and
// returns its token.
func (f *fleet) legacyToken(t *testing.T, h *host, name string) string {
	t.Helper()
	tok := ""
	f.await(t, time.Minute, "the token controller fills Secret default/"+name, func() bool {
		resp, err := f.admin.Get(h.APIServerURL + "/api/v1/namespaces/default/secrets/" + name)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var s struct {
			Data map[string]string `json:"data"`
		}
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&s) != nil {
			return false
		}
		b, err := base64.StdEncoding.DecodeString(s.Data["token"])
		tok = string(b)
		return err == nil && tok != ""
	})
	return tok
}

// legacyProbe presents one legacy token to every apiserver every second
// and counts refusals by an apiserver that was ready throughout the request.
type legacyProbe struct {
	f        *fleet
	token    string
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	accepted int
	refused  []string
}

func (f *fleet) startLegacyProbe(t *testing.T, token string) *legacyProbe {
	p := &legacyProbe{f: f, token: token, stop: make(chan struct{}), done: make(chan struct{})}
	anon := httpClient(t, f.ca.pem, nil, nil)
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
			for _, v := range f.hosts {
				gen, ready := f.tl.generation(v.name), f.tl.isReady(v.name)
				code, err := tryReview(anon, v, token)
				stable := ready && f.tl.isReady(v.name) && gen == f.tl.generation(v.name)
				p.mu.Lock()
				switch {
				case err == nil && code == http.StatusCreated:
					p.accepted++
				case err == nil && code == http.StatusUnauthorized && stable:
					p.refused = append(p.refused, fmt.Sprintf("%s %s refused the legacy token (kid %s)", time.Now().Format(time.RFC3339Nano), v.name, tokenKid(token)))
				}
				p.mu.Unlock()
			}
		}
	}()
	return p
}

func (p *legacyProbe) finish(t *testing.T) {
	t.Helper()
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.refused {
		t.Errorf("legacy token refused: %s", r)
	}
	t.Logf("legacy token probe: %d presentations accepted, %d refused", p.accepted, len(p.refused))
	if p.accepted == 0 {
		t.Error("legacy token probe: nothing was accepted at all")
	}
}

// controllerManager runs a real kube-controller-manager on one master at
// a time (it leads: no leader election), m1 then m2. On each: a legacy token
// Secret created before the rotation carries the leader's key and is
// accepted by every apiserver throughout; rotate-key with
// --controller-manager-flags-file restarts the controller-manager; after
// the grace retire-keys --kubeconfig refuses (exit 3, naming the Secret)
// while the Secret holds the old kid; re-created, its token carries the new
// kid, retire-keys succeeds and the new token verifies everywhere.
func (f *fleet) controllerManager(t *testing.T) {
	kcm := toolbin.Kube(t, "kube-controller-manager")
	f.ensureServiceAccount(t)
	step := stepLogger(t)
	for i, h := range f.hosts[:2] {
		h.installControllerManager(t, kcm)
		if err := h.systemd.restartControllerManager(); err != nil {
			t.Fatalf("%s: start kube-controller-manager: %v", h.name, err)
		}
		step("%s: kube-controller-manager started", h.name)
		f.awaitControllerManager(t, h)
		step("%s: kube-controller-manager healthy", h.name)
		f.controllerManagerRotation(t, h, fmt.Sprintf("legacy-%d", i+1), step)
		h.systemd.stopControllerManager()
		step("%s: kube-controller-manager stopped", h.name)
		f.logStopTimes(t)
		if t.Failed() {
			t.Logf("%s kube-controller-manager log (last 6 KiB):\n%s", h.name, tail(string(h.read("/var/log/kube-controller-manager.log")), 6000))
			return
		}
	}
}

// stepLogger logs each step of a long scenario with the time since the
// previous step and since the first, to show where the time goes.
func stepLogger(t *testing.T) func(format string, args ...any) {
	start := time.Now()
	last := start
	return func(format string, args ...any) {
		t.Helper()
		now := time.Now()
		t.Logf("step +%s (at %s): %s", now.Sub(last).Round(100*time.Millisecond), now.Sub(start).Round(100*time.Millisecond), fmt.Sprintf(format, args...))
		last = now
	}
}

func (f *fleet) controllerManagerRotation(t *testing.T, h *host, secret string, step func(string, ...any)) {
	t.Helper()
	old := h.signingKid(t)
	f.legacySecret(t, h, secret, false)
	tok := f.legacyToken(t, h, secret)
	step("%s: Secret %s filled", h.name, secret)
	if got := tokenKid(tok); got != old {
		t.Fatalf("%s's kube-controller-manager signed Secret %s with %s, want %s (its sa.key)", h.name, secret, got, old)
	}
	probe := f.startLegacyProbe(t, tok)
	cmBefore := h.systemd.cm.restartCount()
	code, out := h.rotateKey(t, "--timeout", "4m", "--grace", "20s",
		"--controller-manager-flags-file", h.Path(cmFlagsFile), "--controller-manager-health-url", h.cmHealthURL())
	step("%s: rotate-key exited %d; its output:\n%s", h.name, code, tail(out, 8000))
	if code != 0 {
		probe.finish(t)
		t.Fatalf("%s: rotate-key: exit %d\n%s", h.name, code, tail(out, 6000))
	}
	next := h.signingKid(t)
	if next == old {
		t.Fatalf("%s signs with %s after rotate-key, as before", h.name, old)
	}
	if n := h.systemd.cm.restartCount() - cmBefore; n != 1 || !strings.Contains(out, "kube-controller-manager restarted and healthy") {
		t.Errorf("%s: rotate-key restarted kube-controller-manager %d times, want once:\n%s", h.name, n, tail(out, 4000))
	}
	f.awaitConverged(t, 4*time.Minute)
	step("%s: converged after rotate-key", h.name)
	if rec := f.trustRecord(t, h); rec.ControllerManagerSigning != next {
		t.Errorf("%s's trust record names the controller-manager's key %q, want %s", h.name, rec.ControllerManagerSigning, next)
	}
	st := f.rotationRecord(t, h)
	if st == nil || st.Phase != "installed" {
		t.Fatalf("%s: rotation state %+v, want installed", h.name, st)
	}
	time.Sleep(time.Until(st.RetireAfter) + 100*time.Millisecond) // the grace period is wall-clock time
	step("%s: RetireAfter %s passed", h.name, st.RetireAfter.Format(time.RFC3339Nano))
	probe.finish(t)
	kc := h.Path("/etc/kubernetes/admin.conf")
	retire := func() (int, string) {
		return h.helper(t, "retire-keys", "--signing-key", h.Path("/etc/kubernetes/pki/sa.key"), "--public-key", h.Path("/etc/kubernetes/pki/sa.pub"), "--kubeconfig", kc)
	}
	code, out = retire()
	step("%s: refused retire-keys exited %d", h.name, code)
	if code != 3 || !strings.Contains(out, "default/"+secret) || strings.Contains(out, tok) {
		t.Fatalf("%s: retire-keys while Secret %s holds %s: exit %d, want 3 naming it (never its token):\n%s", h.name, secret, old, code, tail(out, 4000))
	}
	if got := f.publishedBy(t, h); !slices.Contains(got, old) {
		t.Fatalf("%s: refused retire-keys withdrew %s: %v", h.name, old, got)
	}
	// The runbook: re-create the Secret; the controller-manager, restarted
	// by rotate-key, signs it with the new key.
	f.legacySecret(t, h, secret, true)
	f.legacySecret(t, h, secret, false)
	tok = f.legacyToken(t, h, secret)
	step("%s: Secret %s re-created and filled", h.name, secret)
	if got := tokenKid(tok); got != next {
		t.Fatalf("re-created Secret %s carries %s, want the new key %s", secret, got, next)
	}
	code, out = retire()
	step("%s: retire-keys exited %d; its output:\n%s", h.name, code, tail(out, 4000))
	if code != 0 {
		t.Fatalf("%s: retire-keys after the Secret was re-created: exit %d\n%s", h.name, code, tail(out, 4000))
	}
	f.awaitConverged(t, 4*time.Minute) // old kid gone from every bundle and JWKS
	step("%s: converged after retire-keys", h.name)
	for _, v := range f.hosts {
		if !f.review(t, v, tok) {
			t.Errorf("%s refused the re-created legacy token (kid %s)", v.name, next)
		}
	}
	f.legacySecret(t, h, secret, true)
}

// logStopTimes logs how long each apiserver took to stop at each restart
// so far (the stand-in systemd's "stop took" lines in its log): a stop
// waiting on a client's watches shows as about a minute.
func (f *fleet) logStopTimes(t *testing.T) {
	t.Helper()
	for _, v := range f.hosts {
		var took []string
		for _, l := range strings.Split(string(v.read("/var/log/kube-apiserver.log")), "\n") {
			if _, d, ok := strings.Cut(l, " systemd: stop took "); ok {
				took = append(took, d)
			}
		}
		t.Logf("%s: apiserver stops took %s", v.name, strings.Join(took, ", "))
	}
}

// cmRecord is the part of a trust record this scenario reads.
type cmRecord struct {
	ControllerManagerSigning string `json:"controller_manager_signing"`
}

func (f *fleet) trustRecord(t *testing.T, h *host) cmRecord {
	t.Helper()
	key := "/kubernetes/service-account-keys-trust/" + h.name
	var r cmRecord
	if err := json.Unmarshal([]byte(f.etcdKeys(t, key)[key]), &r); err != nil {
		t.Fatalf("trust record of %s: %v", h.name, err)
	}
	return r
}
