package integration

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/etcdtest"
)

// exampleConfdir copies examples/confd as the demo does: destinations
// under out, the real check, and a reload_cmd that records each run. The
// check reads the trust records from the etcd at endpoint, named in
// out/safe-restart.toml as /etc/kubernetes/safe-restart.toml names it.
func exampleConfdir(t *testing.T, endpoint string) (dir, out, reloads string) {
	t.Helper()
	dir, out = t.TempDir(), t.TempDir()
	reloads = filepath.Join(t.TempDir(), "reloads")
	src := filepath.Join(etcdtest.RepoRoot(), "examples", "confd")
	for _, sub := range []string{"conf.d", "templates"} {
		entries, err := os.ReadDir(filepath.Join(src, sub))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			body := readFile(t, filepath.Join(src, sub, e.Name()))
			body = strings.ReplaceAll(body, "/etc/kubernetes/", out+"/")
			body = strings.ReplaceAll(body, "/usr/local/bin/kube-apiserver-safe-restart", restartBin)
			body = regexp.MustCompile(`(?m)^owner.*$`).ReplaceAllString(body, "")
			body = regexp.MustCompile(`(?m)^reload_cmd .*$`).ReplaceAllString(body, `reload_cmd = "echo reload >> `+reloads+`"`)
			if err := os.WriteFile(filepath.Join(dir, sub, e.Name()), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(out, "pki"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "safe-restart.toml"), []byte("endpoints = [\""+endpoint+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, out, reloads
}

// A master re-publishing its unchanged key in another encoding must not
// change the bundle, so nothing restarts (the held-out scenario of issue 11,
// against a real etcd and the example resource, template and check).
func TestExampleBundleRepublishRestartsNothing(t *testing.T) {
	s := etcdtest.Start(t)
	dir, out, reloads := exampleConfdir(t, s.Endpoint)
	k1, _ := rsa.GenerateKey(rand.Reader, 2048)
	k2, _ := rsa.GenerateKey(rand.Reader, 2048)
	enc := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	pkix := func(k *rsa.PrivateKey) string {
		der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		return enc("PUBLIC KEY", der)
	}
	// This master signs with k1: the bundle's check requires its public half.
	p1, _ := x509.MarshalPKCS8PrivateKey(k1)
	if err := os.WriteFile(filepath.Join(out, "pki", "sa.key"), []byte(enc("PRIVATE KEY", p1)), 0o600); err != nil {
		t.Fatal(err)
	}
	const prefix = "/kubernetes/service-account-keys/"
	s.Put(t, prefix+"master-1", pkix(k1))
	s.Put(t, prefix+"master-2", pkix(k2))
	args := append(nodeArgs(t, s), "-onetime", "-confdir", dir, "-resource", "20-sa-bundle")
	if r := confd(t, nil, args...); r.code != 0 {
		t.Fatalf("first render: exit %d\n%s", r.code, r.stderr)
	}
	bundle := filepath.Join(out, "pki", "sa-bundle.pem")
	want := readFile(t, bundle)
	if strings.Count(want, "BEGIN PUBLIC KEY") != 2 || readFile(t, reloads) != "reload\n" {
		t.Fatalf("bundle:\n%s\nreloads %q", want, readFile(t, reloads))
	}
	for name, value := range map[string]string{
		"CRLF line endings": strings.ReplaceAll(pkix(k1), "\n", "\r\n"),
		"trailing spaces":   strings.ReplaceAll(pkix(k1), "\n", "   \n"),
		"CRLF and spaces":   strings.ReplaceAll(pkix(k1), "\n", " \t\r\n"),
		"PKCS#1":            enc("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&k1.PublicKey)),
	} {
		s.Put(t, prefix+"master-1", value)
		if r := confd(t, nil, args...); r.code != 0 {
			t.Fatalf("%s: exit %d\n%s", name, r.code, r.stderr)
		}
		if got := readFile(t, bundle); got != want {
			t.Errorf("%s: bundle changed:\n%s", name, got)
		}
		if got := readFile(t, reloads); got != "reload\n" {
			t.Errorf("%s: reload_cmd ran again (%q)", name, got)
		}
	}
	// A published private key fails the render; the bundle stays.
	s.Put(t, prefix+"master-3", enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k2)))
	r := confd(t, nil, args...)
	if r.code != 1 || !strings.Contains(r.stderr, prefix+"master-3") || readFile(t, bundle) != want {
		t.Errorf("private key: exit %d\n%s", r.code, r.stderr)
	}
	if body := strings.Split(enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k2)), "\n")[1]; strings.Contains(r.stderr+r.stdout, body) {
		t.Error("private key material in confd's output")
	}
}

// The shipped binary checks and renders the example confdir with no etcd
// reachable.
func TestCheckConfigAndValidateWithoutEtcd(t *testing.T) {
	node := etcdtest.UnusedEndpoint(t)
	dir, out, _ := exampleConfdir(t, node)
	empty := filepath.Join(t.TempDir(), "confd.toml")
	if err := os.WriteFile(empty, []byte("nodes = [\""+node+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := confd(t, nil, "--check-config", "-config-file", empty, "-confdir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "OK: 2 resource(s)") {
		t.Errorf("-check-config: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	k, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	pub := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	mock := filepath.Join(t.TempDir(), "mock.yaml")
	yaml := "kubernetes:\n  service-account-keys:\n    master-1: |\n      " + strings.ReplaceAll(strings.TrimSpace(pub), "\n", "\n      ") + "\n"
	if err := os.WriteFile(mock, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r = confd(t, nil, "-validate", "-mock-data", mock, "-config-file", empty, "-confdir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, pub) || !strings.Contains(r.stdout, "# Masters: master-1") {
		t.Errorf("-validate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if entries, _ := os.ReadDir(filepath.Join(out, "pki")); len(entries) != 0 {
		t.Errorf("-validate wrote %d files", len(entries))
	}
	if err := os.WriteFile(filepath.Join(dir, "templates", "sa-bundle.pem.tmpl"), []byte("{{range publicKey (gets \"/k/*\")}}\n{{end}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = confd(t, nil, "-check-config", "-config-file", empty, "-confdir", dir)
	if r.code != 1 || !strings.Contains(r.stdout, "sa-bundle.pem.tmpl:1: function \"publicKey\" not defined") {
		t.Errorf("-check-config, broken template: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
