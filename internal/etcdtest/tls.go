package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TLSFiles are PEM files of a throwaway CA, a server certificate for
// 127.0.0.1/localhost, a client certificate the CA signed, and a client
// certificate from a different CA (which the server must refuse).
type TLSFiles struct {
	Dir                 string
	CA                  string
	ServerCert          string
	ServerKey           string
	ClientCert          string
	ClientKey           string
	UntrustedClientCert string
	UntrustedClientKey  string
	// Authority is the CA that signed the server and client certificates,
	// to issue renewed ones.
	Authority *CA
}

// ClientTLSConfig is the configuration a well-behaved client uses.
func (f *TLSFiles) ClientTLSConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no CA certificate in %s", f.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// CA is an in-memory certificate authority for tests.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte
}

// NewCA makes a self-signed CA valid for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := mustKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA: %v", err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue signs a leaf certificate for cn; server certificates get loopback SANs.
// It returns the certificate and private key in PEM.
func (ca *CA) Issue(t testing.TB, cn string, server bool, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key := mustKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
	}
	if server {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatalf("issue %s: %v", cn, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("marshal key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// WriteTLSFiles writes a CA, server and client certificates into dir.
func WriteTLSFiles(t testing.TB, dir string) *TLSFiles {
	t.Helper()
	ca := NewCA(t, "etcdtest CA")
	other := NewCA(t, "untrusted CA")
	f := &TLSFiles{
		Dir:                 dir,
		CA:                  filepath.Join(dir, "ca.pem"),
		ServerCert:          filepath.Join(dir, "server.pem"),
		ServerKey:           filepath.Join(dir, "server-key.pem"),
		ClientCert:          filepath.Join(dir, "client.pem"),
		ClientKey:           filepath.Join(dir, "client-key.pem"),
		UntrustedClientCert: filepath.Join(dir, "untrusted.pem"),
		UntrustedClientKey:  filepath.Join(dir, "untrusted-key.pem"),
		Authority:           ca,
	}
	exp := time.Now().Add(24 * time.Hour)
	sc, sk := ca.Issue(t, "etcd-server", true, exp)
	cc, ck := ca.Issue(t, "root", false, exp)
	uc, uk := other.Issue(t, "root", false, exp)
	for path, data := range map[string][]byte{
		f.CA: ca.PEM, f.ServerCert: sc, f.ServerKey: sk, f.ClientCert: cc, f.ClientKey: ck,
		f.UntrustedClientCert: uc, f.UntrustedClientKey: uk,
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	return f
}

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatalf("serial: %v", err)
	}
	return n
}
