package pemcheck

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

// DER gives back each block's own DER, for every encoding Parse accepts.
func TestBlockDERRoundTrip(t *testing.T) {
	rk, ek := keytest.RSA(t, 1024), keytest.EC(t)
	now := time.Now()
	pkixDER, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	pkcs8DER, _ := x509.MarshalPKCS8PrivateKey(ek)
	sec1DER, _ := x509.MarshalECPrivateKey(ek)
	cert, _ := pem.Decode(keytest.CertPEM(t, rk, "c", now.Add(-time.Hour), now.Add(time.Hour)))
	ders := [][]byte{cert.Bytes, pkixDER, x509.MarshalPKCS1PublicKey(&rk.PublicKey), pkcs8DER, x509.MarshalPKCS1PrivateKey(rk), sec1DER}
	data := cat(keytest.Encode("CERTIFICATE", ders[0]), keytest.Encode("PUBLIC KEY", ders[1]), keytest.Encode("RSA PUBLIC KEY", ders[2]),
		keytest.Encode("PRIVATE KEY", ders[3]), keytest.Encode("RSA PRIVATE KEY", ders[4]), keytest.Encode("EC PRIVATE KEY", ders[5]))
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
	rk := keytest.RSA(t, 1024)
	want := string(keytest.PublicPEM(t, &rk.PublicKey))
	for _, data := range [][]byte{
		keytest.PublicPEM(t, &rk.PublicKey),
		keytest.Encode("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&rk.PublicKey)),
		bytes.ReplaceAll(keytest.PublicPEM(t, &rk.PublicKey), []byte("\n"), []byte(" \r\n")),
		keytest.PKCS8PEM(t, rk),
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
