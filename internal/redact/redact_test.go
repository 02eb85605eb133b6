package redact

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
)

// keyForms returns private keys in every armour the package must catch,
// generated afresh, keyed by a name for the test table.
func keyForms(t *testing.T) map[string]string {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(rk)
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return b
	}
	enc := func(typ string, b []byte, h map[string]string) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b, Headers: h}))
	}
	pgp := "-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: test\n\n" +
		wrap(base64.StdEncoding.EncodeToString(random(300))) + "=" + base64.StdEncoding.EncodeToString(random(3)) +
		"\n-----END PGP PRIVATE KEY BLOCK-----\n"
	forms := map[string]string{
		"pkcs1":     enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rk), nil),
		"pkcs8":     enc("PRIVATE KEY", p8, nil),
		"ec":        enc("EC PRIVATE KEY", sec1, nil),
		"encrypted": enc("ENCRYPTED PRIVATE KEY", random(400), nil),
		"legacyenc": enc("RSA PRIVATE KEY", random(400), map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00112233445566778899AABBCCDDEEFF"}),
		"openssh":   enc("OPENSSH PRIVATE KEY", random(400), nil),
		"pgp":       pgp,
	}
	for name, k := range map[string]string{"pkcs8": forms["pkcs8"], "pgp": pgp} {
		j, _ := json.Marshal(map[string]string{"key": k})
		forms[name+"-json"] = string(j) + "\n"
		// Doubly escaped: JSON inside a JSON log record.
		jj, _ := json.Marshal(map[string]string{"msg": string(j)})
		forms[name+"-json2"] = string(jj) + "\n"
	}
	return forms
}

func wrap(s string) string {
	var b strings.Builder
	for len(s) > 64 {
		b.WriteString(s[:64] + "\n")
		s = s[64:]
	}
	return b.String() + s + "\n"
}

// secretPieces are the fragments of a key form that must never survive:
// the first 12 characters of every body line's base64 text.
func secretPieces(form string) []string {
	var out []string
	for _, l := range strings.FieldsFunc(form, func(r rune) bool { return r == '\n' || r == '"' || r == '\\' || r == ' ' }) {
		if strings.Contains(l, "-----") || strings.Contains(l, ":") || len(l) < 13 {
			continue
		}
		if l[0] == 'n' {
			l = l[1:] // possibly the "n" of an escaped "\n" split above
		}
		out = append(out, l[:12])
	}
	return out
}

// prefixes render a key as it appears behind each output path's prefix.
var prefixes = map[string]func(string) string{
	"bare":    func(s string) string { return s },
	"diff-u+": func(s string) string { return prefixEach(s, "+") },
	"diff-u-": func(s string) string { return prefixEach(s, "-") },
	"diff>":   func(s string) string { return prefixEach(s, "> ") },
	"diff<":   func(s string) string { return prefixEach(s, "< ") },
	"indent":  func(s string) string { return prefixEach(s, "    ") },
	"log": func(s string) string {
		return prefixEach(s, "2026-12-01T02:00:00Z host confd[42]: INFO check_cmd: ")
	},
	"inline": func(s string) string { return "output was: " + strings.TrimSuffix(s, "\n") + " (end)\n" },
}

func prefixEach(s, p string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = p + l
		}
	}
	return strings.Join(lines, "")
}

func TestStringMasksEveryFormBehindEveryPrefix(t *testing.T) {
	for name, form := range keyForms(t) {
		pieces := secretPieces(form)
		if len(pieces) == 0 {
			t.Fatalf("%s: no secret pieces in %q", name, form)
		}
		for pname, pf := range prefixes {
			in := "before\n" + pf(form) + "after\n"
			out := String(in)
			for _, p := range pieces {
				if strings.Contains(out, p) {
					t.Errorf("%s/%s: %q survived in\n%s", name, pname, p, out)
					break
				}
			}
			if !strings.Contains(out, Mask) || !strings.HasPrefix(out, "before\n") || !strings.HasSuffix(out, "after\n") {
				t.Errorf("%s/%s: masked text lost its frame:\n%s", name, pname, out)
			}
			if strings.Count(out, "\n") != strings.Count(in, "\n") {
				t.Errorf("%s/%s: line count changed", name, pname)
			}
			// The streaming filter must agree, line by line.
			var f Lines
			var b strings.Builder
			emit := func(l string) { b.WriteString(l + "\n") }
			for _, l := range strings.Split(strings.TrimSuffix(in, "\n"), "\n") {
				f.Push(l, emit)
			}
			f.Flush(emit)
			for _, p := range pieces {
				if strings.Contains(b.String(), p) {
					t.Errorf("%s/%s: Lines let %q through:\n%s", name, pname, p, b.String())
					break
				}
			}
		}
	}
}

func TestStringKeepsPublicMaterialAndDiffMarkers(t *testing.T) {
	in := "a\n-----BEGIN PUBLIC KEY-----\nPUBLICBYTES\n-----END PUBLIC KEY-----\n" +
		"+-----BEGIN RSA PRIVATE KEY-----\n+SECRETBYTESSECRETBYTES\n+-----END RSA PRIVATE KEY-----\n" +
		"-----BEGIN CERTIFICATE-----\nCERTBYTES\n-----END CERTIFICATE-----\n"
	out := String(in)
	want := "a\n-----BEGIN PUBLIC KEY-----\nPUBLICBYTES\n-----END PUBLIC KEY-----\n" +
		"+-----BEGIN RSA PRIVATE KEY-----\n+" + Mask + "\n+-----END RSA PRIVATE KEY-----\n" +
		"-----BEGIN CERTIFICATE-----\nCERTBYTES\n-----END CERTIFICATE-----\n"
	if out != want {
		t.Fatalf("String =\n%s\nwant\n%s", out, want)
	}
}

func TestStringOneLineShapes(t *testing.T) {
	for in, want := range map[string]string{
		`{"k":"-----BEGIN EC PRIVATE KEY-----\nSECRETSECRETSECRET\n-----END EC PRIVATE KEY-----\n"}`: `{"k":"-----BEGIN EC PRIVATE KEY-----\n` + Mask + `\n-----END EC PRIVATE KEY-----\n"}`,
		"k: -----BEGIN PRIVATE KEY----- SECRETSECRETSECRET -----END PRIVATE KEY----- tail":           "k: -----BEGIN PRIVATE KEY----- " + Mask + " -----END PRIVATE KEY----- tail",
		"-----BEGIN PRIVATE KEY-----SECRETSECRETSECRET":                                              "-----BEGIN PRIVATE KEY-----" + Mask,
	} {
		if got := String(in); got != want {
			t.Errorf("String(%q) =\n%q\nwant\n%q", in, got, want)
		}
	}
}

func TestStringMasksOrphanBodyAboveEnd(t *testing.T) {
	// The head of the output was cut: the body arrives without its BEGIN.
	in := "...\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n-----END PRIVATE KEY-----\nexit 1\n"
	out := String(in)
	if strings.Contains(out, "MIIEvQIBADAN") || strings.Contains(out, "BKcwggSjAgEA") || !strings.HasSuffix(out, "-----END PRIVATE KEY-----\nexit 1\n") {
		t.Fatalf("String = %q", out)
	}
}

func TestStringMasksURLPasswords(t *testing.T) {
	in := `dial https://root:s3cr3t-pass@10.0.0.1:2379 failed; also "http://u:p%40ss@h/"`
	out := String(in)
	if strings.Contains(out, "s3cr3t") || strings.Contains(out, "p%40ss") || !strings.Contains(out, "https://root:"+PasswordMask+"@10.0.0.1:2379") {
		t.Fatalf("String = %q", out)
	}
}

func TestLinesStream(t *testing.T) {
	var f Lines
	got := []string{}
	for _, l := range []string{"x", "-----BEGIN EC PRIVATE KEY-----", "SECRET", "-----END EC PRIVATE KEY-----", "y"} {
		f.Push(l, func(l string) { got = append(got, l) })
	}
	if strings.Contains(strings.Join(got, "\n"), "SECRET\n") || got[2] != Mask || got[4] != "y" {
		t.Fatalf("Lines = %q", got)
	}
}

// TestStringIsIdempotent: output masked by one path (a command's output)
// passes through another (the log formatter) unchanged.
func TestStringIsIdempotent(t *testing.T) {
	for name, form := range keyForms(t) {
		for pname, pf := range prefixes {
			once := String("x\n" + pf(form) + "y\n")
			if twice := String(once); twice != once {
				t.Errorf("%s/%s: second pass changed\n%s\ninto\n%s", name, pname, once, twice)
			}
		}
	}
}

func TestParseMessageNamesCredentialKeys(t *testing.T) {
	// ParseMessage names the key of a line that assigns a credential, and
	// passes the message of any other line on.
	for line, want := range map[string]string{
		"password = hunter2":       "password",
		`"auth_token" = "x`:        "auth_token",
		"  secret_id=abc":          "secret_id",
		"secret_keyring = '/x":     "secret_keyring",
		"interval = soon":          "",
		"no assignment password":   "",
		"client_key = /etc/k.pem ": "",
	} {
		got := ParseMessage([]byte("a = 1\n"+line+"\n"), 2, "msg")
		if want == "" && got != "msg" || want != "" && !strings.HasPrefix(got, `the value of "`+want+`" does not parse`) {
			t.Errorf("ParseMessage(%q) = %q; want key %q", line, got, want)
		}
	}
}

func TestStringMasksBase64EncodedPEM(t *testing.T) {
	forms := keyForms(t)
	key := base64.StdEncoding.EncodeToString([]byte(forms["pkcs1"]))
	cert := base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n"))
	in := "users:\n- user:\n    client-certificate-data: " + cert + "\n+    client-key-data: " + key + "\n"
	out := String(in)
	if strings.Contains(out, key[20:40]) || !strings.Contains(out, "client-key-data: "+Mask) || !strings.Contains(out, cert) {
		t.Fatalf("String =\n%s", out)
	}
	var f Lines
	var got []string
	f.Push("client-key-data: "+key[:100], func(l string) { got = append(got, l) })
	if len(got) != 1 || got[0] != "client-key-data: "+Mask {
		t.Errorf("cut-off encoded key: %q", got)
	}
}

func TestParseMessageHidesCredentialLines(t *testing.T) {
	src := []byte("backend = \"etcdv3\"\npassword = hunter2\n")
	if got := ParseMessage(src, 2, `expected value but found "hunter2"`); strings.Contains(got, "hunter2") || !strings.Contains(got, "password") {
		t.Errorf("ParseMessage on a password line = %q", got)
	}
	if got := ParseMessage(src, 1, "bad backend"); got != "bad backend" {
		t.Errorf("ParseMessage on an ordinary line = %q", got)
	}
}
