package template

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kelseyhightower/memkv"
)

// k8sVectorKey and k8sVectorKID are Kubernetes' own key ID test vector
// (TestKeyIDStability in k8s.io/kubernetes pkg/serviceaccount).
const k8sVectorKey = `-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA249XwEo9k4tM8fMxV7zx
OhcrP+WvXn917koM5Qr2ZXs4vo26e4ytdlrV0bQ9SlcLpQVSYjIxNfhTZdDt+ecI
zshKuv1gKIxbbLQMOuK1eA/4HALyEkFgmS/tleLJrhc65tKPMGD+pKQ/xhmzRuCG
51RoiMgbQxaCyYxGfNLpLAZK9L0Tctv9a0mJmGIYnIOQM4kC1A1I1n3EsXMWmeJU
j7OTh/AjjCnMnkgvKT2tpKxYQ59PgDgU8Ssc7RDSmSkLxnrv+OrN80j6xrw0OjEi
B4Ycr0PqfzZcvy8efTtFQ/Jnc4Bp1zUtFXt7+QeevePtQ2EcyELXE0i63T1CujRM
WwIDAQAB
-----END PUBLIC KEY-----
`

const k8sVectorKID = "JHJehTTTZlsspKHT-GaJxK7Kd1NQgZJu3fyK6K_QDYU"

// opensslKey is one key pair written by the openssl CLI in every form a
// master might publish, with its kid computed by openssl alone, the way
// /work/shared/kube-apiserver-for-tests.md measured kube-apiserver's kid.
type opensslKey struct {
	kid   string
	forms map[string]string // form name -> PEM text
}

func openssl(t *testing.T, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func readT(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newOpensslKey(t *testing.T, genArgs ...string) opensslKey {
	t.Helper()
	dir := t.TempDir()
	openssl(t, dir, append([]string{"genpkey", "-out", "k.pem"}, genArgs...)...)
	openssl(t, dir, "pkey", "-in", "k.pem", "-pubout", "-out", "pub.pem")
	// A leaf: `openssl req -x509` marks its certificate CA:TRUE with
	// keyCertSign unless told otherwise, and a CA's key is dropped from
	// the bundle (issue 34), which TestPublicKeysDropsCA covers.
	openssl(t, dir, "req", "-new", "-x509", "-key", "k.pem", "-subj", "/CN=sa", "-days", "2",
		"-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=critical,digitalSignature", "-out", "cert.pem")
	der := openssl(t, dir, "pkey", "-pubin", "-in", "pub.pem", "-outform", "DER")
	if err := os.WriteFile(filepath.Join(dir, "pub.der"), der, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := openssl(t, dir, "dgst", "-sha256", "-binary", "pub.der")
	if err := os.WriteFile(filepath.Join(dir, "sum"), sum, 0o600); err != nil {
		t.Fatal(err)
	}
	b64 := strings.TrimSpace(string(openssl(t, dir, "base64", "-A", "-in", "sum")))
	kid := strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(b64), "=")
	k := opensslKey{kid: kid, forms: map[string]string{
		"PKIX public key":         readT(t, filepath.Join(dir, "pub.pem")),
		"certificate":             readT(t, filepath.Join(dir, "cert.pem")),
		"PKCS#8 private key":      readT(t, filepath.Join(dir, "k.pem")),
		"traditional private key": string(openssl(t, dir, "pkey", "-in", "k.pem", "-traditional")),
	}}
	if genArgs[1] == "RSA" {
		k.forms["PKCS#1 public key"] = string(openssl(t, dir, "rsa", "-in", "k.pem", "-RSAPublicKey_out"))
	}
	return k
}

func TestKeyIDMatchesKubernetes(t *testing.T) {
	got, err := keyID(k8sVectorKey)
	if err != nil || got != k8sVectorKID {
		t.Fatalf("keyID(Kubernetes vector) = %q, %v; want %q", got, err, k8sVectorKID)
	}
	for name, gen := range map[string][]string{
		"RSA 2048":    {"-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"},
		"ECDSA P-256": {"-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"},
		"ECDSA P-384": {"-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"},
	} {
		k := newOpensslKey(t, gen...)
		for form, pemText := range k.forms {
			got, err := keyID(pemText)
			if err != nil || got != k.kid {
				t.Errorf("%s %s: keyID = %q, %v; want openssl's %q", name, form, got, err, k.kid)
			}
		}
	}
}

func TestPEMNormalizeCanonical(t *testing.T) {
	k := newOpensslKey(t, "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
	want := k.forms["PKIX public key"]
	pub := k.forms["PKIX public key"]
	variants := map[string]string{
		"as written":       pub,
		"CRLF":             strings.ReplaceAll(pub, "\n", "\r\n"),
		"trailing spaces":  strings.ReplaceAll(pub, "\n", "  \n"),
		"no final newline": strings.TrimSuffix(pub, "\n"),
		"blank lines":      "\n\n" + pub + "\n\n",
		"PKCS#1":           k.forms["PKCS#1 public key"],
		"PKCS#1 CRLF":      strings.ReplaceAll(k.forms["PKCS#1 public key"], "\n", "\r\n"),
		"certificate":      k.forms["certificate"],
		"76 columns":       rewrap(t, pub, 76),
	}
	for name, v := range variants {
		got, err := pemNormalize(v)
		if err != nil || got != want {
			t.Errorf("%s: pemNormalize = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, form := range []string{"PKCS#8 private key", "traditional private key"} {
		_, err := pemNormalize(k.forms[form])
		if err == nil || !strings.Contains(err.Error(), "private key") {
			t.Errorf("%s: pemNormalize error = %v, want a private key refusal", form, err)
		}
		assertNoKeyMaterial(t, err, k.forms[form])
	}
}

// rewrap re-encodes a PEM block's base64 at another width, as some tools do.
func rewrap(t *testing.T, p string, width int) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(p), "\n")
	body := strings.Join(lines[1:len(lines)-1], "")
	var b strings.Builder
	b.WriteString(lines[0] + "\n")
	for len(body) > width {
		b.WriteString(body[:width] + "\n")
		body = body[width:]
	}
	b.WriteString(body + "\n" + lines[len(lines)-1] + "\n")
	return b.String()
}

func assertNoKeyMaterial(t *testing.T, err error, secret string) {
	t.Helper()
	if err == nil {
		return
	}
	for _, line := range strings.Split(secret, "\n") {
		if len(line) > 20 && !strings.HasPrefix(line, "-----") && strings.Contains(err.Error(), line) {
			t.Fatalf("error quotes key material: %v", err)
		}
	}
}

func TestPEMBlocks(t *testing.T) {
	rk := newOpensslKey(t, "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
	ek := newOpensslKey(t, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
	value := rk.forms["certificate"] + rk.forms["PKCS#1 public key"] + ek.forms["PKIX public key"]
	bs, err := pemBlocks(value)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range bs {
		got = append(got, b.Type+"/"+b.Kind)
	}
	want := []string{"CERTIFICATE/certificate", "RSA PUBLIC KEY/public key", "PUBLIC KEY/public key"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("pemBlocks types = %q, want %q", got, want)
	}
	// Each block re-armoured is the block as written.
	if bs[1].String() != rk.forms["PKCS#1 public key"] || bs[2].String() != ek.forms["PKIX public key"] {
		t.Errorf("blocks do not re-encode to their input:\n%s%s", bs[1], bs[2])
	}
	if id, err := keyID(bs[0]); err != nil || id != rk.kid {
		t.Errorf("keyID(certificate block) = %q, %v; want %q", id, err, rk.kid)
	}
	for _, bad := range []string{"", "garbage", rk.forms["PKIX public key"] + "trailing paste"} {
		if _, err := pemBlocks(bad); err == nil {
			t.Errorf("pemBlocks(%q) succeeded", bad)
		}
	}
	if _, err := keyID(value); err == nil || !strings.Contains(err.Error(), "more than one key") {
		t.Errorf("keyID of two keys: err = %v", err)
	}
}

func TestPublicKeys(t *testing.T) {
	a := newOpensslKey(t, "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
	b := newOpensslKey(t, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
	kvs := memkv.KVPairs{
		{Key: "/sa/m1", Value: a.forms["PKIX public key"]},
		{Key: "/sa/m2", Value: b.forms["PKIX public key"]},
		{Key: "/sa/m3", Value: strings.ReplaceAll(a.forms["PKCS#1 public key"], "\n", "\r\n")},
	}
	keys, err := publicKeys(nil, kvs)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("publicKeys = %d keys, want 2 (m1 and m3 are one key)", len(keys))
	}
	if keys[0].KeyID > keys[1].KeyID {
		t.Errorf("not sorted by key ID: %s, %s", keys[0].KeyID, keys[1].KeyID)
	}
	for _, k := range keys {
		switch k.KeyID {
		case a.kid:
			if k.PEM != a.forms["PKIX public key"] || strings.Join(k.Sources, ",") != "/sa/m1,/sa/m3" {
				t.Errorf("key a = %+v", k)
			}
		case b.kid:
			if k.PEM != b.forms["PKIX public key"] || strings.Join(k.Sources, ",") != "/sa/m2" {
				t.Errorf("key b = %+v", k)
			}
		default:
			t.Errorf("unexpected key ID %s", k.KeyID)
		}
	}
	// Plain strings (getvs) and several arguments work too, in any order.
	again, err := publicKeys(nil, []string{b.forms["PKIX public key"]}, a.forms["PKCS#1 public key"])
	if err != nil || len(again) != 2 || again[0].PEM != keys[0].PEM || again[1].PEM != keys[1].PEM {
		t.Errorf("publicKeys(strings) = %+v, %v", again, err)
	}
	// A published certificate is its public key: one key with the same key
	// published bare, rendered as the bare key; alone, still that key.
	withCert, err := publicKeys(nil, append(kvs, memkv.KVPair{Key: "/sa/m5", Value: a.forms["certificate"]}))
	if err != nil || len(withCert) != 2 {
		t.Fatalf("publicKeys with a certificate = %+v, %v; want the 2 keys", withCert, err)
	}
	for _, k := range withCert {
		if k.KeyID == a.kid && (k.PEM != a.forms["PKIX public key"] || strings.Join(k.Sources, ",") != "/sa/m1,/sa/m3,/sa/m5") {
			t.Errorf("certificate not merged with its bare key: %+v", k)
		}
	}
	certOnly, err := publicKeys(nil, a.forms["certificate"]+b.forms["certificate"])
	if err != nil || len(certOnly) != 2 || certOnly[0].PEM != keys[0].PEM || certOnly[1].PEM != keys[1].PEM {
		t.Errorf("publicKeys(certificates) = %+v, %v; want their keys", certOnly, err)
	}
	// A published private key fails, naming its key and never quoting it.
	kvs = append(kvs, memkv.KVPair{Key: "/sa/m4", Value: b.forms["PKCS#8 private key"]})
	_, err = publicKeys(nil, kvs)
	if err == nil || !strings.Contains(err.Error(), "/sa/m4") || !strings.Contains(err.Error(), "private key") {
		t.Fatalf("publicKeys with a private key: err = %v", err)
	}
	assertNoKeyMaterial(t, err, b.forms["PKCS#8 private key"])
}

// The functions are reachable from templates under their documented names.
func TestPEMFuncsInTemplates(t *testing.T) {
	a := newOpensslKey(t, "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
	src := filepath.Join(t.TempDir(), "t.tmpl")
	tmpl := `{{range publicKeys (gets "/sa/*")}}{{.KeyID}} {{keyID .}}
{{.}}{{end}}{{range pemBlocks (getv "/sa/x")}}{{.Type}} {{len .Bytes}}
{{end}}{{pemNormalize (getv "/sa/x")}}`
	if err := os.WriteFile(src, []byte(tmpl), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := Render(src, map[string]string{"/sa/x": strings.ReplaceAll(a.forms["PKIX public key"], "\n", "\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	pub := a.forms["PKIX public key"]
	want := a.kid + " " + a.kid + "\n" + pub + "PUBLIC KEY 91\n" + pub
	if string(out) != want {
		t.Fatalf("rendered %q, want %q", out, want)
	}
}
