package keytest

import (
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	"github.com/keysync/confd/internal/pemcheck"
)

// Each form parses back to the key it was made of; the key ID is the one
// the shipped code computes.
func TestForms(t *testing.T) {
	ec, rk := EC(t), RSA(t, 1024)
	block := func(data []byte, typ string) []byte {
		t.Helper()
		b, rest := pem.Decode(data)
		if b == nil || b.Type != typ || len(rest) != 0 {
			t.Fatalf("not one %s block: %q", typ, data)
		}
		return b.Bytes
	}
	if pub, err := x509.ParsePKIXPublicKey(block(PublicPEM(t, &ec.PublicKey), "PUBLIC KEY")); err != nil || !ec.PublicKey.Equal(pub) {
		t.Errorf("PublicPEM: %v", err)
	}
	if k, err := x509.ParsePKCS8PrivateKey(block(PKCS8PEM(t, rk), "PRIVATE KEY")); err != nil || !rk.Equal(k) {
		t.Errorf("PKCS8PEM: %v", err)
	}
	if k, err := x509.ParseECPrivateKey(block(SEC1PEM(t, ec), "EC PRIVATE KEY")); err != nil || !ec.Equal(k) {
		t.Errorf("SEC1PEM: %v", err)
	}
	if k, err := x509.ParsePKCS1PrivateKey(block(PKCS1PEM(rk), "RSA PRIVATE KEY")); err != nil || !rk.Equal(k) {
		t.Errorf("PKCS1PEM: %v", err)
	}
	for _, pub := range []any{&ec.PublicKey, &rk.PublicKey} {
		if want, err := pemcheck.KeyID(pub); err != nil || KeyID(t, pub) != want {
			t.Errorf("KeyID = %s, want %s (%v)", KeyID(t, pub), want, err)
		}
	}
	now := time.Now()
	c, err := x509.ParseCertificate(block(CertPEM(t, ec, "sa", now.Add(-time.Hour), now.Add(time.Hour)), "CERTIFICATE"))
	if err != nil || c.Subject.CommonName != "sa" || !ec.PublicKey.Equal(c.PublicKey) {
		t.Errorf("CertPEM: %v", err)
	}
}
