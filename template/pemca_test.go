package template

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

// Issue 34: a host published leaf.crt + ca.crt as one value and the bundle
// carried the CA's key, so whoever holds the CA's private key could mint
// tokens every apiserver accepted. publicKeys drops a CA's block and keeps
// the rest of the value; a renewal's two leaves are both kept.
func TestPublicKeysDropsCA(t *testing.T) {
	caKey, plainKey := keytest.EC(t), keytest.EC(t)
	leafKey, renewedKey, otherKey, bareKey := keytest.EC(t), keytest.EC(t), keytest.EC(t), keytest.RSA(t, 2048)
	caPEM, ca := keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "ca"},
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign}, nil, caKey)
	// An issuer without CA:TRUE or keyCertSign: a CA all the same.
	plainPEM, plain := keytest.IssuedCertPEM(t, plainKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "plain"}}, nil, plainKey)
	tmpl := x509.Certificate{Subject: pkix.Name{CommonName: "master"}, KeyUsage: x509.KeyUsageDigitalSignature}
	leafPEM, _ := keytest.IssuedCertPEM(t, leafKey.Public(), tmpl, ca, caKey)
	renewedPEM, _ := keytest.IssuedCertPEM(t, renewedKey.Public(), tmpl, ca, caKey)
	otherPEM, _ := keytest.IssuedCertPEM(t, otherKey.Public(), tmpl, plain, plainKey)
	bare := string(keytest.PublicPEM(t, bareKey.Public()))

	kid := func(k any) string { return keytest.KeyID(t, k) }
	kvs := memkv.KVPairs{
		{Key: "/sa/m1", Value: string(leafPEM) + string(caPEM)},                                    // issue 34's file
		{Key: "/sa/m2", Value: string(leafPEM) + string(renewedPEM)},                               // a renewal: two leaves
		{Key: "/sa/m3", Value: string(plainPEM) + string(otherPEM)},                                // unmarked issuer first
		{Key: "/sa/m4", Value: bare + string(caPEM)},                                               // a bare key beside a CA
		{Key: "/sa/m5", Value: string(otherPEM) + string(keytest.PublicPEM(t, plainKey.Public()))}, // the CA's bare key
	}
	keys, err := publicKeys(nil, kvs)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range keys {
		got = append(got, k.KeyID)
	}
	want := []string{kid(leafKey.Public()), kid(renewedKey.Public()), kid(otherKey.Public()), kid(bareKey.Public())}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("key IDs %v, want %v (CA %s, plain issuer %s)", got, want, kid(caKey.Public()), kid(plainKey.Public()))
	}
	for _, k := range keys {
		if k.KeyID == kid(leafKey.Public()) && strings.Join(k.Sources, ",") != "/sa/m1,/sa/m2" {
			t.Errorf("leaf sources %v", k.Sources)
		}
	}

	// A value with nothing but a CA's key fails the render, naming it: it
	// is a bad value, like one holding nothing but a private key.
	_, err = publicKeys(nil, append(kvs, memkv.KVPair{Key: "/sa/m6", Value: string(caPEM)}))
	if !errors.Is(err, pemcheck.ErrCA) || !strings.Contains(err.Error(), "/sa/m6: block 1 (line 1, CERTIFICATE)") {
		t.Fatalf("CA-only value: %v", err)
	}
	// A CA's private key is still refused as a private key, not dropped.
	_, err = publicKeys(nil, string(leafPEM)+string(keytest.SEC1PEM(t, caKey)))
	if !errors.Is(err, pemcheck.ErrPrivateKey) {
		t.Fatalf("CA's private key beside its leaf: %v", err)
	}
}

// A render tells Options.Warn which value's block publicKeys left out, so
// that confd logs it: the bundle silently lacking a key a value holds would
// hide the misconfiguration from whoever published it.
func TestPublicKeysWarnsOfDroppedCA(t *testing.T) {
	caKey, leafKey := keytest.EC(t), keytest.EC(t)
	caPEM, ca := keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "ca"},
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign}, nil, caKey)
	leafPEM, _ := keytest.IssuedCertPEM(t, leafKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "m1"}}, ca, caKey)
	src := filepath.Join(t.TempDir(), "bundle.tmpl")
	if err := os.WriteFile(src, []byte(`{{range publicKeys (gets "/sa/*")}}{{.}}{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	out, err := Render(src, map[string]string{"/sa/m1": string(leafPEM) + string(caPEM)}, Options{Warn: func(m string) { warnings = append(warnings, m) }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "BEGIN PUBLIC KEY") || len(warnings) != 1 ||
		!strings.Contains(warnings[0], "/sa/m1 block 2 (line") || !strings.Contains(warnings[0], "certificate authority") {
		t.Fatalf("rendered %q, warnings %q: want the leaf's key and one warning naming /sa/m1's block 2", out, warnings)
	}
}
