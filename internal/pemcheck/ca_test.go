package pemcheck

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/keytest"
)

// caFixtures are the certificates of issue 34's report: a CA, the leaf it
// issued (leaf.crt + ca.crt in one file published both keys), and CAs
// marked each way a CA can be, or not marked at all.
type caFixtures struct {
	ca, keyCertSign, unmarked, leaf, leaf2, byUnmarked, selfSigned, weakCert []byte
	caPub, leafPub, weakPub, strongPub, caKeyPEM                             []byte
}

func newCAFixtures(t *testing.T) caFixtures {
	t.Helper()
	caKey, unmarkedKey, signKey := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	leafKey, leaf2Key, selfKey := keytest.EC(t), keytest.EC(t), keytest.EC(t)
	weak, strong := keytest.RSA(t, 1024), keytest.RSA(t, 2048)
	var f caFixtures
	var ca, unmarked *x509.Certificate
	f.ca, ca = keytest.IssuedCertPEM(t, caKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "ca"},
		BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign}, nil, caKey)
	f.keyCertSign, _ = keytest.IssuedCertPEM(t, signKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "signs"},
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, signKey)
	f.unmarked, unmarked = keytest.IssuedCertPEM(t, unmarkedKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "v1-style ca"}}, nil, unmarkedKey)
	leafTmpl := x509.Certificate{Subject: pkix.Name{CommonName: "master-1"}, KeyUsage: x509.KeyUsageDigitalSignature}
	f.leaf, _ = keytest.IssuedCertPEM(t, leafKey.Public(), leafTmpl, ca, caKey)
	leafTmpl.Subject.CommonName = "master-1 renewed"
	f.leaf2, _ = keytest.IssuedCertPEM(t, leaf2Key.Public(), leafTmpl, ca, caKey)
	f.byUnmarked, _ = keytest.IssuedCertPEM(t, leafKey.Public(), leafTmpl, unmarked, unmarkedKey)
	f.selfSigned, _ = keytest.IssuedCertPEM(t, selfKey.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "self"}}, nil, selfKey)
	f.weakCert, _ = keytest.IssuedCertPEM(t, weak.Public(), x509.Certificate{Subject: pkix.Name{CommonName: "weak"}}, nil, weak)
	f.caPub, f.leafPub = keytest.PublicPEM(t, caKey.Public()), keytest.PublicPEM(t, leafKey.Public())
	f.weakPub, f.strongPub = keytest.PublicPEM(t, weak.Public()), keytest.PublicPEM(t, strong.Public())
	f.caKeyPEM = keytest.SEC1PEM(t, caKey)
	return f
}

func TestCAs(t *testing.T) {
	f := newCAFixtures(t)
	for _, tc := range []struct {
		name   string
		data   []byte
		blocks []int  // the CA blocks, in order
		reason string // in the first one's reason
	}{
		{"leaf alone", f.leaf, nil, ""},
		{"two leaves of one CA (a renewal)", cat(f.leaf, f.leaf2), nil, ""},
		{"self-signed", f.selfSigned, nil, ""},
		{"bare keys", cat(f.leafPub, f.strongPub), nil, ""},
		{"CA:TRUE", f.ca, []int{1}, "basic constraints CA:TRUE"},
		{"keyCertSign without CA:TRUE", f.keyCertSign, []int{1}, "keyCertSign"},
		{"leaf then CA", cat(f.leaf, f.ca), []int{2}, "CA:TRUE"},
		{"unmarked issuer after its leaf", cat(f.byUnmarked, f.unmarked), []int{2}, `signed the certificate of block 1, "CN=master-1 renewed"`},
		{"unmarked issuer before its leaf", cat(f.unmarked, f.byUnmarked), []int{1}, "block 2"},
		{"the CA's bare key beside its leaf", cat(f.leaf, f.caPub), []int{2}, "signed the certificate of block 1"},
		{"the CA's private key beside its leaf", cat(f.leaf, f.caKeyPEM), []int{2}, "signed the certificate of block 1"},
		// The leaf's own key signed nothing but (for a self-signed
		// certificate) the certificate carrying it.
		{"self-signed with its key", cat(f.selfSigned, f.leafPub), nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, err := Parse("f.pem", tc.data)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, ca := range file.CAs() {
				got = append(got, ca.Block.Index)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.blocks) {
				t.Fatalf("CA blocks %v, want %v", got, tc.blocks)
			}
			if len(got) > 0 && !strings.Contains(file.CAs()[0].Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", file.CAs()[0].Reason, tc.reason)
			}
		})
	}
}

// CheckPublishable refuses what publish-key must not publish, naming the
// file and the block; the rest passes.
func TestCheckPublishable(t *testing.T) {
	f := newCAFixtures(t)
	leafLines := strings.Count(string(f.leaf), "\n")
	for _, tc := range []struct {
		name string
		data []byte
		errs []error
		text []string
	}{
		{name: "leaf", data: f.leaf},
		{name: "public key", data: f.strongPub},
		{name: "two public keys", data: cat(f.strongPub, f.leafPub)},
		{name: "self-signed", data: f.selfSigned},
		{name: "leaf + ca.crt (issue 34)", data: cat(f.leaf, f.ca), errs: []error{ErrCA},
			text: []string{fmt.Sprintf("f.pem: block 2 (line %d, CERTIFICATE): ", leafLines+1), "CA:TRUE", "sign tokens every apiserver accepts"}},
		{name: "CA alone", data: f.ca, errs: []error{ErrCA}, text: []string{"f.pem: block 1 (line 1, CERTIFICATE)"}},
		{name: "keyCertSign", data: f.keyCertSign, errs: []error{ErrCA}, text: []string{"keyCertSign"}},
		{name: "unmarked issuer", data: cat(f.byUnmarked, f.unmarked), errs: []error{ErrCA}, text: []string{"block 2", "signed the certificate of block 1"}},
		{name: "the CA's key as a public key", data: cat(f.leaf, f.caPub), errs: []error{ErrCA}, text: []string{"block 2", "PUBLIC KEY"}},
		{name: "two leaves", data: cat(f.leaf, f.leaf2), errs: []error{ErrLeaves}, text: []string{"f.pem: block 2", "block 1 is one too"}},
		{name: "two leaves and their CA", data: cat(f.leaf, f.leaf2, f.ca), errs: []error{ErrCA, ErrLeaves}},
		{name: "RSA-1024 public key", data: f.weakPub, errs: []error{ErrWeakKey}, text: []string{"f.pem: block 1 (line 1, PUBLIC KEY)", "1024 bits"}},
		{name: "RSA-1024 certificate", data: f.weakCert, errs: []error{ErrWeakKey}, text: []string{"block 1", "1024 bits"}},
		{name: "RSA-1024 beside RSA-2048", data: cat(f.strongPub, f.weakPub), errs: []error{ErrWeakKey}, text: []string{"block 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, err := Parse("f.pem", tc.data)
			if err != nil {
				t.Fatal(err)
			}
			err = CheckPublishable(file)
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range tc.errs {
				if !errors.Is(err, want) {
					t.Errorf("err %q does not wrap %v", err, want)
				}
			}
			for _, s := range tc.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("err %q does not contain %q", err, s)
				}
			}
			if strings.Contains(err.Error(), "MII") || strings.Contains(err.Error(), "-----BEGIN") {
				t.Errorf("error quotes the file: %v", err)
			}
		})
	}
}

// Options.ForbidCA, which check and preflight set for service-account key
// files, refuses a CA's key wherever it is in the file, and only that.
func TestCheckForbidCA(t *testing.T) {
	f := newCAFixtures(t)
	for _, tc := range []struct {
		name string
		data []byte
		err  bool
	}{
		{"bundle of leaves and keys", cat(f.leaf, f.leaf2, f.strongPub, f.selfSigned), false},
		{"CA:TRUE in a bundle", cat(f.strongPub, f.ca), true},
		{"unmarked issuer in a bundle", cat(f.unmarked, f.strongPub, f.byUnmarked), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file, err := Parse("b.pem", tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if err := file.Check(Options{}); err != nil {
				t.Fatalf("without ForbidCA: %v", err)
			}
			err = file.Check(Options{ForbidCA: true})
			if tc.err != errors.Is(err, ErrCA) {
				t.Fatalf("err = %v, want ErrCA: %v", err, tc.err)
			}
		})
	}
}
