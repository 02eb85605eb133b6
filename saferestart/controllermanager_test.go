package saferestart

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/trust"
)

// writeKey writes a new private key file.
func writeKey(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, keytest.PKCS8PEM(t, keytest.EC(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// keyID is the key ID of the private key file at path.
func keyID(t *testing.T, path string) string {
	t.Helper()
	kids, err := trust.FileKeyIDs(path)
	if err != nil || len(kids) != 1 {
		t.Fatalf("%s: %v %v", path, kids, err)
	}
	return kids[0]
}

// pubOf is the PEM public key of the private key file at path.
func pubOf(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return keytest.PublicPEM(t, k.(*ecdsa.PrivateKey).Public())
}

// After a rotation, kube-controller-manager is restarted when its flags name
// a file holding the rotated key (whatever its path), then its /healthz
// (self-signed: not verified without a CA) must answer; otherwise not.
func TestRestartControllerManager(t *testing.T) {
	dir := t.TempDir()
	signing := writeKey(t, dir, "sa.key")
	data, _ := os.ReadFile(signing)
	sameKeyElsewhere := filepath.Join(dir, "cm-sa.key")
	if err := os.WriteFile(sameKeyElsewhere, data, 0o600); err != nil {
		t.Fatal(err)
	}
	other := writeKey(t, dir, "other.key")
	bin := filepath.Join(dir, "bin")
	calls := filepath.Join(dir, "calls")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho \"$*\" >>"+calls+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	var healthy atomic.Bool
	var probes atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		probes.Add(1)
		if r.URL.Path != "/healthz" || !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	flags := func(key string) string {
		p := filepath.Join(dir, "kcm-"+filepath.Base(key)+".env")
		body := "KUBE_CONTROLLER_MANAGER_ARGS=\"--kubeconfig=/etc/kubernetes/controller-manager.conf --service-account-private-key-file=" + key + "\"\n"
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(t *testing.T, flagsFile string) error {
		t.Helper()
		_ = os.Remove(calls)
		o, _, err := parseArgs([]string{"rotate-key", "--signing-key", signing, "--controller-manager-flags-file", flagsFile,
			"--controller-manager-health-url", srv.URL + "/healthz", "--health-settle", "10ms", "--health-interval", "5ms", "--health-timeout", "2s"}, env(nil))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		err = (&keyRotation{Env: o.env(&logs, log), o: opts[*rotateKeyCmd](t, o)}).restartControllerManager(context.Background(), log)
		t.Log(logs.String())
		return err
	}
	t.Run("same key at another path: restarted, healthz awaited", func(t *testing.T) {
		healthy.Store(true)
		if err := run(t, flags(sameKeyElsewhere)); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(calls)
		if string(got) != "restart kube-controller-manager.service\n" || probes.Load() == 0 {
			t.Errorf("systemctl calls %q, %d probes", got, probes.Load())
		}
	})
	t.Run("another key: not restarted", func(t *testing.T) {
		if err := run(t, flags(other)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(calls); err == nil {
			t.Error("restarted a controller-manager that signs with another key")
		}
	})
	t.Run("not healthy: exit 7", func(t *testing.T) {
		healthy.Store(false)
		err := run(t, flags(sameKeyElsewhere))
		var ce *codeError
		if !errors.As(err, &ce) || ce.code != ExitHealth {
			t.Fatalf("err %v, want exit %d", err, ExitHealth)
		}
	})
}

// retire-keys refuses (exit 3, names, no token) while a legacy token
// Secret holds a token signed with the retiring key.
func TestLegacyTokenGate(t *testing.T) {
	token := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"OLDKID"}`)) + ".payload.SIGNATURE-NEVER-LOGGED"
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"kind":"SecretList","metadata":{},"items":[{"metadata":{"namespace":"apps","name":"ci-token"},"type":"kubernetes.io/service-account-token","data":{"token":%q}}]}`,
			base64.StdEncoding.EncodeToString([]byte(token)))
	}))
	defer srv.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	conf := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: %q, insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n", srv.URL)
	if err := os.WriteFile(kc, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		kid  string
		want int
	}{
		{[]string{"--kubeconfig", kc}, "OLDKID", ExitPreflight},
		{[]string{"--kubeconfig", kc, "--ignore-legacy-tokens"}, "OLDKID", ExitOK},
		{nil, "OLDKID", ExitOK}, // no kubeconfig: not looked at
		{[]string{"--kubeconfig", kc}, "OTHER", ExitOK},
	} {
		o, _, err := parseArgs(append([]string{"retire-keys"}, tt.args...), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		if got := (&retirer{Env: o.env(&logs, log), o: opts[*retireKeysCmd](t, o)}).legacyTokenGate(context.Background(), tt.kid, log); got != tt.want {
			t.Errorf("%v: exit %d, want %d:\n%s", tt.args, got, tt.want, logs.String())
		}
		if tt.want == ExitPreflight && !strings.Contains(logs.String(), "apps/ci-token") {
			t.Errorf("the Secret is not named:\n%s", logs.String())
		}
		if strings.Contains(logs.String(), "SIGNATURE-NEVER-LOGGED") || strings.Contains(logs.String(), "payload") {
			t.Errorf("a token reached the log:\n%s", logs.String())
		}
	}
}

// The trust record names the key kube-controller-manager signs with when
// --controller-manager-flags-file names its --service-account-private-key-file;
// without the flag it names none.
func TestTrustRecordNamesControllerManagerKey(t *testing.T) {
	dir := t.TempDir()
	apiKey := writeKey(t, dir, "sa.key")
	cmKey := writeKey(t, dir, "cm.key")
	pub := filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(pub, pubOf(t, apiKey), 0o644); err != nil {
		t.Fatal(err)
	}
	apiFlags := filepath.Join(dir, "apiserver.env")
	if err := os.WriteFile(apiFlags, []byte("KUBE_APISERVER_SA_ARGS=\"--service-account-key-file="+pub+" --service-account-signing-key-file="+apiKey+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmFlags := filepath.Join(dir, "kcm.env")
	if err := os.WriteFile(cmFlags, []byte("KUBE_CONTROLLER_MANAGER_ARGS=\"--service-account-private-key-file="+cmKey+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"with the flag", []string{"--controller-manager-flags-file", cmFlags}, keyID(t, cmKey)},
		{"without", nil, ""},
	} {
		o, _, err := parseArgs(append([]string{"restart", "--host", "m1", "--preflight-flags-file", apiFlags}, tt.args...), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := logrus.New()
		log.Out = &logs
		r := restartOf(t, o)
		rec := trustSnapshot(context.Background(), o.env(&logs, log), r.Preflight, r.CMFlagsFiles, log)
		if rec == nil || rec.Signing != keyID(t, apiKey) || rec.ControllerManagerSigning != tt.want {
			t.Errorf("%s: record %+v, want controller-manager key %q\n%s", tt.name, rec, tt.want, logs.String())
		}
	}
}

// retire-keys refuses (exit 3, naming host and key) while any host's trust
// record says its kube-controller-manager signs with the retiring key, and
// keeps it (exit 0) while any host's apiserver does; records without the
// controller-manager's key (older helpers) block nothing.
func TestRetireRefusedWhileControllerManagerSignsWithIt(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := context.Background()
	o, _, err := parseArgs([]string{"retire-keys", "--config", "", "--endpoints", srv.Endpoint, "--host", "m1"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := logrus.New()
	log.Out = &logs
	r := &retirer{Env: o.env(&logs, log), o: opts[*retireKeysCmd](t, o)}
	record := func(host, signing, cm string) {
		rec := trust.Record{Host: host, Trusted: []string{"OLDKID", "NEWKID"}, Signing: signing, ControllerManagerSigning: cm, Time: time.Now()}
		if err := trust.Put(ctx, cli, trust.DefaultPrefix, "", rec); err != nil {
			t.Fatal(err)
		}
	}
	gates := func() int {
		recs, _, err := trust.List(ctx, cli, trust.DefaultPrefix)
		if err != nil {
			t.Fatal(err)
		}
		_, code := r.retireGates(ctx, "OLDKID", recs, log)
		return code
	}
	// An older helper's record: no controller-manager key.
	srv.Put(t, trust.Key(trust.DefaultPrefix, "m3"), `{"host":"m3","trusted":["OLDKID","NEWKID"],"signing":"NEWKID","bundle_sha256":"x","time":"2026-01-01T00:00:00Z"}`)
	record("m1", "NEWKID", "NEWKID")
	record("m2", "NEWKID", "OLDKID")
	if code := gates(); code != ExitPreflight || !strings.Contains(logs.String(), "m2") || !strings.Contains(logs.String(), "OLDKID") {
		t.Fatalf("m2's controller-manager signs with the retiring key: exit %d, want %d naming m2 and OLDKID:\n%s", code, ExitPreflight, logs.String())
	}
	if strings.Contains(logs.String(), "m1,") || strings.Contains(logs.String(), "m3") {
		t.Errorf("a host named whose controller-manager does not sign with the retiring key:\n%s", logs.String())
	}
	logs.Reset()
	record("m2", "NEWKID", "NEWKID")
	if code := gates(); code != ExitOK {
		t.Fatalf("no controller-manager signs with the retiring key: exit %d:\n%s", code, logs.String())
	}
	// Another host's apiserver signs with the key (a shared key, or a
	// reimaged host not restarted yet): kept, naming it, not an error.
	record("m2", "OLDKID", "NEWKID")
	recs, _, err := trust.List(ctx, cli, trust.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if ok, code := r.retireGates(ctx, "OLDKID", recs, log); ok || code != ExitOK || !strings.Contains(logs.String(), "apiserver on m2 signs with it") {
		t.Fatalf("m2's apiserver signs with the retiring key: retire %v exit %d:\n%s", ok, code, logs.String())
	}
}
