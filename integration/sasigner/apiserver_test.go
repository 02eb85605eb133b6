package sasigner

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/internal/toolbin"
)

// apiserver is one running kube-apiserver in signer mode.
type apiserver struct {
	url  string
	cmd  *exec.Cmd
	out  *logBuffer
	done chan struct{}
}

func startAPIServer(t *testing.T, bin, etcdURL, socket string, certs *etcdtest.TLSFiles) *apiserver {
	t.Helper()
	return startAPIServerFlags(t, bin, etcdURL, certs, "--service-account-signing-endpoint="+socket)
}

// startAPIServerFlags starts an apiserver with the given service-account
// key flags (the signing endpoint, or both key-file flags).
func startAPIServerFlags(t *testing.T, bin, etcdURL string, certs *etcdtest.TLSFiles, saFlags ...string) *apiserver {
	t.Helper()
	port := etcdtest.FreePort(t)
	a := &apiserver{url: fmt.Sprintf("https://127.0.0.1:%d", port), out: newLogBuffer(), done: make(chan struct{})}
	// The flags of /work/shared/kube-apiserver-for-tests.md, with the
	// signing endpoint in place of both key-file flags.
	a.cmd = exec.Command(bin, append([]string{
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=" + etcdURL, "--etcd-prefix=/registry", "--cert-dir=" + t.TempDir(),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--client-ca-file=" + certs.CA, "--authorization-mode=AlwaysAllow", "--service-cluster-ip-range=10.96.0.0/12",
		"--endpoint-reconciler-type=none"}, saFlags...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() { _ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL); <-a.done })
	// AlwaysAllow turns anonymous requests off: /readyz needs the admin certificate.
	hc := insecureClient(certs)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond) // it has no readiness signal but answering
	defer tick.Stop()
	for {
		if resp, err := hc.Get(a.url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a
			}
		}
		select {
		case <-a.done:
			t.Fatalf("kube-apiserver exited; output:\n%.5000s", a.out.String())
		case <-ctx.Done():
			t.Fatalf("kube-apiserver not ready; output ends:\n%s", tail(a.out.String(), 5000))
		case <-tick.C:
		}
	}
}

// insecureClient does not verify the apiserver's self-signed serving
// certificate (--cert-dir); with certs it presents the admin certificate.
func insecureClient(certs *etcdtest.TLSFiles) *http.Client {
	tc := &tls.Config{InsecureSkipVerify: true}
	if certs != nil {
		c, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
		if err == nil {
			tc.Certificates = []tls.Certificate{c}
		}
	}
	// HTTP/1.1: curl and Go's HTTP/2 sometimes lose a 401 body on a POST.
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
}

func post(t *testing.T, c *http.Client, url, bearer, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// ensureServiceAccount creates default/probe; the default namespace
// appears shortly after the first apiserver starts.
func ensureServiceAccount(t *testing.T, admin *http.Client, a *apiserver) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := post(t, admin, a.url+"/api/v1/namespaces/default/serviceaccounts", "",
			`{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"probe"}}`)
		if code == http.StatusCreated || code == http.StatusConflict {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("create service account: HTTP %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond) // waiting for the namespace controller; no event to wait on
	}
}

func token(t *testing.T, admin *http.Client, a *apiserver) string {
	t.Helper()
	code, body := post(t, admin, a.url+"/api/v1/namespaces/default/serviceaccounts/probe/token", "",
		`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}`)
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &tr); err != nil || code != http.StatusCreated || tr.Status.Token == "" {
		t.Fatalf("TokenRequest on %s: HTTP %d %s", a.url, code, body)
	}
	return tr.Status.Token
}

// header decodes a JWT's header.
func header(t *testing.T, tok string) map[string]string {
	t.Helper()
	h, _, _ := strings.Cut(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// review presents tok to a (SelfSubjectReview) and returns the status:
// 201 accepted, 401 refused.
func review(t *testing.T, a *apiserver, tok string) int {
	t.Helper()
	code, _ := post(t, insecureClient(nil), a.url+"/apis/authentication.k8s.io/v1/selfsubjectreviews", tok,
		`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`)
	return code
}

// TestRealAPIServers: three kube-apiservers v1.37.2, each started with
// --service-account-signing-endpoint on its own signer, each master
// publishing its own key in etcd. Every token verifies on every apiserver
// (9/9, where each apiserver alone with its own key gives 3/9) and carries
// the signing master's kid. Then master 1 changes its key with no restart
// (new public key published beside the old, key file replaced, SIGHUP)
// while a prober requests and verifies tokens on every master: the old key
// signs until every apiserver fetched the new one (the trust barrier), no
// token is refused, and no apiserver restarts.
func TestRealAPIServers(t *testing.T) {
	bin := toolbin.Kube(t, "kube-apiserver")
	e := etcdtest.Start(t)
	certs := etcdtest.WriteTLSFiles(t, t.TempDir())
	admin := insecureClient(certs)

	type master struct {
		name   string
		key    saKey
		dir    string
		signer *signer
		api    *apiserver
	}
	ms := []*master{{name: "m1", key: newSAKey(t, "rsa")}, {name: "m2", key: newSAKey(t, "ecdsa")}, {name: "m3", key: newSAKey(t, "rsa")}}
	for _, m := range ms {
		m.dir = shortDir(t)
		m.key.write(t, filepath.Join(m.dir, "sa.key"))
		e.Put(t, keysPrefix+m.name, m.key.pub)
	}
	// kube-controller-manager signs legacy tokens from m2's sa.key (its
	// EnvironmentFile names it); m2's signer is told where its flags are,
	// so that its trust record names the key it signs with.
	kcm := newControllerManagerStandIn(t, filepath.Join(ms[1].dir, "sa.key"))
	for _, m := range ms {
		args := signerArgs(m.dir, e.Endpoint, filepath.Join(m.dir, "sa.key"), "--host="+m.name)
		if m.name == "m2" {
			args = append(args, "--controller-manager-flags-file="+kcm.flagsFile)
		}
		m.signer = startSigner(t, args...)
		m.signer.out.waitFor(t, "published keys read from etcd", 20*time.Second)
		m.api = startAPIServer(t, bin, e.Endpoint, m.signer.socket, certs)
	}
	ensureServiceAccount(t, admin, ms[0].api)
	waitRecord(t, e, "m2", `"controller_manager_signing":"`+ms[1].key.kid+`"`)

	tokens := map[string]string{}
	for _, m := range ms {
		tok := token(t, admin, m.api)
		h := header(t, tok)
		wantAlg := map[string]string{"m1": "RS256", "m2": "ES256", "m3": "RS256"}[m.name]
		if h["kid"] != m.key.kid || h["alg"] != wantAlg || h["typ"] != "JWT" || len(h) != 3 {
			t.Errorf("%s's token header %v, want alg %s, kid %s, typ JWT only", m.name, h, wantAlg, m.key.kid)
		}
		tokens[m.name] = tok
	}
	accepted := 0
	for from, tok := range tokens {
		for _, m := range ms {
			if code := review(t, m.api, tok); code == http.StatusCreated {
				accepted++
			} else {
				t.Errorf("%s refused %s's token: HTTP %d", m.name, from, code)
			}
		}
	}
	t.Logf("tokens accepted: %d of %d", accepted, len(tokens)*len(ms))

	// Master 1 changes its key; nothing restarts. A prober asks every
	// master for a token and every master to verify it, throughout.
	var pids []int
	var apis []*apiserver
	for _, m := range ms {
		pids = append(pids, m.api.cmd.Process.Pid)
		apis = append(apis, m.api)
	}
	p := startProber(admin, apis)
	rotated := time.Now()
	next := newSAKey(t, "ecdsa")
	e.Put(t, keysPrefix+"m1", ms[0].key.pub+next.pub)
	next.write(t, filepath.Join(ms[0].dir, "sa.key"))
	if err := ms[0].signer.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The trust barrier: the new key is served at once, but the previous
	// key signs until both apiservers fetched the new one (each within its
	// refresh hint of 10 s) and recorded it.
	const promoted = "every recorded host's apiserver fetched the new key: signing with it"
	ms[0].signer.out.waitFor(t, "SIGHUP: new signing key served", 10*time.Second)
	early := strings.Contains(ms[0].signer.out.String(), promoted)
	if h := header(t, token(t, admin, ms[0].api)); !early && h["kid"] != ms[0].key.kid {
		t.Errorf("before every apiserver fetched the new key, m1 signed with %s; want the previous key %s", h["kid"], ms[0].key.kid)
	}
	ms[0].signer.out.waitFor(t, promoted, 60*time.Second)
	for _, m := range ms {
		if !strings.Contains(recordOf(t, e, m.name), next.kid) {
			t.Errorf("%s's trust record does not list the new key: %s", m.name, recordOf(t, e, m.name))
		}
	}
	t.Logf("rotate to the new key signing: %s", time.Since(rotated).Round(100*time.Millisecond))
	p.round() // one full round with the new key signing
	accepted, refused, failed := p.stop()
	t.Logf("prober during the rotation: %d accepted, %d refused, %d token requests failed", accepted, refused, failed)
	if refused != 0 || failed != 0 || accepted == 0 {
		t.Errorf("prober: %d accepted, %d refused, %d failed; want 0 refused, 0 failed", accepted, refused, failed)
	}
	tok := token(t, admin, ms[0].api)
	if h := header(t, tok); h["kid"] != next.kid || h["alg"] != "ES256" {
		t.Fatalf("after the switch m1's token header %v, want kid %s (ES256)", h, next.kid)
	}
	for _, m := range ms {
		if code := review(t, m.api, tok); code != http.StatusCreated {
			t.Errorf("%s refused m1's token signed with its new key: HTTP %d", m.name, code)
		}
		if code := review(t, m.api, tokens["m1"]); code != http.StatusCreated {
			t.Errorf("%s refused m1's token signed with its previous key: HTTP %d", m.name, code)
		}
	}
	// Master 2 rotates with `kube-apiserver-safe-restart rotate-key
	// --signer`: next key generated and published, every apiserver fetches
	// it, key installed, signer reloaded (SIGHUP here, `systemctl reload`
	// on a host), wait until it signs with it. No apiserver restarts.
	m2 := ms[1]
	_ = os.WriteFile(filepath.Join(m2.dir, "sa.pub"), []byte(m2.key.pub), 0o644)
	// rotate-key --signer restarts kube-controller-manager with
	// `systemctl restart kube-controller-manager.service` (a stand-in
	// here that records its call) and waits for its /healthz.
	p2 := startProber(admin, apis)
	start := time.Now()
	out, err := runRotateEnv(t, kcm.env, "rotate-key", "--signer", "--host=m2", "--endpoints="+e.Endpoint,
		"--signing-key="+filepath.Join(m2.dir, "sa.key"), "--public-key="+filepath.Join(m2.dir, "sa.pub"),
		"--algorithm=ecdsa-p256", "--timeout=2m", "--trust-timeout=2m", "--grace=0", "--log-format=json",
		"--controller-manager-flags-file="+kcm.flagsFile, "--controller-manager-health-url="+kcm.healthURL,
		"--", "kill", "-HUP", strconv.Itoa(m2.signer.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("rotate-key --signer: %v\n%s\nsigner:\n%s", err, out, m2.signer.out.String())
	}
	if got := kcm.calls(t); got != "restart kube-controller-manager.service\n" {
		t.Errorf("rotate-key --signer ran systemctl %q, want one restart of kube-controller-manager.service", got)
	}
	t.Logf("rotate-key --signer: exit 0 after %s", time.Since(start).Round(100*time.Millisecond))
	newKid := fileKid(t, filepath.Join(m2.dir, "sa.key"))
	if newKid == m2.key.kid {
		t.Fatal("rotate-key --signer left the key as it was")
	}
	tok = token(t, admin, m2.api)
	if h := header(t, tok); h["kid"] != newKid {
		t.Errorf("after rotate-key --signer m2 signs with %s, want %s", h["kid"], newKid)
	}
	p2.round()
	accepted, refused, failed = p2.stop()
	t.Logf("prober during rotate-key --signer: %d accepted, %d refused, %d token requests failed", accepted, refused, failed)
	if refused != 0 || failed != 0 || accepted == 0 {
		t.Errorf("prober: %d accepted, %d refused, %d failed; want 0 refused, 0 failed", accepted, refused, failed)
	}

	// The signer's record names the controller-manager's new key. While
	// a controller-manager still signs with the old key (its flags name a
	// copy of it), retire-keys refuses (exit 3, naming m2): the gate of
	// bundle-mode hosts holds on signer hosts too.
	waitRecord(t, e, "m2", `"controller_manager_signing":"`+newKid+`"`)
	oldCopy := filepath.Join(shortDir(t), "sa-old.key")
	m2.key.write(t, oldCopy)
	kcmFlags, err := os.ReadFile(kcm.flagsFile)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, kcm.flagsFile, strings.ReplaceAll(string(kcmFlags), filepath.Join(m2.dir, "sa.key"), oldCopy))
	waitRecord(t, e, "m2", `"controller_manager_signing":"`+m2.key.kid+`"`)
	out, err = runRotateEnv(t, nil, "retire-keys", "--host=m2", "--endpoints="+e.Endpoint,
		"--signing-key="+filepath.Join(m2.dir, "sa.key"), "--public-key="+filepath.Join(m2.dir, "sa.pub"), "--log-format=json")
	if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(out, "kube-controller-manager on m2 signs with "+m2.key.kid) {
		t.Fatalf("retire-keys while m2's controller-manager signs with the old key: %v, want exit 3 naming m2:\n%s", err, out)
	}
	writeFile(t, kcm.flagsFile, string(kcmFlags))
	waitRecord(t, e, "m2", `"controller_manager_signing":"`+newKid+`"`)

	// After the grace (0 here), retire-keys withdraws m2's previous key
	// from what every signer serves: no apiserver restarts, and once each
	// apiserver fetched the smaller set (its refresh hint is 10 s) a token
	// signed with the old kid is refused everywhere; the new key's token
	// still verifies everywhere.
	out, err = runRotateEnv(t, nil, "retire-keys", "--host=m2", "--endpoints="+e.Endpoint,
		"--signing-key="+filepath.Join(m2.dir, "sa.key"), "--public-key="+filepath.Join(m2.dir, "sa.pub"), "--log-format=json")
	if err != nil {
		t.Fatalf("retire-keys: %v\n%s", err, out)
	}
	for _, m := range ms {
		deadline := time.Now().Add(90 * time.Second)
		for review(t, m.api, tokens["m2"]) != http.StatusUnauthorized {
			if time.Now().After(deadline) {
				t.Fatalf("%s still accepts m2's token signed with the retired key %s 90 s after retire-keys", m.name, m2.key.kid)
			}
			time.Sleep(time.Second) // the apiserver refreshes on its own schedule; nothing to wait on
		}
		if code := review(t, m.api, tok); code != http.StatusCreated {
			t.Errorf("%s refused m2's token signed with its new key after retire-keys: HTTP %d", m.name, code)
		}
	}
	t.Logf("retire-keys: the old kid %s refused by every apiserver", m2.key.kid)

	// SIGKILL of m3's signer: m3's token requests fail (an error, or no
	// answer within 10 s: the apiserver waits for the socket) while it is
	// down; the other masters are not affected; after the restart (what
	// the unit's Restart=always does) m3 issues tokens again.
	m3 := ms[2]
	m3.signer.stop(syscall.SIGKILL)
	impatient := insecureClient(certs)
	impatient.Timeout = 10 * time.Second
	if tok, err := tryToken(impatient, m3.api); err == nil {
		t.Errorf("m3 issued a token with its signer killed: kid %s", header(t, tok)["kid"])
	}
	for _, m := range ms[:2] {
		if _, err := tryToken(admin, m.api); err != nil {
			t.Errorf("%s affected by m3's signer being down: %v", m.name, err)
		}
	}
	m3.signer = startSigner(t, m3.signer.args...)
	tok = token(t, admin, m3.api)
	for _, m := range ms {
		if code := review(t, m.api, tok); code != http.StatusCreated {
			t.Errorf("%s refused m3's token after its signer restarted: HTTP %d", m.name, code)
		}
	}

	for i, m := range ms {
		select {
		case <-m.api.done:
			t.Errorf("%s's apiserver exited", m.name)
		default:
		}
		if m.api.cmd.Process.Pid != pids[i] {
			t.Errorf("%s's apiserver restarted", m.name)
		}
	}
}

// recordOf is host's trust record as stored.
func recordOf(t *testing.T, e *etcdtest.Server, host string) string {
	t.Helper()
	resp, err := e.Client(t).Get(context.Background(), "/kubernetes/service-account-keys-trust/"+host)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("trust record of %s: %v", host, err)
	}
	return string(resp.Kvs[0].Value)
}

// waitRecord waits until host's trust record contains want: a signer
// writes it when its apiserver next fetches the keys (every refresh hint).
func waitRecord(t *testing.T, e *etcdtest.Server, host, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(recordOf(t, e, host), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s's trust record %s lacks %s after 60 s", host, recordOf(t, e, host), want)
		}
		time.Sleep(200 * time.Millisecond) // the apiserver fetches on its own schedule
	}
}

// writeFile replaces path's contents at once (the signer may read it).
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// fileKid is the key ID of the one key in a PEM file.
func fileKid(t *testing.T, path string) string {
	t.Helper()
	f, err := pemcheck.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := f.KeyIDs()
	if err != nil || len(ids) != 1 {
		t.Fatalf("%s: key IDs %v, %v", path, ids, err)
	}
	return ids[0]
}

// runRotateEnv runs kube-apiserver-safe-restart with env (nil: this
// process's environment).
func runRotateEnv(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, safeRestartBin, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// controllerManagerStandIn is what rotate-key sees of a kube-controller-
// manager signing with keyFile: its EnvironmentFile, a systemctl on PATH
// that records its arguments, and a /healthz that answers.
type controllerManagerStandIn struct {
	flagsFile, healthURL, callsFile string
	env                             []string
}

func newControllerManagerStandIn(t *testing.T, keyFile string) *controllerManagerStandIn {
	t.Helper()
	dir := t.TempDir()
	s := &controllerManagerStandIn{flagsFile: filepath.Join(dir, "controller-manager.env"), callsFile: filepath.Join(dir, "calls")}
	if err := os.WriteFile(s.flagsFile, []byte("KUBE_CONTROLLER_MANAGER_ARGS=\"--service-account-private-key-file="+keyFile+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>"+s.callsFile+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	s.healthURL = srv.URL + "/healthz"
	s.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	return s
}

// calls is what systemctl was run with, one line per call.
func (s *controllerManagerStandIn) calls(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(s.callsFile)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// prober requests a token from every apiserver and presents it to every
// apiserver, round after round, until stopped.
type prober struct {
	admin    *http.Client
	apis     []*apiserver
	mu       sync.Mutex
	accepted int
	refused  int
	failed   int
	roundc   chan struct{}
	stopc    chan struct{}
	done     chan struct{}
}

func startProber(admin *http.Client, apis []*apiserver) *prober {
	p := &prober{admin: admin, apis: apis, roundc: make(chan struct{}), stopc: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *prober) run() {
	defer close(p.done)
	plain := insecureClient(nil)
	tick := time.NewTicker(500 * time.Millisecond) // the probe rate
	defer tick.Stop()
	for {
		for _, from := range p.apis {
			tok, err := tryToken(p.admin, from)
			p.mu.Lock()
			if err != nil {
				p.failed++
			}
			p.mu.Unlock()
			if err != nil {
				continue
			}
			for _, to := range p.apis {
				code, err := tryReview(plain, to, tok)
				p.mu.Lock()
				switch {
				case err == nil && code == http.StatusCreated:
					p.accepted++
				case err == nil && code == http.StatusUnauthorized:
					p.refused++
				default:
					p.failed++
				}
				p.mu.Unlock()
			}
		}
		close(p.roundc)
		p.mu.Lock()
		p.roundc = make(chan struct{})
		p.mu.Unlock()
		select {
		case <-p.stopc:
			return
		case <-tick.C:
		}
	}
}

// round waits for the end of a round started after the call.
func (p *prober) round() {
	p.mu.Lock()
	c := p.roundc
	p.mu.Unlock()
	<-c // the round in progress (may have started before)
	p.mu.Lock()
	c = p.roundc
	p.mu.Unlock()
	<-c
}

func (p *prober) stop() (accepted, refused, failed int) {
	close(p.stopc)
	<-p.done
	return p.accepted, p.refused, p.failed
}

func tryToken(c *http.Client, a *apiserver) (string, error) {
	req, _ := http.NewRequest(http.MethodPost, a.url+"/api/v1/namespaces/default/serviceaccounts/probe/token",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tr); err != nil || resp.StatusCode != http.StatusCreated || tr.Status.Token == "" {
		return "", fmt.Errorf("token from %s: HTTP %d, %v", a.url, resp.StatusCode, err)
	}
	return tr.Status.Token, nil
}

func tryReview(c *http.Client, a *apiserver, tok string) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, a.url+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
		strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
