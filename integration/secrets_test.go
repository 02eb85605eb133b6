package integration

import (
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"

	"github.com/keysync/confd/internal/etcdtest"
)

// privateKeyForms returns freshly generated private keys in each form the
// redaction must catch: PKCS#1, PKCS#8, SEC1 EC, OpenSSH, an OpenPGP
// secret key block, and a PKCS#8 key inside a JSON document (escaped \n).
func privateKeyForms(t *testing.T) map[string]string {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p8, _ := x509.MarshalPKCS8PrivateKey(rk)
	sec1, _ := x509.MarshalECPrivateKey(ek)
	sshBody := make([]byte, 400)
	_, _ = rand.Read(sshBody)
	enc := func(typ string, b []byte) string { return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})) }
	forms := map[string]string{
		"pkcs1":   enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk)),
		"pkcs8":   enc("PRIVATE KEY", p8),
		"ec":      enc("EC PRIVATE KEY", sec1),
		"openssh": enc("OPENSSH PRIVATE KEY", sshBody),
	}
	_, pgp := pgpKey(t)
	forms["pgp"] = pgp
	j, _ := json.Marshal(map[string]string{"kid": "k1", "private_key": forms["pkcs8"]})
	forms["json"] = string(j) + "\n"
	return forms
}

// pgpKey returns an OpenPGP entity and its armoured secret key block.
func pgpKey(t *testing.T) (*openpgp.Entity, string) {
	t.Helper()
	e, err := openpgp.NewEntity("confd test", "", "confd@example.com", nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	w, _ := armor.Encode(&b, openpgp.PrivateKeyType, nil)
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	return e, b.String()
}

// secretPieces are 12-character pieces of every body line of the forms:
// none may appear in any output.
func secretPieces(forms map[string]string) []string {
	var out []string
	for _, f := range forms {
		for _, l := range strings.FieldsFunc(f, func(r rune) bool { return r == '\n' || r == '"' || r == '\\' }) {
			if strings.Contains(l, "-----") || strings.Contains(l, ":") || len(l) < 14 {
				continue
			}
			out = append(out, l[1:13]) // skip a possible "n" of an escaped "\n"
		}
	}
	return out
}

func assertNoSecrets(t *testing.T, what, out string, pieces []string) {
	t.Helper()
	for _, p := range pieces {
		if strings.Contains(out, p) {
			i := strings.Index(out, p)
			t.Errorf("%s carries key material %q near:\n%s", what, p, out[max(0, i-200):min(len(out), i+100)])
			return
		}
	}
}

// TestPrivateKeysNeverReachOutput puts private keys in every form into
// etcd, renders them into files whose check_cmd prints them through
// diff -u and diff (the +, -, > and < prefixes), whose template fails on
// one (atoi of a key), and previews them with -noop; stdout and stderr of
// the built confd, in both log formats, must carry none of their bytes.
func TestPrivateKeysNeverReachOutput(t *testing.T) {
	s := etcdtest.Start(t)
	forms := privateKeyForms(t)
	pieces := secretPieces(forms)
	names := make([]string, 0, len(forms))
	for name, f := range forms {
		s.Put(t, "/keys/"+name, f)
		names = append(names, name)
	}
	sort.Strings(names)
	c := newConfdir(t)
	var dests []string
	for _, name := range names {
		for _, variant := range []struct{ suffix, mode, check string }{
			{"-diffu", "0644", "diff -u {{.dest}} {{.src}}; exit 1"},
			{"-diff", "0644", "diff {{.dest}} {{.src}}; exit 1"},
			{"-private", "0600", "cat {{.src}}; exit 1"},
		} {
			res := name + variant.suffix
			dest := c.resource(res, fmt.Sprintf("[template]\nsrc = %q\ndest = \"DEST\"\nkeys = [\"/keys\"]\nmode = %q\ncheck_cmd = %q\n",
				res+".tmpl", variant.mode, variant.check), fmt.Sprintf("# %s\n{{getv \"/keys/%s\"}}", res, name))
			// A live file with another key in it, so that both the
			// removed and the added lines of a diff hold key material.
			other := forms[names[(sortIndex(names, name)+1)%len(names)]]
			if err := os.WriteFile(dest, []byte("# old\n"+other), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dest, mustMode(variant.mode)); err != nil {
				t.Fatal(err)
			}
			dests = append(dests, dest)
		}
	}
	c.resource("atoi", "[template]\nsrc = \"atoi.tmpl\"\ndest = \"DEST\"\nkeys = [\"/keys\"]\n", `{{atoi (getv "/keys/pkcs1")}}`)
	c.resource("jsonerr", "[template]\nsrc = \"jsonerr.tmpl\"\ndest = \"DEST\"\nkeys = [\"/keys\"]\n", `{{json (getv "/keys/ec")}}`)

	base := append(nodeArgs(t, s), "-confdir", c.Dir, "-log-level", "debug")
	runs := map[string][]string{
		"onetime text":             append(append([]string{}, base...), "-onetime"),
		"onetime json":             append(append([]string{}, base...), "-onetime", "-log-format", "json"),
		"onetime keep-stage-file":  append(append([]string{}, base...), "-onetime", "-keep-stage-file"),
		"noop":                     append(append([]string{}, base...), "-onetime", "-noop"),
		"noop json":                append(append([]string{}, base...), "-onetime", "-noop", "-log-format", "json"),
		"noop -noop-show-secrets":  append(append([]string{}, base...), "-onetime", "-noop", "-noop-show-secrets"),
		"noop --noop-show-secrets": append(append([]string{}, base...), "--onetime", "--noop", "--noop-show-secrets"),
	}
	for name, args := range runs {
		r := confd(t, nil, args...)
		if r.code != 1 {
			t.Errorf("%s: exit %d, want 1 (failed checks and renders)", name, r.code)
		}
		assertNoSecrets(t, name+" stderr", r.stderr, pieces)
		assertNoSecrets(t, name+" stdout", r.stdout, pieces)
		// The test must see the paths it guards.
		wants := []string{"check_cmd failed", "atoi", "json"}
		if strings.HasPrefix(name, "noop") {
			wants = []string{"atoi", "--- " + dests[0]}
		}
		all := r.stdout + r.stderr
		for _, w := range wants {
			if !strings.Contains(all, w) {
				t.Errorf("%s: output lacks %q:\n%s", name, w, all)
			}
		}
		if strings.HasPrefix(name, "noop") {
			private := dests[2] // the first -private resource
			shown := strings.Contains(r.stdout, "--- "+private)
			if shown != strings.Contains(name, "show-secrets") {
				t.Errorf("%s: diff of the 0600 file shown = %v:\n%s", name, shown, r.stdout)
			}
			if !shown && !strings.Contains(r.stdout, private+": ") {
				t.Errorf("%s: no line counts for the 0600 file:\n%s", name, r.stdout)
			}
		}
	}
	for _, d := range dests {
		if strings.HasPrefix(readFile(t, d), "# old\n") == false {
			t.Errorf("%s replaced although its check failed", d)
		}
	}
}

func sortIndex(list []string, s string) int {
	return sort.SearchStrings(list, s)
}

func mustMode(s string) os.FileMode {
	var m uint32
	_, _ = fmt.Sscanf(s, "%o", &m)
	return os.FileMode(m)
}

// TestSecretKeyringDecryptsCryptValues stores values as confd 0.16's
// `crypt set` does and renders them with cgetv/cget/cgets/cgetvs through
// the built binary, with -secret-keyring as flag and as confd.toml key.
func TestSecretKeyringDecryptsCryptValues(t *testing.T) {
	s := etcdtest.Start(t)
	e, armored := pgpKey(t)
	ring := filepath.Join(t.TempDir(), "secring.asc")
	if err := os.WriteFile(ring, []byte(armored), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"/crypt/db/pass": "s3cret-pass", "/crypt/db/user": "admin"} {
		s.Put(t, k, secconf(t, e, v))
	}
	c := newConfdir(t)
	dest := c.resource("crypt", "[template]\nsrc = \"crypt.tmpl\"\ndest = \"DEST\"\nkeys = [\"/crypt\"]\nmode = \"0600\"\n",
		`pass={{cgetv "/crypt/db/pass"}}
{{with cget "/crypt/db/user"}}{{.Key}}={{.Value}}{{end}}
{{range cgets "/crypt/db/*"}}{{base .Key}} {{end}}
`)
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir, "-secret-keyring", ring)...)
	if r.code != 0 {
		t.Fatalf("exit %d:\n%s", r.code, r.stderr)
	}
	if got, want := readFile(t, dest), "pass=s3cret-pass\n/crypt/db/user=admin\npass user \n"; got != want {
		t.Errorf("rendered %q, want %q", got, want)
	}
	assertNoSecrets(t, "stderr", r.stderr, secretPieces(map[string]string{"pgp": armored}))

	// confd.toml's secret_keyring; a wrong keyring fails the resource
	// without printing the value; a missing one is named at start.
	cfg := filepath.Join(t.TempDir(), "confd.toml")
	_, other := pgpKey(t)
	otherRing := filepath.Join(t.TempDir(), "other.asc")
	_ = os.WriteFile(otherRing, []byte(other), 0o600)
	_ = os.WriteFile(cfg, []byte(fmt.Sprintf("backend = \"etcdv3\"\nnodes = [%q]\nsecret_keyring = %q\n", s.Endpoint, otherRing)), 0o600)
	_ = os.Remove(dest)
	r = confd(t, nil, "-onetime", "-confdir", c.Dir, "-config-file", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, `cgetv "/crypt/db/pass"`) || strings.Contains(r.stderr, "s3cret") {
		t.Errorf("wrong keyring: exit %d:\n%s", r.code, r.stderr)
	}
	r = confd(t, nil, "-onetime", "-confdir", c.Dir, "-config-file", cfg, "-secret-keyring", "/nonexistent/ring.asc")
	if r.code != 2 || !strings.Contains(r.stderr, "-secret-keyring") || !strings.Contains(r.stderr, "/nonexistent/ring.asc") {
		t.Errorf("missing keyring: exit %d:\n%s", r.code, r.stderr)
	}
}

// secconf is confd's crypt encoding: base64(OpenPGP(gzip(value))).
func secconf(t *testing.T, to *openpgp.Entity, value string) string {
	t.Helper()
	var b bytes.Buffer
	b64 := base64.NewEncoder(base64.StdEncoding, &b)
	pw, err := openpgp.Encrypt(b64, openpgp.EntityList{to}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(pw)
	_, _ = zw.Write([]byte(value))
	for _, c := range []interface{ Close() error }{zw, pw, b64} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// TestUnknownResourceKeyFailsOnlyThatResource: a misspelt check_cmd must
// not let unchecked content go live.
func TestUnknownResourceKeyFailsOnlyThatResource(t *testing.T) {
	s := etcdtest.Start(t)
	s.Put(t, "/k/v", "value")
	c := newConfdir(t)
	good := c.resource("good", "[template]\nsrc = \"good.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\n", `{{getv "/k/v"}}`)
	typo := c.resource("typo", "[template]\nsrc = \"typo.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\ncheckcmd = \"false\"\n", `{{getv "/k/v"}}`)
	above := c.resource("above", "check_cmd = \"false\"\n[template]\nsrc = \"above.tmpl\"\ndest = \"DEST\"\nkeys = [\"/k\"]\n", `{{getv "/k/v"}}`)
	r := confd(t, nil, append(nodeArgs(t, s), "-onetime", "-confdir", c.Dir)...)
	if r.code != 1 || readFileOr(good) != "value" || readFileOr(typo) != "" || readFileOr(above) != "" {
		t.Fatalf("exit %d, good %q, typo %q, above %q:\n%s", r.code, readFileOr(good), readFileOr(typo), readFileOr(above), r.stderr)
	}
	for _, w := range []string{"typo.toml:5: unknown key \"template.checkcmd\"", `did you mean "check_cmd"`, "above.toml:1: unknown key \"check_cmd\""} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
		}
	}
}

func TestUnknownFlagNamedAsWritten(t *testing.T) {
	r := confd(t, nil, "-auth-token", "x", "-onetime")
	if r.code != 2 || !strings.Contains(r.stderr, "unknown flag: -auth-token") || strings.Contains(r.stderr, "shorthand") {
		t.Errorf("exit %d:\n%s", r.code, r.stderr)
	}
}
