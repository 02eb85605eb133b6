package authoring

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/apply"
	"github.com/keysync/confd/internal/pemcheck"
	"github.com/keysync/confd/resource"
)

func runValidate(t *testing.T, confdir, mock string, noop bool, names ...string) (int, string, string) {
	t.Helper()
	var out, logs bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logs)
	code := Validate(context.Background(), ValidateOptions{
		MockData: mock, Settings: apply.Settings{Settings: resource.Settings{ConfDir: confdir}}, Resources: names,
		Noop: noop, Out: &out, Log: log,
	})
	return code, out.String(), logs.String()
}

func TestValidateMockDataForms(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "app.conf")
	dir := writeTree(t, map[string]string{
		"conf.d/app.toml":    "[template]\nsrc = \"app.tmpl\"\ndest = \"" + dest + "\"\nprefix = \"/myapp\"\nkeys = [\"/db\"]\n",
		"templates/app.tmpl": "user={{getv \"/db/user\"}}\n{{range gets \"/db/hosts/*\"}}host={{.Value}}\n{{end}}",
		"flat.json":          `{"/myapp/db/user": "alice", "/myapp/db/hosts/0": "h0", "/myapp/db/hosts/1": "h1", "/other": "x"}`,
		"flat.yaml":          "/myapp/db/user: alice\n/myapp/db/hosts/0: h0\n/myapp/db/hosts/1: h1\n",
		"nested.yaml":        "myapp:\n  db:\n    user: alice\n    hosts: [h0, h1]\n",
		"missing.yaml":       "myapp:\n  db:\n    hosts: [h0]\n",
		"broken.yaml":        "myapp:\n  db: [\n",
	})
	want := "==> " + dest + " (app.toml) <==\nuser=alice\nhost=h0\nhost=h1\n"
	for _, f := range []string{"flat.json", "flat.yaml", "nested.yaml"} {
		code, out, logs := runValidate(t, dir, filepath.Join(dir, f), false)
		if code != 0 || out != want {
			t.Errorf("%s: exit %d, output %q, want %q; log:\n%s", f, code, out, want, logs)
		}
	}
	code, _, logs := runValidate(t, dir, filepath.Join(dir, "missing.yaml"), false)
	if code != 1 || !strings.Contains(logs, "/db/user") || !strings.Contains(logs, "app.toml") {
		t.Errorf("missing key: exit %d, log:\n%s\nwant the key and resource named", code, logs)
	}
	code, _, logs = runValidate(t, dir, filepath.Join(dir, "broken.yaml"), false)
	if code != 1 || !strings.Contains(logs, "broken.yaml") {
		t.Errorf("broken mock data: exit %d, log:\n%s", code, logs)
	}
	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Errorf("validate created %s", dest)
	}
}

// With -noop, Validate prints the change against the live file and still
// writes nothing and runs nothing.
func TestValidateNoopDiffWritesAndRunsNothing(t *testing.T) {
	out := t.TempDir()
	dest := filepath.Join(out, "app.conf")
	marker := filepath.Join(out, "ran")
	if err := os.WriteFile(dest, []byte("user=bob\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := writeTree(t, map[string]string{
		"conf.d/app.toml": "[template]\nsrc = \"app.tmpl\"\ndest = \"" + dest + "\"\nmode = \"0644\"\nkeys = [\"/user\"]\n" +
			"check_cmd = \"touch " + marker + "\"\nreload_cmd = \"touch " + marker + "\"\n",
		"templates/app.tmpl": "user={{getv \"/user\"}}\n",
		"mock.json":          `{"/user": "alice"}`,
		"same.json":          `{"/user": "bob"}`,
	})
	code, got, logs := runValidate(t, dir, filepath.Join(dir, "mock.json"), true)
	if code != 0 || !strings.Contains(got, "-user=bob\n+user=alice\n") || !strings.Contains(got, "--- "+dest) {
		t.Errorf("exit %d, diff:\n%s\nlog:\n%s", code, got, logs)
	}
	code, got, _ = runValidate(t, dir, filepath.Join(dir, "same.json"), true)
	if code != 0 || got != dest+": in sync (app.toml)\n" {
		t.Errorf("in sync: exit %d, %q", code, got)
	}
	if b, _ := os.ReadFile(dest); string(b) != "user=bob\n" {
		t.Errorf("live file changed to %q", b)
	}
	entries, _ := os.ReadDir(out)
	if len(entries) != 1 {
		t.Errorf("%s holds %d entries, want only the live file (no stage file, no command ran)", out, len(entries))
	}
}

func pemOf(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// The example bundle, rendered through its real resource and template,
// does not change when a master re-publishes the same key with CRLF line
// endings, trailing spaces, or as PKCS#1; a published private key fails
// the render with its etcd key named and its body never printed.
func TestExampleBundleIsCanonical(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ek.PublicKey)
	rsaPub, ecPub := pemOf("PUBLIC KEY", rsaDER), pemOf("PUBLIC KEY", ecDER)
	crlfSpaces := func(s string) string { return strings.ReplaceAll(s, "\n", "  \r\n") }
	privDER, _ := x509.MarshalPKCS8PrivateKey(rk)
	priv := pemOf("PRIVATE KEY", privDER)

	const k = "/kubernetes/service-account-keys/"
	render := func(kvs map[string]string) (int, string, string) {
		t.Helper()
		b, _ := json.Marshal(kvs)
		mock := filepath.Join(t.TempDir(), "mock.json")
		if err := os.WriteFile(mock, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return runValidate(t, "../examples/confd", mock, false, "20-sa-bundle")
	}
	code, base, logs := render(map[string]string{k + "master-1": rsaPub, k + "master-2": ecPub})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, logs)
	}
	bundle := strings.SplitN(base, "\n", 2)[1]
	f, err := pemcheck.Parse("bundle", []byte(bundle))
	if err != nil || f.Check(pemcheck.Options{ForbidPrivate: true}) != nil || len(f.Blocks) != 2 {
		t.Fatalf("bundle does not pass the public-only check (%v):\n%s", err, bundle)
	}
	for name, kvs := range map[string]map[string]string{
		"CRLF and trailing spaces": {k + "master-1": crlfSpaces(rsaPub), k + "master-2": crlfSpaces(ecPub)},
		"PKCS#1":                   {k + "master-1": pemOf("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey)), k + "master-2": ecPub},
		"no trailing newline":      {k + "master-1": strings.TrimSpace(rsaPub), k + "master-2": ecPub},
		"published twice":          {k + "master-1": rsaPub, k + "master-2": ecPub, k + "master-3": crlfSpaces(ecPub)},
	} {
		code, got, logs := render(kvs)
		if code != 0 || got != base {
			t.Errorf("%s: exit %d, bundle changed:\n%s\nwant:\n%s\nlog:\n%s", name, code, got, base, logs)
		}
	}
	code, got, logs := render(map[string]string{k + "master-1": rsaPub, k + "master-4": priv})
	if code != 1 || !strings.Contains(logs, k+"master-4") || !strings.Contains(logs, "private key") {
		t.Errorf("private key: exit %d, log:\n%s", code, logs)
	}
	body := strings.Split(priv, "\n")[1]
	if strings.Contains(logs+got, body) {
		t.Errorf("private key material printed")
	}
}
