package apply

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os/exec"
	"strings"
	"testing"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keysync/confd/internal/redact"
)

// renderedKey is a private key PEM with the byte ranges of that text which
// encode its private values only (body character c holds DER bits [6c,
// 6c+6)).
type renderedKey struct {
	name    string
	pem     string
	private [][2]int
}

func renderedKeys(t *testing.T) []renderedKey {
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
	var out []renderedKey
	for _, k := range []struct {
		name, typ string
		der       []byte
		vals      []*big.Int
	}{
		{"rsa2048", "PRIVATE KEY", p8, []*big.Int{rk.D, rk.Primes[0], rk.Primes[1], rk.Precomputed.Dp, rk.Precomputed.Dq, rk.Precomputed.Qinv}},
		{"p256", "EC PRIVATE KEY", sec1, []*big.Int{ecScalar(t, ek)}},
	} {
		text := pem.EncodeToMemory(&pem.Block{Type: k.typ, Bytes: k.der})
		body := bytes.IndexByte(text, '\n') + 1
		var at []int
		for i := body; text[i] != '-'; i++ {
			if text[i] != '\n' {
				at = append(at, i)
			}
		}
		rk := renderedKey{name: k.name, pem: string(text)}
		for _, v := range k.vals {
			b := v.Bytes()
			if k.name == "p256" {
				b = v.FillBytes(make([]byte, 32))
			}
			i := bytes.Index(k.der, b)
			if i < 0 {
				t.Fatalf("%s: value not in DER", k.name)
			}
			lo, hi := (8*i+5)/6, 8*(i+len(b))/6
			rk.private = append(rk.private, [2]int{at[lo], at[hi-1] + 1})
		}
		out = append(out, rk)
	}
	return out
}

// TestReloadCmdBase64OfRenderedKeyIsMasked is issue 34 point 6 end to end:
// a reload_cmd (or check_cmd) prints the rendered key file through
// coreutils base64, wrapped at any width, whole or a slice of its lines,
// LF or CRLF; the log shows no character that encodes private key bytes
// only (the public parts, armour and RSA modulus, may show).
func TestReloadCmdBase64OfRenderedKeyIsMasked(t *testing.T) {
	if _, err := exec.LookPath("base64"); err != nil {
		t.Skip("no base64")
	}
	cases := []struct {
		name     string
		cmd      string
		width    int
		from, to int // the lines of `base64 -w width` printed; to 0: all
		check    bool
	}{
		{"w76", "base64 {{.dest}}", 76, 0, 0, false},
		{"w76 lines 3-6", "base64 {{.dest}} | sed -n 3,6p", 76, 2, 6, false},
		{"w76 lines 9-12", "base64 {{.dest}} | sed -n 9,12p", 76, 8, 12, false}, // the RSA private exponent
		{"w76 head -3", "base64 {{.dest}} | head -3", 76, 0, 3, false},
		{"w64 CRLF", "base64 -w 64 {{.dest}} | sed 's/$/\\r/'", 64, 0, 0, false},
		{"w10", "base64 -w 10 {{.dest}}", 10, 0, 0, false},
		{"w1 last lines", "base64 -w 1 {{.dest}} | tail -n 900", 1, -900, 0, false},
		{"check_cmd w60", "base64 -w 60 {{.src}}; exit 1", 60, 0, 0, true},
	}
	for _, k := range renderedKeys(t) {
		for _, c := range cases {
			t.Run(k.name+"/"+c.name, func(t *testing.T) {
				f := newFixture(t, "")
				hook := f.hook()
				f.store.kvs["/app/name"] = k.pem
				r := f.load()
				kind := "reload_cmd"
				if c.check {
					kind = "check_cmd"
					r.CheckCmd = c.cmd
				} else {
					r.ReloadCmd = c.cmd
				}
				_, err := r.Process(context.Background(), f.store)
				if (err != nil) != c.check {
					t.Fatalf("Process: %v", err)
				}
				// The rendered file is "name=" + the key + "\n".
				file := "name=" + k.pem + "\n"
				lines := wrapAt(base64.StdEncoding.EncodeToString([]byte(file)), c.width)
				first := 0
				switch {
				case c.from < 0:
					first = max(0, len(lines)+c.from)
					lines = lines[first:]
				case c.to > 0 && c.from >= len(lines):
					t.Skipf("the encoding has %d lines", len(lines))
				case c.to > 0:
					first = c.from
					lines = lines[c.from:min(c.to, len(lines))]
				}
				var got []string
				for _, e := range hook.AllEntries() {
					if l, ok := strings.CutPrefix(e.Message, kind+" output: "); ok {
						got = append(got, l)
					}
				}
				if len(got) != len(lines) {
					t.Fatalf("%d lines logged for %d printed: %q", len(got), len(lines), got)
				}
				shown := 0
				for i, l := range lines {
					for p, v := range shownChars(t, l, got[i]) {
						c := (first+i)*c.width + p // the character's index in the encoding
						if v && privateChar(c, len("name="), k.private) {
							shown++
						}
					}
				}
				// Narrower than 16 columns, the first one or two
				// characters of a private part may show (redact.Known).
				allowed := 0
				if c.width < redact.MinEncoded {
					allowed = 2 * len(k.private)
				}
				if shown > allowed {
					t.Errorf("%d characters of private key bytes logged:\n%s", shown, strings.Join(got, "\n"))
				}
			})
		}
	}
}

// privateChar tells whether encoding character c holds only bits of the
// private ranges of the key, which starts at byte off of the file.
func privateChar(c, off int, private [][2]int) bool {
	for _, r := range private {
		if 6*c >= 8*(off+r[0]) && 6*c+6 <= 8*(off+r[1]) {
			return true
		}
	}
	return false
}

// shownChars returns which characters of in the logged line out shows:
// out is in with spans replaced by redact.Mask.
func shownChars(t *testing.T, in, out string) []bool {
	t.Helper()
	shown := make([]bool, len(in))
	segs := strings.Split(out, redact.Mask)
	pos := 0
	for j, s := range segs {
		at := pos + strings.Index(in[pos:], s)
		if j == len(segs)-1 {
			at = len(in) - len(s)
		}
		if at < pos || !strings.HasPrefix(in[at:], s) || j == 0 && at != 0 {
			t.Fatalf("logged %q is not %q masked", out, in)
		}
		for p := at; p < at+len(s); p++ {
			shown[p] = true
		}
		pos = at + len(s)
	}
	return shown
}

func wrapAt(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// hook gives f fresh settings whose log entries the returned hook keeps.
func (f *fixture) hook() *test.Hook {
	s, h := testSettings(f.dir)
	f.s = s
	return h
}

// ecScalar is the key's private scalar (ecdsa.PrivateKey.D is deprecated).
func ecScalar(t *testing.T, k *ecdsa.PrivateKey) *big.Int {
	t.Helper()
	b, err := k.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return new(big.Int).SetBytes(b)
}
