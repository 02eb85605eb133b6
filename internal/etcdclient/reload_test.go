package etcdclient

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
)

// TestTLSFilesFollowDisk: a renewed certificate is used by the next
// handshake; a half-written renewal keeps the last good pair; an expired
// certificate is reported as expired, naming the file.
func TestTLSFilesFollowDisk(t *testing.T) {
	files := etcdtest.WriteTLSFiles(t, t.TempDir())
	cfg := Config{ClientCAKeys: files.CA, ClientCert: files.ClientCert, ClientKey: files.ClientKey}
	initial, err := tlsConfig(cfg, []string{"https://127.0.0.1:2379"})
	if err != nil {
		t.Fatal(err)
	}
	f := newTLSFiles(cfg, initial)
	serialOf := func() string {
		t.Helper()
		tc, err := f.config()
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(tc.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.String()
	}
	first := serialOf()
	if serialOf() != first {
		t.Fatal("unchanged files gave another certificate")
	}
	write := func(p string, b []byte) {
		t.Helper()
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
	}
	cert, key := files.Authority.Issue(t, "root", false, time.Now().Add(time.Hour))
	write(files.ClientCert, cert) // key not yet renewed: a mismatched pair
	if got := serialOf(); got != first {
		t.Fatal("a half-written renewal replaced the working pair")
	}
	write(files.ClientKey, key)
	renewed := serialOf()
	if renewed == first {
		t.Fatal("the renewed certificate was not read")
	}
	f.now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if _, err := f.config(); err == nil || !strings.Contains(err.Error(), "expired at") || !strings.Contains(err.Error(), files.ClientCert) {
		t.Fatalf("expired certificate: err = %v", err)
	}
}

func TestCertificateProblem(t *testing.T) {
	dir := t.TempDir()
	ca := etcdtest.NewCA(t, "test CA")
	cert, _ := ca.Issue(t, "root", false, time.Now().Add(-time.Minute))
	p := filepath.Join(dir, "old.pem")
	if err := os.WriteFile(p, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CertificateProblem(Config{ClientCert: p}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired: %v", err)
	}
	good, _ := ca.Issue(t, "root", false, time.Now().Add(time.Hour))
	if err := os.WriteFile(p, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CertificateProblem(Config{ClientCert: p}); err != nil {
		t.Errorf("valid certificate: %v", err)
	}
}
