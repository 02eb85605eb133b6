package template

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	kvstore "github.com/keysync/confd/store"
)

// testKeyring writes an armoured secret keyring as `gpg --export-secret-keys
// --armor` would, and returns its path and the entity to encrypt to.
func testKeyring(t testing.TB, cfg *packet.Config) (string, *openpgp.Entity) {
	t.Helper()
	e, err := openpgp.NewEntity("confd test", "", "confd@example.com", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	w, err := armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, cfg); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "secring.asc")
	if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, e
}

// secconfEncode is the encoding of confd's `crypt set` (xordataexchange/
// crypt's secconf.Encode): base64(OpenPGP(gzip(value))), written here from
// that description.
func secconfEncode(t testing.TB, to *openpgp.Entity, value string) string {
	t.Helper()
	var b bytes.Buffer
	enc := base64.NewEncoder(base64.StdEncoding, &b)
	pw, err := openpgp.Encrypt(enc, openpgp.EntityList{to}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(pw)
	if _, err := zw.Write([]byte(value)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []interface{ Close() error }{zw, pw, enc} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

func renderWith(t *testing.T, src string, kvs map[string]string, opts ...Options) (string, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "crypt.tmpl")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := Render(p, kvs, opts...)
	return string(out), err
}

func TestCryptFunctionsDecryptConfdValues(t *testing.T) {
	for name, cfg := range map[string]*packet.Config{
		"default (EdDSA/ECDH)":          nil,
		"RSA 2048 (gpg's classic keys)": {Algorithm: packet.PubKeyAlgoRSA, RSABits: 2048},
	} {
		t.Run(name, func(t *testing.T) {
			ring, e := testKeyring(t, cfg)
			kr, err := ReadKeyring(ring)
			if err != nil {
				t.Fatal(err)
			}
			kvs := map[string]string{
				"/crypt/db/pass": secconfEncode(t, e, "s3cret-pass"),
				"/crypt/db/user": secconfEncode(t, e, "admin"),
				"/plain":         "visible",
			}
			src := `{{with cget "/crypt/db/pass"}}{{.Key}}={{.Value}}{{end}}
{{cgetv "/crypt/db/user"}}
{{range cgets "/crypt/db/*"}}{{.Key}}:{{.Value}} {{end}}
{{range cgetvs "/crypt/db/*"}}[{{.}}]{{end}}
{{getv "/plain"}}
{{range gets "/crypt/db/*"}}{{.Value}} {{end}}
`
			got, err := renderWith(t, src, kvs, Options{Keyring: kr})
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(got, "\n")
			if lines[0] != "/crypt/db/pass=s3cret-pass" || lines[1] != "admin" ||
				lines[2] != "/crypt/db/pass:s3cret-pass /crypt/db/user:admin " || lines[4] != "visible" {
				t.Errorf("rendered:\n%s", got)
			}
			// cgets decrypts into a list of its own: gets, which may hand out
			// the store's own pairs, still sees what is stored.
			if want := kvs["/crypt/db/pass"] + " " + kvs["/crypt/db/user"] + " "; lines[5] != want {
				t.Errorf("gets after cgets = %q, want the stored values %q", lines[5], want)
			}
			// getvs (and so cgetvs) orders by stored (encrypted) value, as confd.
			if l := lines[3]; l != "[s3cret-pass][admin]" && l != "[admin][s3cret-pass]" {
				t.Errorf("cgetvs line = %q", l)
			}
		})
	}
}

func TestCryptFunctionErrorsNameTheProblemNotTheValue(t *testing.T) {
	ring, e := testKeyring(t, nil)
	kr, err := ReadKeyring(ring)
	if err != nil {
		t.Fatal(err)
	}
	_, other := testKeyring(t, nil)
	notB64 := "this-is-not-base64-but-a-secret!"
	kvs := map[string]string{
		"/mine":   secconfEncode(t, e, "top-secret-1"),
		"/theirs": secconfEncode(t, other, "top-secret-2"),
		"/plain":  notB64,
	}
	for _, tc := range []struct {
		src, want string
		kr        *Keyring
	}{
		{`{{cgetv "/mine"}}`, `cgetv "/mine": needs -secret-keyring`, nil},
		{`{{cget "/theirs"}}`, `cget "/theirs": not an OpenPGP message for -secret-keyring`, kr},
		{`{{cgetv "/plain"}}`, `cgetv "/plain": not an OpenPGP message`, kr},
		{`{{cgetvs "/*"}}`, `cgetvs "/*": not an OpenPGP message`, kr},
		{`{{cgetv "/missing"}}`, `key does not exist: /missing`, kr},
	} {
		got, err := renderWith(t, tc.src, kvs, Options{Keyring: tc.kr})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q (output %q)", tc.src, err, tc.want, got)
			continue
		}
		for _, secret := range []string{"top-secret", notB64, kvs["/mine"][:20], kvs["/theirs"][:20]} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("%s: error carries %q: %v", tc.src, secret, err)
			}
		}
	}
}

func TestReadKeyringErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	pubOnly := filepath.Join(dir, "pub.asc")
	_, e := testKeyring(t, nil)
	var b bytes.Buffer
	w, _ := armor.Encode(&b, openpgp.PublicKeyType, nil)
	_ = e.Serialize(w)
	_ = w.Close()
	_ = os.WriteFile(pubOnly, b.Bytes(), 0o644)
	garbage := filepath.Join(dir, "garbage.asc")
	_ = os.WriteFile(garbage, []byte("password=hunter2\n"), 0o600)
	for path, want := range map[string]string{
		filepath.Join(dir, "absent.asc"): "no such file",
		pubOnly:                          "holds no secret key",
		garbage:                          "not an armored OpenPGP keyring",
	} {
		_, err := ReadKeyring(path)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ReadKeyring(%s) = %v, want %q", path, err, want)
		}
	}
}

// TestCryptFuncsFindTheStoreFunctions guards the coupling to FuncMap: if
// get/gets/getv/getvs change type, the crypt functions would only fail.
func TestCryptFuncsFindTheStoreFunctions(t *testing.T) {
	got, err := renderWith(t, `{{cgetv "/x"}}`, map[string]string{"/x": "v"})
	if err == nil || !strings.Contains(err.Error(), "needs -secret-keyring") {
		t.Fatalf("cgetv without keyring = %q, %v; want the -secret-keyring error (store functions not found?)", got, err)
	}
}

// TestFuncMapDefinesCryptFunctions: every parse of a template (a render,
// or a check of its syntax) knows the crypt functions.
func TestFuncMapDefinesCryptFunctions(t *testing.T) {
	m := FuncMap(kvstore.New(nil))
	for _, name := range []string{"cget", "cgets", "cgetv", "cgetvs"} {
		if m[name] == nil {
			t.Errorf("FuncMap lacks %s", name)
		}
	}
}

// TestCryptDecryptsGnuPGKeyrings uses the real tools of confd users: a
// keyring made and exported by gpg, and a value encrypted by gpg as
// base64(gpg --encrypt(gzip(value))). Skipped without gpg.
func TestCryptDecryptsGnuPGKeyrings(t *testing.T) {
	if _, err := exec.LookPath("gpg"); err != nil {
		t.Skip("no gpg on this machine")
	}
	// default: ed25519 with a cv25519 subkey; rsa2048: one RSA key that
	// also encrypts, as older confd set-ups made them.
	for algo, usage := range map[string]string{"default": "default", "rsa2048": "sign,encr"} {
		t.Run(algo, func(t *testing.T) {
			home := t.TempDir()
			gpg := func(stdin []byte, args ...string) []byte {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, "gpg", append([]string{"--batch", "--quiet"}, args...)...)
				cmd.Env = append(os.Environ(), "GNUPGHOME="+home)
				cmd.Stdin = bytes.NewReader(stdin)
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("gpg %v: %v", args, err)
				}
				return out
			}
			t.Cleanup(func() {
				cmd := exec.CommandContext(context.Background(), "gpgconf", "--kill", "gpg-agent")
				cmd.Env = append(os.Environ(), "GNUPGHOME="+home)
				_ = cmd.Run()
			})
			gpg(nil, "--passphrase", "", "--quick-gen-key", "confd test <confd@example.com>", algo, usage, "never")
			ring := filepath.Join(t.TempDir(), "secring.asc")
			if err := os.WriteFile(ring, gpg(nil, "--export-secret-keys", "--armor", "confd@example.com"), 0o600); err != nil {
				t.Fatal(err)
			}
			var gz bytes.Buffer
			zw := gzip.NewWriter(&gz)
			_, _ = zw.Write([]byte("s3cret-from-gpg"))
			_ = zw.Close()
			enc := gpg(gz.Bytes(), "--trust-model", "always", "--recipient", "confd@example.com", "--encrypt")
			kr, err := ReadKeyring(ring)
			if err != nil {
				t.Fatal(err)
			}
			got, err := renderWith(t, `{{cgetv "/v"}}`, map[string]string{"/v": base64.StdEncoding.EncodeToString(enc)}, Options{Keyring: kr})
			if err != nil || got != "s3cret-from-gpg" {
				t.Fatalf("cgetv = %q, %v", got, err)
			}
		})
	}
}
