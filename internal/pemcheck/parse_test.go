package pemcheck

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

func TestParse(t *testing.T) {
	now := time.Now()
	rk := keytest.RSA(t, 1024)
	ek := keytest.EC(t)
	cert := keytest.CertPEM(t, ek, "leaf", now.Add(-time.Hour), now.Add(time.Hour))
	pkcs1 := keytest.PKCS1PEM(rk)
	sec1der, err := x509.MarshalECPrivateKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	sec1 := keytest.Encode("EC PRIVATE KEY", sec1der)
	pkcs8der, err := x509.MarshalPKCS8PrivateKey(rk)
	if err != nil {
		t.Fatal(err)
	}
	encrypted := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00000000000000000000000000000000"},
		Bytes:   []byte("ciphertext")})

	type want struct {
		kinds []Kind
		encs  []Encoding
	}
	tests := []struct {
		name    string
		data    []byte
		err     error  // sentinel the error must wrap
		errText string // substring of the error
		want    want
	}{
		{name: "empty", data: nil, err: ErrNoBlock, errText: "f.pem: no PEM block"},
		{name: "whitespace only", data: []byte("\n \r\n\t\n"), err: ErrNoBlock},
		{name: "garbage", data: []byte("hello world\n"), err: ErrNotPEM, errText: "f.pem: line 1:"},
		{name: "comment before block", data: cat([]byte("\n# bundle\n"), cert), err: ErrNotPEM, errText: "line 2"},
		{name: "garbage between blocks", data: cat(cert, []byte("oops\n"), cert), err: ErrNotPEM,
			errText: fmt.Sprintf("line %d", strings.Count(string(cert), "\n")+1)},
		{name: "trailing garbage", data: cat(cert, []byte("\n\nx")), err: ErrNotPEM},
		{name: "unknown type", data: keytest.Encode("FOO", []byte{1}), err: ErrUnknownType, errText: `block 1 (line 1, FOO)`},
		{name: "bad certificate DER", data: cat(cert, keytest.Encode("CERTIFICATE", []byte{1, 2, 3})), err: ErrParse,
			errText: "block 2 (line "},
		{name: "bad base64", data: []byte("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n"), err: ErrMalformed},
		{name: "no END", data: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n"), err: ErrMalformed},
		{name: "truncated block before a good one",
			data: cat([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n"), cert), err: ErrMalformed, errText: "block 1 (line 1, CERTIFICATE)"},
		{name: "mismatched END", data: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END PUBLIC KEY-----\n"), err: ErrMalformed},
		{name: "encrypted legacy", data: encrypted, err: ErrEncrypted},
		{name: "encrypted pkcs8", data: keytest.Encode("ENCRYPTED PRIVATE KEY", []byte{1}), err: ErrEncrypted},
		{name: "certificate", data: cert, want: want{[]Kind{Certificate}, []Encoding{X509}}},
		{name: "pkcs1 private", data: pkcs1, want: want{[]Kind{PrivateKey}, []Encoding{PKCS1}}},
		{name: "pkcs8 rsa private", data: keytest.Encode("PRIVATE KEY", pkcs8der), want: want{[]Kind{PrivateKey}, []Encoding{PKCS8}}},
		{name: "pkcs8 ec private", data: keytest.PKCS8PEM(t, ek), want: want{[]Kind{PrivateKey}, []Encoding{PKCS8}}},
		{name: "sec1 private", data: sec1, want: want{[]Kind{PrivateKey}, []Encoding{SEC1}}},
		{name: "mislabelled pkcs8 as RSA PRIVATE KEY", data: keytest.Encode("RSA PRIVATE KEY", pkcs8der),
			want: want{[]Kind{PrivateKey}, []Encoding{PKCS8}}},
		{name: "ec parameters then key", data: cat(keytest.Encode("EC PARAMETERS", []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}), sec1),
			want: want{[]Kind{ECParameters, PrivateKey}, []Encoding{"", SEC1}}},
		{name: "public key bundle", data: cat(keytest.PublicPEM(t, &rk.PublicKey), []byte("\n\n"), keytest.PublicPEM(t, &ek.PublicKey),
			keytest.Encode("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey))),
			want: want{[]Kind{PublicKey, PublicKey, PublicKey}, []Encoding{PKIX, PKIX, PKCS1}}},
		{name: "CRLF", data: []byte(strings.ReplaceAll(string(cat(cert, pkcs1)), "\n", "\r\n")),
			want: want{[]Kind{Certificate, PrivateKey}, []Encoding{X509, PKCS1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse("f.pem", tc.data)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				if f != nil {
					t.Errorf("got a File along with an error")
				}
				if !strings.Contains(err.Error(), tc.errText) {
					t.Errorf("err %q does not contain %q", err, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(f.Blocks) != len(tc.want.kinds) {
				t.Fatalf("got %d blocks, want %d", len(f.Blocks), len(tc.want.kinds))
			}
			for i, b := range f.Blocks {
				if b.Kind != tc.want.kinds[i] || b.Encoding != tc.want.encs[i] || b.Index != i+1 {
					t.Errorf("block %d: %v %s %s, want %s %s", i, b, b.Kind, b.Encoding, tc.want.kinds[i], tc.want.encs[i])
				}
				if b.Kind != ECParameters && b.Public == nil {
					t.Errorf("block %d: no public key", i)
				}
			}
		})
	}
}

func TestParseLines(t *testing.T) {
	k := keytest.EC(t)
	pub := keytest.PublicPEM(t, &k.PublicKey)
	n := strings.Count(string(pub), "\n")
	f, err := Parse("f", cat([]byte("\n\n"), pub, []byte("\n"), pub))
	if err != nil {
		t.Fatal(err)
	}
	if f.Blocks[0].Line != 3 || f.Blocks[1].Line != 3+n+1 {
		t.Errorf("lines %d, %d; want 3, %d", f.Blocks[0].Line, f.Blocks[1].Line, 3+n+1)
	}
}

// Errors and formatted blocks must never carry private key material.
func TestNoKeyMaterialInOutput(t *testing.T) {
	k := keytest.RSA(t, 1024)
	good := keytest.PKCS1PEM(k)
	der := x509.MarshalPKCS1PrivateKey(k)
	broken := keytest.Encode("RSA PRIVATE KEY", der[:len(der)-40])
	body := func(p []byte) []string {
		lines := strings.Split(strings.TrimSpace(string(p)), "\n")
		return lines[1 : len(lines)-1]
	}
	_, parseErr := Parse("k.pem", broken)
	if !errors.Is(parseErr, ErrParse) {
		t.Fatalf("err = %v, want ErrParse", parseErr)
	}
	f, err := Parse("k.pem", good)
	if err != nil {
		t.Fatal(err)
	}
	checkErr := f.Check(Options{ForbidPrivate: true})
	if !errors.Is(checkErr, ErrPrivateKey) {
		t.Fatalf("err = %v, want ErrPrivateKey", checkErr)
	}
	out := parseErr.Error() + checkErr.Error() + fmt.Sprintf("%v %+v %#v %v", f.Blocks[0], f.Blocks[0], f.Blocks[0], f)
	for _, secret := range append(body(good), body(broken)...) {
		if strings.Contains(out, secret) {
			t.Fatalf("output contains key PEM line %q", secret)
		}
	}
	for _, secret := range []string{k.D.String(), k.Primes[0].String(), k.D.Text(16)} {
		if strings.Contains(out, secret) {
			t.Fatal("output contains private key numbers")
		}
	}
}
