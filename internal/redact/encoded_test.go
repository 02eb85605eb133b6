package redact

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

// derKeys returns fresh private keys as bare DER, by encoding name.
func derKeys(t *testing.T) map[string][]byte {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, edk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p8, err := x509.MarshalPKCS8PrivateKey(rk)
	if err != nil {
		t.Fatal(err)
	}
	p8ed, err := x509.MarshalPKCS8PrivateKey(edk)
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	// The OpenSSH format: magic, cipher "none", kdf "none", ... (the
	// rest does not matter to a reader of the magic).
	ossh := append([]byte("openssh-key-v1\x00\x00\x00\x00\x04none\x00\x00\x00\x04none\x00\x00\x00\x00\x00\x00\x00\x01"), make([]byte, 200)...)
	_, _ = rand.Read(ossh[len(ossh)-200:])
	return map[string][]byte{"pkcs1": x509.MarshalPKCS1PrivateKey(rk), "pkcs8": p8, "pkcs8-ed25519": p8ed, "sec1": sec1, "openssh": ossh}
}

var pemTypes = map[string]string{"pkcs1": "RSA PRIVATE KEY", "pkcs8": "PRIVATE KEY", "pkcs8-ed25519": "PRIVATE KEY", "sec1": "EC PRIVATE KEY", "openssh": "OPENSSH PRIVATE KEY"}

// textBefore puts 0, 1 and 2 bytes before the key in the file, so that the
// key starts at every byte offset modulo 3 of its base64 encoding.
var textBefore = []string{"", "\n", "#\n"}

// wrapAt cuts s into lines of n characters, as `base64 FILE` (76) does.
func wrapAt(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// logFormats render one output line as confd logs it, in both formats.
var logFormats = map[string]func(string) string{
	"text": func(l string) string {
		return "2026-12-02T00:00:00Z host confd[42]: INFO reload_cmd output: " + l + "\n"
	},
	"json": func(l string) string {
		b, _ := json.Marshal(map[string]string{"level": "info", "msg": "reload_cmd output: " + l, "time": "2026-12-02T00:00:00Z"})
		return string(b) + "\n"
	},
}

type encCase struct {
	name  string
	lines []string // the command's output
}

// encodedCases is every encoding of every key that must be masked.
func encodedCases(t *testing.T) []encCase {
	var cases []encCase
	for name, der := range derKeys(t) {
		pemText := string(pem.EncodeToMemory(&pem.Block{Type: pemTypes[name], Bytes: der}))
		cases = append(cases, encCase{name + "/pem", strings.Split(strings.TrimSuffix(pemText, "\n"), "\n")})
		for off, before := range textBefore {
			file := []byte(before + pemText)
			for alpha, enc := range map[string]*base64.Encoding{"std": base64.StdEncoding, "url": base64.URLEncoding} {
				one := enc.EncodeToString(file)
				cases = append(cases,
					encCase{name + "/pem/" + alpha + "/w0/offset" + string(rune('0'+off)), []string{one}},
					encCase{name + "/pem/" + alpha + "/wrapped/offset" + string(rune('0'+off)), wrapAt(one, 76)})
			}
		}
		for alpha, enc := range map[string]*base64.Encoding{"std": base64.StdEncoding, "url": base64.URLEncoding, "raw-url": base64.RawURLEncoding} {
			one := enc.EncodeToString(der)
			cases = append(cases,
				encCase{name + "/der/" + alpha + "/w0", []string{one}},
				encCase{name + "/der/" + alpha + "/wrapped", wrapAt(one, 76)})
		}
	}
	return cases
}

// pieces are fragments of the key's text that must not survive: the
// middle of every long line.
func pieces(lines []string) []string {
	var out []string
	for _, l := range lines {
		if len(l) >= 40 && !strings.Contains(l, "-----") {
			out = append(out, l[16:32])
		}
	}
	return out
}

// TestEncodedKeysAreMaskedInEveryFormat is the table of issue 26: every
// encoding, every offset, both alphabets, both log formats, through the
// path command output takes (Lines, then the log formatter's String) and
// the path a diff takes (String on the whole text).
func TestEncodedKeysAreMaskedInEveryFormat(t *testing.T) {
	cases := encodedCases(t)
	rows := 0
	for _, c := range cases {
		ps := pieces(c.lines)
		if len(ps) == 0 {
			t.Fatalf("%s: no pieces to look for", c.name)
		}
		for fname, format := range logFormats {
			rows++
			var f Lines
			var log strings.Builder
			emit := func(l string) { log.WriteString(String(format(l))) }
			for _, l := range c.lines {
				f.Push(l, emit)
			}
			f.Flush(emit)
			out := log.String()
			if strings.Count(out, "\n") != len(c.lines) {
				t.Errorf("%s/%s: %d records for %d lines", c.name, fname, strings.Count(out, "\n"), len(c.lines))
			}
			if fname == "json" {
				for _, rec := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
					if !json.Valid([]byte(rec)) {
						t.Errorf("%s/json: invalid record %q", c.name, rec)
					}
				}
			}
			for _, p := range ps {
				if strings.Contains(out, p) {
					t.Errorf("%s/%s: %q survived in\n%s", c.name, fname, p, out)
					break
				}
			}
			if !strings.Contains(out, Mask) {
				t.Errorf("%s/%s: no mask in\n%s", c.name, fname, out)
			}
		}
		// A diff: the whole text at once, behind "+".
		in := "@@ -0,0 +1 @@\n" + prefixEach(strings.Join(c.lines, "\n")+"\n", "+")
		out := String(in)
		for _, p := range ps {
			if strings.Contains(out, p) {
				t.Errorf("%s/diff: %q survived in\n%s", c.name, p, out)
				break
			}
		}
		if strings.Count(out, "\n") != strings.Count(in, "\n") {
			t.Errorf("%s/diff: line count changed", c.name)
		}
	}
	t.Logf("redaction table: %d encodings x %d log formats = %d rows (+%d diff rows)", len(cases), len(logFormats), rows, len(cases))
}

// publicBundle is certificates and public keys: no secret.
func publicBundle(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	rk, _ := rsa.GenerateKey(rand.Reader, 1024)
	rpub, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	return "# sa bundle\n" + string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rpub}))
}

// TestEncodedPublicMaterialStaysReadable: only keys are masked, so a
// -noop diff of a public bundle, in any encoding, can still be read.
func TestEncodedPublicMaterialStaysReadable(t *testing.T) {
	b := publicBundle(t)
	for off, before := range textBefore {
		one := base64.StdEncoding.EncodeToString([]byte(before + b))
		for name, lines := range map[string][]string{"w0": {one}, "wrapped": wrapAt(one, 76), "pem": strings.Split(b, "\n")} {
			text := strings.Join(lines, "\n") + "\n"
			if out := String(text); out != text {
				t.Errorf("offset %d %s: public text changed:\n%s", off, name, out)
			}
			var f Lines
			var got []string
			for _, l := range lines {
				f.Push(l, func(s string) { got = append(got, s) })
			}
			f.Flush(func(s string) { got = append(got, s) })
			if strings.Join(got, "\n") != strings.Join(lines, "\n") {
				t.Errorf("offset %d %s: Lines changed public text", off, name)
			}
		}
	}
}

// TestEncodedKeyBlockMasksItsNeighbours: once a wrapped block decodes to a
// key, all of its lines go, and nothing beyond it.
func TestEncodedKeyBlockMasksItsNeighbours(t *testing.T) {
	der := derKeys(t)["pkcs8"]
	lines := wrapAt(base64.StdEncoding.EncodeToString(append([]byte("comment line before the key\n"), der...)), 76)
	in := "before\n" + strings.Join(lines, "\n") + "\nafter\n"
	out := String(in)
	want := "before\n" + strings.Repeat(Mask+"\n", len(lines)) + "after\n"
	if out != want {
		t.Fatalf("String =\n%s\nwant\n%s", out, want)
	}
}

func TestKeyMaterialRejectsPublicDER(t *testing.T) {
	k, _ := rsa.GenerateKey(rand.Reader, 1024)
	pub, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if KeyMaterial(pub) || KeyMaterial(x509.MarshalPKCS1PublicKey(&k.PublicKey)) {
		t.Fatal("public key DER taken for a private key")
	}
}

// TestLinesPassOrdinaryLinesAtOnce: only bare base64-looking lines are held
// back for their block; a log line ending in a long word is not.
func TestLinesPassOrdinaryLinesAtOnce(t *testing.T) {
	for _, l := range []string{
		"time=x level=info msg=\"restart command started\" lock=kube-apiserver-restart",
		"ppid=1 stdin=/dev/null v=s3cr3t-lock-value-31337",
		"kube-apiserver-restart",
	} {
		var f Lines
		var got []string
		f.Push(l, func(s string) { got = append(got, s) })
		if len(got) != 1 || got[0] != l {
			t.Errorf("Push(%q) emitted %q at once", l, got)
		}
	}
}

func TestHasRun(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want bool
	}{
		{"", 4, false},
		{"abc", 4, false},
		{"abcd", 4, true},
		{"x abcd", 4, true},
		{"ab cd ef gh", 4, false},
		{"ab.cdefg", 4, true},
		{strings.Repeat("a", 63) + " " + strings.Repeat("b", 63), 64, false},
		{strings.Repeat("a", 63) + " " + strings.Repeat("b", 64), 64, true},
		{"   " + strings.Repeat("Z", 64) + "   ", 64, true},
	} {
		if got := hasRun(tc.s, tc.n); got != tc.want {
			t.Errorf("hasRun(%q, %d) = %v", tc.s, tc.n, got)
		}
	}
}
