package saferestart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
)

// TestPreflightRefusesBeforeLocking: a broken file stops the restart before
// anything touches etcd. The server is this test's alone, so an unchanged
// revision proves no lock key (nor anything else) was ever written.
func TestPreflightRefusesBeforeLocking(t *testing.T) {
	t.Parallel()
	s := etcdtest.Start(t)
	cli := s.Client(t)
	dir := t.TempDir()
	ca := etcdtest.NewCA(t, "preflight CA")
	goodCert, goodKey := ca.Issue(t, "apiserver", true, time.Now().Add(24*time.Hour))
	_, otherKey := ca.Issue(t, "other", true, time.Now().Add(24*time.Hour))
	expiredCert, _ := ca.Issue(t, "expired", true, time.Now().Add(-time.Hour))
	certFile := writeFile(t, filepath.Join(dir, "apiserver.pem"), goodCert)
	keyFile := writeFile(t, filepath.Join(dir, "apiserver-key.pem"), goodKey)
	otherKeyFile := writeFile(t, filepath.Join(dir, "other-key.pem"), otherKey)
	empty := writeFile(t, filepath.Join(dir, "sa-bundle.pem"), nil)
	garbage := writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"))
	expired := writeFile(t, filepath.Join(dir, "expired.pem"), expiredCert)
	mismatch := writeFile(t, filepath.Join(dir, "kube-apiserver.env"),
		[]byte(fmt.Sprintf("KUBE_API_ARGS=\"--tls-cert-file=%s --tls-private-key-file=%s\"\n", certFile, otherKeyFile)))
	matching := writeFile(t, filepath.Join(dir, "kube-apiserver-ok.env"),
		[]byte(fmt.Sprintf("KUBE_API_ARGS=\"--tls-cert-file=%s --tls-private-key-file=%s\"\n", certFile, keyFile)))

	revision := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "preflight/", clientCountOnlyPrefix()...)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count != 0 {
			t.Fatalf("%d keys under the lock prefix", resp.Count)
		}
		return resp.Header.Revision
	}
	before := revision()
	ran := filepath.Join(dir, "ran")
	for _, tc := range []struct {
		name  string
		args  []string
		names string // the file the message must name
	}{
		{"empty bundle", []string{"--preflight-file", empty}, empty},
		{"garbage PEM", []string{"--preflight-file", garbage}, garbage},
		{"cert does not match key", []string{"--preflight-flags-file", mismatch}, otherKeyFile},
		{"expired cert", []string{"--preflight-file", expired}, expired},
		{"health gate that cannot work", []string{"--health-url", "https://127.0.0.1:6443/readyz", "--health-cacert", garbage}, garbage},
	} {
		args := append(lockArgs("preflight", tc.args...), "--", "touch", ran)
		p := runBin(t, env(s), args...)
		if p.code != codePreflight {
			t.Errorf("%s: exit %d, want %d\n%s", tc.name, p.code, codePreflight, p.stderr)
			continue
		}
		if !strings.Contains(p.stderr.String(), tc.names) {
			t.Errorf("%s: message does not name %s:\n%s", tc.name, tc.names, p.stderr)
		}
	}
	if after := revision(); after != before {
		t.Fatalf("etcd revision moved from %d to %d: a refused restart wrote to etcd", before, after)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("a refused restart ran its command")
	}
	// Good files pass, and the restart goes ahead.
	p := runBin(t, env(s), append(lockArgs("preflight", "--preflight-file", certFile, "--preflight-flags-file", matching), "--", "touch", ran)...)
	if p.code != codeOK {
		t.Fatalf("valid files: exit %d\n%s", p.code, p.stderr)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatal("command did not run after a passing preflight")
	}
}

// TestCheckSubcommand: confd's check_cmd contract, without etcd.
func TestCheckSubcommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := etcdtest.NewCA(t, "check CA")
	caPub := keytest.PublicPEM(t, &ca.Key.PublicKey)
	pub := writeFile(t, filepath.Join(dir, "sa.pub"), caPub)
	certPEM, keyPEM := ca.Issue(t, "signer", false, time.Now().Add(time.Hour))
	cert := writeFile(t, filepath.Join(dir, "cert.pem"), certPEM)
	priv := writeFile(t, filepath.Join(dir, "sa.key"), keyPEM)
	garbage := writeFile(t, filepath.Join(dir, "garbage.pem"), []byte("not pem at all\n"))
	// A staged apiserver flags file whose signing key is (or is not) in its bundle.
	rsaKey := keytest.RSA(t, 2048)
	signing := writeFile(t, filepath.Join(dir, "signing.key"), keytest.PKCS1PEM(rsaKey))
	bundle := writeFile(t, filepath.Join(dir, "bundle.pem"), append(keytest.PublicPEM(t, &rsaKey.PublicKey), caPub...))
	goodFlags := writeFile(t, filepath.Join(dir, "good.env"), []byte("ARGS=\"--service-account-key-file="+bundle+" --service-account-signing-key-file="+signing+"\"\n"))
	badFlags := writeFile(t, filepath.Join(dir, "bad.env"), []byte("ARGS=\"--service-account-key-file="+pub+" --service-account-signing-key-file="+signing+"\"\n"))
	bundleBytes, _ := os.ReadFile(bundle)
	bom := writeFile(t, filepath.Join(dir, "bom.pem"), append([]byte("\xef\xbb\xbf"), bundleBytes...))
	indented := writeFile(t, filepath.Join(dir, "indented.pem"), []byte(strings.Replace(string(bundleBytes), "\n-----BEGIN", "\n\t-----BEGIN", 1)))
	// No etcd: point at nothing, so any etcd use would fail the test.
	noEtcd := env(nil, "ETCDCTL_ENDPOINTS="+etcdtest.UnusedEndpoint(t))
	for _, tc := range []struct {
		args   []string
		want   int
		stderr string
	}{
		{[]string{"check", pub}, codeOK, ""},
		{[]string{"check", "--public-only", pub}, codeOK, ""},
		{[]string{"check", garbage}, codePreflight, garbage},
		{[]string{"check", pub, filepath.Join(dir, "missing.pem")}, codePreflight, "missing.pem"},
		{[]string{"check", "--public-only", priv}, codePreflight, priv},
		{[]string{"check"}, codeUsage, "FILE"},
		{[]string{"check", "--preflight-flags-file", goodFlags}, codeOK, ""},
		{[]string{"check", "--public-only", bundle, "--preflight-flags-file", goodFlags}, codeOK, ""},
		{[]string{"check", "--preflight-flags-file", badFlags}, codePreflight, "bad.env"},
		{[]string{"check", "--preflight-flags-file", filepath.Join(dir, "absent.env")}, codePreflight, "absent.env"},
		// This host's key must be in the bundle; the private key names it.
		{[]string{"check", "--public-only", "--require-key", signing, bundle}, codeOK, ""},
		{[]string{"check", "--public-only", "--require-key", signing, pub}, codePreflight, "sa.pub"},
		{[]string{"check", "--require-key", signing, "--preflight-flags-file", goodFlags}, codeUsage, "--require-key"},
		// A certificate published as a key: loaded by the apiserver, refused with --keys-only.
		{[]string{"check", "--public-only", "--keys-only", cert}, codePreflight, "cert.pem: block 1"},
		{[]string{"check", "--public-only", "--keys-only", bundle}, codeOK, ""},
		// kube-apiserver would not see a key after a BOM or an indented BEGIN.
		{[]string{"check", bom}, codePreflight, "bom.pem: line 1"},
		{[]string{"check", indented}, codePreflight, "indented.pem: block 2 (line 10"},
	} {
		p := runBin(t, noEtcd, tc.args...)
		if p.code != tc.want {
			t.Errorf("%q: exit %d, want %d\n%s", tc.args, p.code, tc.want, p.stderr)
		}
		if tc.stderr != "" && !strings.Contains(p.stderr.String(), tc.stderr) {
			t.Errorf("%q: stderr does not name %s:\n%s", tc.args, tc.stderr, p.stderr)
		}
		if tc.want == codeOK && p.stderr.String() != "" {
			t.Errorf("%q: valid files, yet stderr:\n%s", tc.args, p.stderr)
		}
		if strings.Contains(p.stderr.String(), "PRIVATE KEY-----") {
			t.Errorf("%q: key material in the output", tc.args)
		}
	}
}

// The Makefile stamps internal/version.Version; `version` must print that
// stamp on its first line (the commit and its date follow).
func TestVersionPrintsTheStamp(t *testing.T) {
	p := runBin(t, env(nil), "version")
	if first, _, _ := strings.Cut(p.stdout.String(), "\n"); p.code != codeOK || first != "kube-apiserver-safe-restart "+stampedVersion {
		t.Fatalf("version: exit %d, %q", p.code, p.stdout.String())
	}
}
