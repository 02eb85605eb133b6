package pemcheck

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// DER gives back each block's own DER, for every encoding Parse accepts.
func TestBlockDERRoundTrip(t *testing.T) {
	rk, ek := rsaKey(t), ecKey(t)
	now := time.Now()
	pkixDER, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	pkcs8DER, _ := x509.MarshalPKCS8PrivateKey(ek)
	sec1DER, _ := x509.MarshalECPrivateKey(ek)
	cert, _ := pem.Decode(certPEM(t, rk, "c", now.Add(-time.Hour), now.Add(time.Hour)))
	ders := [][]byte{cert.Bytes, pkixDER, x509.MarshalPKCS1PublicKey(&rk.PublicKey), pkcs8DER, x509.MarshalPKCS1PrivateKey(rk), sec1DER}
	data := cat(encode("CERTIFICATE", ders[0]), encode("PUBLIC KEY", ders[1]), encode("RSA PUBLIC KEY", ders[2]),
		encode("PRIVATE KEY", ders[3]), encode("RSA PRIVATE KEY", ders[4]), encode("EC PRIVATE KEY", ders[5]))
	f, err := Parse("all", data)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range f.Blocks {
		got, err := b.DER()
		if err != nil || !bytes.Equal(got, ders[i]) {
			t.Errorf("%s: DER() differs from the block's DER (%v)", b, err)
		}
	}
}

// PublicPEM writes one key the same way whatever form it was read from.
func TestPublicPEMCanonical(t *testing.T) {
	rk := rsaKey(t)
	want := string(pkixPEM(t, &rk.PublicKey))
	for _, data := range [][]byte{
		pkixPEM(t, &rk.PublicKey),
		encode("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey)),
		bytes.ReplaceAll(pkixPEM(t, &rk.PublicKey), []byte("\n"), []byte(" \r\n")),
		pkcs8PEM(t, rk),
	} {
		f, err := Parse("k", data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := PublicPEM(f.Blocks[0].Public)
		if err != nil || string(got) != want {
			t.Errorf("PublicPEM = %q, %v; want %q", got, err, want)
		}
	}
}
