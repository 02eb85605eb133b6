package redact

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand"
	"strings"
	"sync"
	"testing"
	"time"
)

// knownKey is a private key as rendered (PEM) with the byte ranges of its
// DER that hold private values, found here independently of KeySecrets.
type knownKey struct {
	name    string
	pem     []byte
	der     []byte
	private [][2]int // in der
	cert    []byte   // a certificate of its public key, DER
}

var (
	knownKeysOnce sync.Once
	knownKeysVal  []knownKey
	knownKeysErr  error
)

// knownKeys are an RSA-2048 key in PKCS#8 and a P-256 key in SEC 1, each
// with a self-signed certificate.
func knownKeys(t testing.TB) []knownKey {
	t.Helper()
	knownKeysOnce.Do(func() {
		rk, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			knownKeysErr = err
			return
		}
		ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			knownKeysErr = err
			return
		}
		p8, _ := x509.MarshalPKCS8PrivateKey(rk)
		sec1, _ := x509.MarshalECPrivateKey(ek)
		rsaPriv := []*big.Int{rk.D, rk.Primes[0], rk.Primes[1], rk.Precomputed.Dp, rk.Precomputed.Dq, rk.Precomputed.Qinv}
		ed, err := ek.Bytes()
		if err != nil {
			knownKeysErr = err
			return
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "known"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
		for _, k := range []struct {
			name, typ string
			der       []byte
			vals      [][]byte
			priv, pub any
		}{
			{"rsa2048-pkcs8", "PRIVATE KEY", p8, bigBytes(rsaPriv), rk, &rk.PublicKey},
			{"p256-sec1", "EC PRIVATE KEY", sec1, [][]byte{ed}, ek, &ek.PublicKey},
		} {
			kk := knownKey{name: k.name, der: k.der, pem: pem.EncodeToMemory(&pem.Block{Type: k.typ, Bytes: k.der})}
			for _, v := range k.vals {
				i := bytes.Index(k.der, v)
				if i < 0 {
					knownKeysErr = fmt.Errorf("%s: private value not in DER", k.name)
					return
				}
				kk.private = append(kk.private, [2]int{i, i + len(v)})
			}
			kk.cert, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.pub, k.priv)
			if err != nil {
				knownKeysErr = err
				return
			}
			knownKeysVal = append(knownKeysVal, kk)
		}
	})
	if knownKeysErr != nil {
		t.Fatal(knownKeysErr)
	}
	return knownKeysVal
}

func bigBytes(is []*big.Int) [][]byte {
	var out [][]byte
	for _, i := range is {
		out = append(out, i.Bytes())
	}
	return out
}

// privateText returns the byte ranges of the PEM text that encode private
// values only: body character c holds DER bits [6c, 6c+6).
func (k knownKey) privateText() [][2]int {
	body := bytes.Index(k.pem, []byte("\n")) + 1
	var at []int // body characters' positions in k.pem
	for i := body; i < len(k.pem) && k.pem[i] != '-'; i++ {
		if k.pem[i] != '\n' {
			at = append(at, i)
		}
	}
	var out [][2]int
	for _, r := range k.private {
		lo, hi := (8*r[0]+5)/6, 8*r[1]/6
		out = append(out, [2]int{at[lo], at[hi-1] + 1})
	}
	return out
}

// wrapLines cuts enc into lines of width n (0: one line; -1: random widths
// from 1 to 90).
func wrapLines(enc string, n int, rng *mrand.Rand) []string {
	if n == 0 {
		return []string{enc}
	}
	var out []string
	for len(enc) > 0 {
		w := n
		if n < 0 {
			w = 1 + rng.Intn(90)
		}
		w = min(w, len(enc))
		out = append(out, enc[:w])
		enc = enc[w:]
	}
	return out
}

// stream writes the lines with eol in random chunks and reads them back as
// the runner does (cut at "\n", a trailing "\r" dropped), through Known
// and then Lines, as command output goes.
func stream(s *Secrets, lines []string, eol string, rng *mrand.Rand) []string {
	text := strings.Join(lines, eol) + eol
	k := NewKnown(s)
	var f Lines
	var out []string
	emit := func(l string) { f.Push(l, func(m string) { out = append(out, m) }) }
	var pending []byte
	for len(text) > 0 {
		n := min(1+rng.Intn(100), len(text))
		pending = append(pending, text[:n]...)
		text = text[n:]
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			k.Push(strings.TrimSuffix(string(pending[:i]), "\r"), emit)
			pending = pending[i+1:]
		}
	}
	k.Flush(emit)
	f.Flush(func(m string) { out = append(out, m) })
	return out
}

// visible returns which characters of enc (the unwrapped encoding) an
// output shows: each output line is its input line with spans replaced by
// Mask.
func visible(t *testing.T, in, out []string) []bool {
	t.Helper()
	if len(in) != len(out) {
		t.Fatalf("%d lines out for %d in", len(out), len(in))
	}
	var shown []bool
	for i, l := range in {
		segs := strings.Split(out[i], Mask)
		seen := make([]bool, len(l))
		pos := 0
		for j, s := range segs {
			var at int
			switch {
			case j == 0:
				at = 0
				if !strings.HasPrefix(l, s) {
					t.Fatalf("line %d: %q is not %q masked", i, out[i], l)
				}
			case j == len(segs)-1:
				at = len(l) - len(s)
				if !strings.HasSuffix(l, s) || at < pos {
					t.Fatalf("line %d: %q is not %q masked", i, out[i], l)
				}
			default:
				at = pos + strings.Index(l[pos:], s)
				if at < pos {
					t.Fatalf("line %d: %q is not %q masked", i, out[i], l)
				}
			}
			for p := at; p < at+len(s); p++ {
				seen[p] = true
			}
			pos = at + len(s)
		}
		for p := 0; p < len(l); p++ {
			if l[p] != '=' {
				shown = append(shown, seen[p])
			}
		}
	}
	return shown
}

// leaked counts the characters shown that encode only secret bytes: data
// bits [6c, 6c+6) inside a secret range of the encoded data.
func leaked(shown []bool, secret [][2]int) int {
	n := 0
	for c, v := range shown {
		if !v {
			continue
		}
		for _, r := range secret {
			if 6*c >= 8*r[0] && 6*c+6 <= 8*r[1] {
				n++
				break
			}
		}
	}
	return n
}

// TestKnownMasksEncodedKeysAnyOffsetAnyWrap is issue 34 point 6: a key
// base64-encoded at any byte offset, in either alphabet, wrapped at any
// width (or not at all), with LF or CRLF, read in random chunks, shows
// none of its private characters; the file's public parts (armour, RSA
// modulus) may stay.
func TestKnownMasksEncodedKeysAnyOffsetAnyWrap(t *testing.T) {
	rng := mrand.New(mrand.NewSource(34))
	for _, k := range knownKeys(t) {
		for off, before := range []string{"", "x", "#\n"} {
			file := append([]byte(before), k.pem...)
			file = append(file, "trailing text\n"...)
			s := NewSecrets(KeySecrets(file)...)
			var fileSecret [][2]int
			for _, r := range k.privateText() {
				fileSecret = append(fileSecret, [2]int{r[0] + len(before), r[1] + len(before)})
			}
			for _, data := range []struct {
				name   string
				b      []byte
				secret [][2]int
			}{{"pem", file, fileSecret}, {"der", k.der, k.private}} {
				for alpha, enc := range map[string]*base64.Encoding{"std": base64.StdEncoding, "url": base64.URLEncoding} {
					e := enc.EncodeToString(data.b)
					for _, width := range []int{76, 64, 60, 13, 4, 1, 0, -1} {
						for _, eol := range []string{"\n", "\r\n"} {
							name := fmt.Sprintf("%s/offset%d/%s/%s/w%d/%q", k.name, off, data.name, alpha, width, eol)
							in := wrapLines(e, width, rng)
							out := stream(s, in, eol, rng)
							// Narrower than MinEncoded, the first characters of
							// a part near the start of the output may pass.
							allowed := 0
							if width > 0 && width < MinEncoded || width < 0 {
								allowed = minHoldBare - 1
							}
							if n := leaked(visible(t, in, out), data.secret); n > allowed {
								t.Errorf("%s: %d private characters shown", name, n)
							}
						}
					}
				}
			}
		}
	}
}

// A window from the middle of an encoded key (`base64 key.pem | head -3`
// past the armour, `tail -c +N`) is masked on its own; the masked text
// is every base64 character of it but at most one at each edge.
func TestKnownMasksAWindowFromTheMiddle(t *testing.T) {
	rng := mrand.New(mrand.NewSource(6))
	k := knownKeys(t)[0]
	s := NewSecrets(KeySecrets(k.pem)...)
	r := k.privateText()[0] // d
	e := base64.StdEncoding.EncodeToString(k.pem)
	lo, hi := (8*r[0]+5)/6, 8*r[1]/6
	for _, n := range []int{MinEncoded, 40, 200} {
		for _, width := range []int{76, 10, 1} {
			start := lo + rng.Intn(hi-lo-n)
			part := e[start : start+n]
			// Neighbours without base64 characters: a letter next to
			// the window could continue the encoding by chance.
			in := append([]string{"::"}, wrapLines(part, width, rng)...)
			in = append(in, "...")
			out := stream(s, in, "\n", rng)
			if out[0] != "::" || out[len(out)-1] != "..." {
				t.Errorf("window %d w%d: neighbours changed: %q (next %q)", n, width, out, e[start+n:start+n+2])
			}
			shown := 0
			for _, v := range visible(t, in[1:len(in)-1], out[1:len(out)-1]) {
				if v {
					shown++
				}
			}
			if shown > 0 && (width >= MinEncoded || shown >= minHoldBare) {
				t.Errorf("window of %d at w%d: %d characters shown: %q", n, width, shown, out)
			}
		}
	}
}

// Public material stays readable: the certificate of a known key (same
// modulus, same EC point) and another key's encoding are not masked.
func TestKnownLeavesPublicMaterial(t *testing.T) {
	rng := mrand.New(mrand.NewSource(7))
	keys := knownKeys(t)
	s := NewSecrets(KeySecrets(keys[0].pem)...)
	for _, k := range keys {
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: k.cert})
		for _, text := range [][]byte{k.cert, certPEM} {
			for off := 0; off < 3; off++ {
				e := base64.StdEncoding.EncodeToString(append(make([]byte, off), text...))
				in := wrapLines(e, 76, rng)
				out := stream(s, in, "\n", rng)
				if strings.Join(out, "\n") != strings.Join(in, "\n") {
					t.Errorf("%s certificate offset %d masked", k.name, off)
				}
			}
		}
		if k.name != keys[0].name {
			in := wrapLines(base64.StdEncoding.EncodeToString(k.der), 76, rng)
			if out := stream(s, in, "\n", rng); strings.Join(out, "\n") != strings.Join(in, "\n") {
				// Lines masks a key of any kind by its DER header, so
				// look at Known alone here.
				var got []string
				kn := NewKnown(s)
				for _, l := range in {
					kn.Push(l, func(m string) { got = append(got, m) })
				}
				kn.Flush(func(m string) { got = append(got, m) })
				if strings.Join(got, "\n") != strings.Join(in, "\n") {
					t.Errorf("an unknown key was masked by Known")
				}
			}
		}
	}
}

// Ordinary output reaches the log at once: a line is held back only when
// its end could start an encoding of a secret.
func TestKnownPassesOrdinaryLinesAtOnce(t *testing.T) {
	s := NewSecrets(KeySecrets(knownKeys(t)[0].pem)...)
	k := NewKnown(s)
	for _, l := range []string{"reloading nginx", "OK", "done", "nginx: configuration file /etc/nginx/nginx.conf test is successful", "", "   ", "lock=kube-apiserver-restart", "Syntax OK"} {
		var got []string
		k.Push(l, func(m string) { got = append(got, m) })
		if len(got) != 1 || got[0] != l {
			t.Errorf("Push(%q) emitted %q", l, got)
		}
	}
}

// A run is masked in a line whatever stands around it, and the rest of the
// line is kept: a log prefix, a diff marker, quotes.
func TestKnownKeepsTheRestOfALine(t *testing.T) {
	k := knownKeys(t)[1]
	s := NewSecrets(KeySecrets(k.pem)...)
	r := k.private[0]
	e := base64.RawURLEncoding.EncodeToString(k.der[r[0]:r[1]]) // a JWK "d"
	l := `{"kty":"EC","d":"` + e + `","crv":"P-256"}`
	var got []string
	kn := NewKnown(s)
	kn.Push(l, func(m string) { got = append(got, m) })
	kn.Flush(func(m string) { got = append(got, m) })
	if len(got) != 1 || strings.Contains(got[0], e[2:18]) || !strings.HasPrefix(got[0], `{"kty":"EC","d":"`) || !strings.HasSuffix(got[0], `","crv":"P-256"}`) {
		t.Errorf("got %q", got)
	}
}

func TestKeySecretsFindsPrivatePartsOnly(t *testing.T) {
	for _, k := range knownKeys(t) {
		vals := KeySecrets(append([]byte("name=x\n"), k.pem...))
		if len(vals) == 0 {
			t.Fatalf("%s: no secrets", k.name)
		}
		for _, v := range vals {
			if bytes.Contains(v, []byte("-----")) {
				t.Errorf("%s: a secret holds the armour: %q", k.name, v)
			}
		}
	}
	if v := KeySecrets([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")); v != nil {
		t.Errorf("certificate: %q", v)
	}
	// An unparsable block is secret as a whole.
	odd := "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n-----END RSA PRIVATE KEY-----"
	if v := KeySecrets([]byte(odd)); len(v) != 1 || string(v[0]) != odd {
		t.Errorf("encrypted: %q", v)
	}
}

var (
	benchSecretsOnce sync.Once
	benchSecrets     *Secrets
)

// BenchmarkKnown1MiB is Known on 1 MiB of ordinary command output (log-like
// lines, a quarter of them base64 of public material) with the secrets of
// 10 RSA-2048 keys, beside Lines alone on the same output (the filter every
// command's output already goes through) and the two chained, as the
// runner chains them.
func BenchmarkKnown1MiB(b *testing.B) {
	benchSecretsOnce.Do(func() {
		var vals [][]byte
		for i := 0; i < 10; i++ {
			rk, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			p8, _ := x509.MarshalPKCS8PrivateKey(rk)
			vals = append(vals, KeySecrets(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: p8}))...)
		}
		benchSecrets = NewSecrets(vals...)
	})
	s := benchSecrets
	rng := mrand.New(mrand.NewSource(1))
	var lines []string
	size := 0
	for size < 1<<20 {
		var l string
		switch rng.Intn(4) {
		case 0:
			buf := make([]byte, 57)
			rng.Read(buf)
			l = base64.StdEncoding.EncodeToString(buf)
		default:
			l = fmt.Sprintf("2026-12-01T02:00:%02d host app[%d]: INFO request id=%x path=/api/v1/items/%d took %dms", rng.Intn(60), rng.Intn(99999), rng.Uint64(), rng.Intn(1e6), rng.Intn(900))
		}
		lines = append(lines, l)
		size += len(l) + 1
	}
	drop := func(string) {}
	run := func(name string, push func(l string), flush func()) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				for _, l := range lines {
					push(l)
				}
				flush()
			}
		})
	}
	var f Lines
	run("lines", func(l string) { f.Push(l, drop) }, func() { f.Flush(drop) })
	k := NewKnown(s)
	run("known", func(l string) { k.Push(l, drop) }, func() { k.Flush(drop) })
	toLines := func(l string) { f.Push(l, drop) }
	run("known-then-lines", func(l string) { k.Push(l, toLines) }, func() { k.Flush(toLines); f.Flush(drop) })
}
