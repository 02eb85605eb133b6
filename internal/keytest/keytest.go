// Package keytest makes keys, their PEM forms and certificates for tests.
// It is for _test.go files only: nothing built into a binary imports it.
// It computes key IDs itself and imports no package of this module, so
// that the packages it serves (pemcheck among them) can use it in their
// own tests without an import cycle, and check their key IDs against an
// independent computation.
package keytest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

// RSA returns a new RSA key of bits bits (1024, the least Go accepts,
// keeps a test fast where the size does not matter).
func RSA(t testing.TB, bits int) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// EC returns a new P-256 ECDSA key.
func EC(t testing.TB) *ecdsa.PrivateKey { return ECCurve(t, elliptic.P256()) }

// ECCurve returns a new ECDSA key on c.
func ECCurve(t testing.TB, c elliptic.Curve) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Encode is one PEM block of type typ.
func Encode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// PKIX is pub's PKIX DER.
func PKIX(t testing.TB, pub crypto.PublicKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// PublicPEM is pub as a "PUBLIC KEY" (PKIX) block.
func PublicPEM(t testing.TB, pub crypto.PublicKey) []byte {
	t.Helper()
	return Encode("PUBLIC KEY", PKIX(t, pub))
}

// PKCS8PEM is key as a "PRIVATE KEY" (PKCS#8) block.
func PKCS8PEM(t testing.TB, key crypto.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Encode("PRIVATE KEY", der)
}

// SEC1PEM is k as an "EC PRIVATE KEY" (SEC 1) block.
func SEC1PEM(t testing.TB, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return Encode("EC PRIVATE KEY", der)
}

// PKCS1PEM is k as an "RSA PRIVATE KEY" (PKCS#1) block.
func PKCS1PEM(k *rsa.PrivateKey) []byte {
	return Encode("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k))
}

// KeyID is Kubernetes' key ID of pub, computed here: base64url without
// padding of the SHA-256 of the PKIX DER (keyIDFromPublicKey,
// k8s.io/kubernetes pkg/serviceaccount/jwt.go).
func KeyID(t testing.TB, pub crypto.PublicKey) string {
	t.Helper()
	sum := sha256.Sum256(PKIX(t, pub))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// CertPEM is a self-signed "CERTIFICATE" block of key named cn, valid from
// notBefore to notAfter.
func CertPEM(t testing.TB, key crypto.Signer, cn string, notBefore, notAfter time.Time) []byte {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return Encode("CERTIFICATE", der)
}

// IssuedCertPEM is a "CERTIFICATE" block for pub made from tmpl (a copy;
// its serial number and validity default to now and a day around it) and
// signed by issuerKey as issuer; a nil issuer makes it self-issued, so
// issuerKey must then be pub's own key. It returns the parsed certificate
// too, to issue others from. Tests of CA chains need certificates whose
// extensions (basic constraints, key usage) and issuer they choose.
func IssuedCertPEM(t testing.TB, pub crypto.PublicKey, tmpl x509.Certificate, issuer *x509.Certificate, issuerKey crypto.Signer) ([]byte, *x509.Certificate) {
	t.Helper()
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-24*time.Hour), time.Now().Add(24*time.Hour)
	}
	if issuer == nil {
		issuer = &tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, issuer, pub, issuerKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return Encode("CERTIFICATE", der), c
}
