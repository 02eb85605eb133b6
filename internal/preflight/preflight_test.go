package preflight

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/etcdtest"
	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

// pki is a control plane's worth of PEM files in a temporary directory.
type pki struct {
	dir   string
	files map[string]string // short name → path
}

func (p *pki) path(name string) string { return p.files[name] }

func (p *pki) write(t *testing.T, name string, data ...[]byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, []byte(strings.Join(bytesToStrings(data), "")), 0o600); err != nil {
		t.Fatal(err)
	}
	p.files[name] = path
	return path
}

func bytesToStrings(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}

// newPKI writes a healthy set: this master's signing key, a bundle of every
// master's public key including it, serving and client pairs, and CAs.
func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), files: map[string]string{}}
	ca := etcdtest.NewCA(t, "kubernetes")
	exp := time.Now().Add(time.Hour)
	self, other := keytest.RSA(t, 1024), keytest.RSA(t, 1024)
	p.write(t, "sa.key", keytest.PKCS1PEM(self))
	p.write(t, "sa.pub", keytest.PublicPEM(t, &self.PublicKey), keytest.PublicPEM(t, &other.PublicKey))
	p.write(t, "ca.crt", ca.PEM)
	c, k := ca.Issue(t, "kube-apiserver", true, exp)
	p.write(t, "apiserver.crt", c)
	p.write(t, "apiserver.key", k)
	c, k = ca.Issue(t, "etcd-client", false, exp)
	p.write(t, "etcd.pem", c, k) // combined certificate and key
	c, k = ca.Issue(t, "front-proxy-client", false, exp)
	p.write(t, "proxy.crt", c)
	p.write(t, "proxy.key", k)
	c, k = ca.Issue(t, "sni", true, exp)
	p.write(t, "sni.crt", c)
	p.write(t, "sni.key", k)
	return p
}

func (p *pki) flags(t *testing.T, body string) string {
	t.Helper()
	for name, path := range p.files {
		body = strings.ReplaceAll(body, "{"+name+"}", path)
	}
	return p.write(t, "apiserver.env", []byte(body))
}

const goodFlags = `# /etc/default/kube-apiserver
KUBE_API_ARGS="--service-account-key-file={sa.pub} --service-account-signing-key-file={sa.key} \
  --tls-cert-file={apiserver.crt} --tls-private-key-file={apiserver.key} --client-ca-file={ca.crt}"
KUBE_ETCD_ARGS="--etcd-certfile={etcd.pem} --etcd-keyfile={etcd.pem} --etcd-cafile={ca.crt}"
KUBE_PROXY_ARGS="--proxy-client-cert-file {proxy.crt} --proxy-client-key-file {proxy.key} --requestheader-client-ca-file={ca.crt}"
KUBE_SNI="--tls-sni-cert-key={sni.crt},{sni.key}:api.example.com"
`

func TestRunHealthy(t *testing.T) {
	p := newPKI(t)
	// A group may read the signing key (root:kube 0640 for an apiserver
	// run as kube).
	if err := os.Chmod(p.path("sa.key"), 0o640); err != nil {
		t.Fatal(err)
	}
	in := Input{FlagsFiles: []string{p.flags(t, goodFlags)}, Files: []string{p.path("sa.pub"), p.path("ca.crt")}}
	if err := Run(context.Background(), in); err != nil {
		t.Fatalf("healthy PKI: %v", err)
	}
}

func TestRunProblems(t *testing.T) {
	tests := []struct {
		name  string
		flags string
		setup func(t *testing.T, p *pki)
		errs  []error
		text  []string
	}{
		{
			name:  "missing file names flag, file and source",
			flags: "--tls-cert-file=/nonexistent/apiserver.crt\n--tls-private-key-file={apiserver.key}\n",
			errs:  []error{os.ErrNotExist},
			text:  []string{"--tls-cert-file (", "apiserver.env:1): /nonexistent/apiserver.crt: open: no such file"},
		},
		{
			name:  "mismatched tls pair",
			flags: "--tls-cert-file={apiserver.crt}\n--tls-private-key-file={proxy.key}\n",
			errs:  []error{pemcheck.ErrMismatch},
			text:  []string{"--tls-cert-file (", "with --tls-private-key-file (", "proxy.key"},
		},
		{
			name:  "signing key readable by others",
			flags: "--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n",
			setup: func(t *testing.T, p *pki) {
				if err := os.Chmod(p.path("sa.key"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			errs: []error{ErrSigningKeyMode},
			text: []string{"--service-account-signing-key-file (", "mode 0644: run chmod 0640 "},
		},
		{
			name:  "mismatched sni pair",
			flags: "--tls-sni-cert-key={sni.crt},{apiserver.key}\n",
			errs:  []error{pemcheck.ErrMismatch},
		},
		{
			name:  "expired serving certificate",
			flags: "--tls-cert-file={apiserver.crt}\n--tls-private-key-file={apiserver.key}\n",
			setup: func(t *testing.T, p *pki) {
				c, k := etcdtest.NewCA(t, "ca").Issue(t, "old", true, time.Now().Add(-time.Hour))
				p.write(t, "apiserver.crt", c)
				p.write(t, "apiserver.key", k)
			},
			errs: []error{pemcheck.ErrExpired},
			text: []string{"--tls-cert-file (", `"CN=old" expired`},
		},
		{
			name:  "empty bundle",
			flags: "--service-account-key-file={sa.pub}\n",
			setup: func(t *testing.T, p *pki) { p.write(t, "sa.pub") },
			errs:  []error{pemcheck.ErrNoBlock},
			text:  []string{"--service-account-key-file (", "sa.pub: no PEM block"},
		},
		{
			name:  "garbage in bundle",
			flags: "--service-account-key-file={sa.pub}\n",
			setup: func(t *testing.T, p *pki) {
				p.write(t, "sa.pub", keytest.PublicPEM(t, &keytest.RSA(t, 1024).PublicKey), []byte("<html>oops</html>\n"))
			},
			errs: []error{pemcheck.ErrNotPEM},
			text: []string{"sa.pub: line 7"},
		},
		{
			name:  "PKCS#1 public key the apiserver would skip",
			flags: "--service-account-key-file={sa.pub}\n",
			setup: func(t *testing.T, p *pki) {
				k := keytest.RSA(t, 1024)
				p.write(t, "sa.pub", pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.PublicKey)}))
			},
			errs: []error{ErrIgnoredKey},
			text: []string{"RSA PUBLIC KEY"},
		},
		{
			name:  "signing key not in the bundle",
			flags: "--service-account-key-file={sa.pub}\n--service-account-signing-key-file={sa.key}\n",
			setup: func(t *testing.T, p *pki) { p.write(t, "sa.key", keytest.PKCS1PEM(keytest.RSA(t, 1024))) },
			errs:  []error{ErrSigningKeyNotPublished},
			text:  []string{"--service-account-signing-key-file ("},
		},
		{
			name:  "private key in a CA file",
			flags: "--client-ca-file={ca.crt}\n",
			setup: func(t *testing.T, p *pki) {
				ca := etcdtest.NewCA(t, "ca")
				_, k := ca.Issue(t, "x", false, time.Now().Add(time.Hour))
				p.write(t, "ca.crt", ca.PEM, k)
			},
			errs: []error{pemcheck.ErrPrivateKey},
		},
		{
			name:  "no PEM flags at all",
			flags: "KUBE_API_ARGS=\"--v=2 --etcd-servers=https://127.0.0.1:2379\"\n",
			errs:  []error{ErrNoFlags},
		},
		{
			name:  "every problem reported together",
			flags: "--tls-cert-file={apiserver.crt}\n--tls-private-key-file={proxy.key}\n--client-ca-file=/missing/ca.crt\n--service-account-key-file={sa.pub}\n--etcd-cafile=\n",
			setup: func(t *testing.T, p *pki) { p.write(t, "sa.pub", []byte("garbage")) },
			errs:  []error{pemcheck.ErrMismatch, os.ErrNotExist, pemcheck.ErrNotPEM},
			text:  []string{"--etcd-cafile has an empty value", "--client-ca-file (", "--service-account-key-file ("},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPKI(t)
			if tc.setup != nil {
				tc.setup(t, p)
			}
			err := Run(context.Background(), Input{FlagsFiles: []string{p.flags(t, tc.flags)}})
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.errs {
				if !errors.Is(err, want) {
					t.Errorf("error does not wrap %v:\n%v", want, err)
				}
			}
			for _, s := range tc.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not contain %q:\n%v", s, err)
				}
			}
		})
	}
}

func TestRunFiles(t *testing.T) {
	p := newPKI(t)
	garbage := p.write(t, "garbage.pem", []byte("not pem"))
	empty := p.write(t, "empty.pem")
	err := Run(context.Background(), Input{Files: []string{p.path("sa.pub"), garbage, empty, filepath.Join(p.dir, "nope.pem")}})
	for _, want := range []error{pemcheck.ErrNotPEM, pemcheck.ErrNoBlock, os.ErrNotExist} {
		if !errors.Is(err, want) {
			t.Errorf("error does not wrap %v: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "sa.pub") {
		t.Errorf("the good file is blamed: %v", err)
	}
	err = Run(context.Background(), Input{FlagsFiles: []string{filepath.Join(p.dir, "missing.env")}})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.env") {
		t.Errorf("missing flags file: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, Input{Files: []string{p.path("sa.pub")}}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestCheckFiles(t *testing.T) {
	p := newPKI(t)
	k := keytest.RSA(t, 1024)
	withPrivate := p.write(t, "leaky.pub", keytest.PublicPEM(t, &k.PublicKey), keytest.PKCS1PEM(k))
	pkcs1Pub := p.write(t, "pkcs1.pub", pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.PublicKey)}))
	sa, _ := os.ReadFile(p.path("sa.pub"))
	bom := p.write(t, "bom.pub", []byte("\xef\xbb\xbf"), sa)
	indented := p.write(t, "indented.pub", keytest.PublicPEM(t, &k.PublicKey), []byte("  "), sa)
	ctx := context.Background()
	tests := []struct {
		name  string
		paths []string
		opts  CheckOptions
		errs  []error
		msg   string // in the error, when set
	}{
		{name: "public bundle", paths: []string{p.path("sa.pub")}, opts: CheckOptions{PublicOnly: true}},
		{name: "private key refused", paths: []string{withPrivate}, opts: CheckOptions{PublicOnly: true}, errs: []error{pemcheck.ErrPrivateKey}},
		{name: "private key allowed", paths: []string{withPrivate}},
		{name: "pkcs1 public key", paths: []string{pkcs1Pub}, errs: []error{ErrIgnoredKey}},
		{name: "no paths", errs: []error{ErrNoFiles}},
		{name: "every file reported", paths: []string{withPrivate, pkcs1Pub, filepath.Join(p.dir, "nope")},
			opts: CheckOptions{PublicOnly: true}, errs: []error{pemcheck.ErrPrivateKey, ErrIgnoredKey, os.ErrNotExist}},
		{name: "expired at Now", paths: []string{p.path("apiserver.crt")}, opts: CheckOptions{Now: time.Now().Add(48 * time.Hour)},
			errs: []error{pemcheck.ErrExpired}},
		{name: "BOM hides the first key", paths: []string{bom}, errs: []error{pemcheck.ErrInvisible}},
		{name: "indented BEGIN hides a key", paths: []string{indented}, errs: []error{pemcheck.ErrInvisible}},
		{name: "own key required, by private key", paths: []string{p.path("sa.pub")},
			opts: CheckOptions{PublicOnly: true, RequireKeys: []string{p.path("sa.key")}}},
		{name: "own key required, by public key", paths: []string{p.path("sa.pub")},
			opts: CheckOptions{RequireKeys: []string{p.write(t, "self.pub", keytest.PublicPEM(t, &k.PublicKey), []byte{})}}, errs: []error{ErrRequiredKeyMissing}},
		{name: "own key missing, named as this host's", paths: []string{p.path("sa.pub")},
			opts: CheckOptions{RequireKeys: []string{p.write(t, "self.pub", keytest.PublicPEM(t, &k.PublicKey), []byte{})}, OwnKeys: []string{"/etc/kubernetes/pki/sa.key", p.dir + "/./self.pub"}},
			errs: []error{ErrRequiredKeyMissing}, msg: "this host's own key " + keytest.KeyID(t, &k.PublicKey) + " (--require-key " + p.path("self.pub") + ") is not in the bundle: publish it (`kube-apiserver-safe-restart publish-key`"},
		{name: "certificate allowed", paths: []string{p.path("apiserver.crt")}, opts: CheckOptions{PublicOnly: true}},
		{name: "certificate refused with KeysOnly", paths: []string{p.path("apiserver.crt")}, opts: CheckOptions{PublicOnly: true, KeysOnly: true},
			errs: []error{pemcheck.ErrKind}},
		{name: "public keys pass KeysOnly", paths: []string{p.path("sa.pub")}, opts: CheckOptions{PublicOnly: true, KeysOnly: true}},
		{name: "required key only behind a BOM", paths: []string{bom},
			opts: CheckOptions{RequireKeys: []string{p.path("sa.key")}}, errs: []error{pemcheck.ErrInvisible}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckFiles(ctx, tc.paths, tc.opts)
			if len(tc.errs) == 0 && err != nil {
				t.Fatal(err)
			}
			// A required private key's content never reaches the message.
			if key, _ := os.ReadFile(p.path("sa.key")); err != nil && strings.Contains(err.Error(), strings.Split(string(key), "\n")[1]) {
				t.Fatalf("private key material in %v", err)
			}
			for _, want := range tc.errs {
				if !errors.Is(err, want) {
					t.Errorf("error does not wrap %v: %v", want, err)
				}
			}
			if err != nil && !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error lacks %q: %v", tc.msg, err)
			}
		})
	}
}

// TestKeyPastedAsFlagValue: a key body where a file name belongs is
// reported by file, line and flag, and never quoted, in any encoding.
func TestKeyPastedAsFlagValue(t *testing.T) {
	p := newPKI(t)
	keyPEM, err := os.ReadFile(p.path("sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	for name, value := range map[string]string{
		"pem":         `"` + string(keyPEM) + `"`,
		"der-base64":  body,
		"pem-base64":  base64.StdEncoding.EncodeToString(keyPEM),
		"first-lines": body[:64],
	} {
		flags := "--service-account-key-file={sa.pub}\n--service-account-signing-key-file=" + value + "\n--tls-sni-cert-key={sni.crt}," + value + "\n"
		err := Run(context.Background(), Input{FlagsFiles: []string{p.flags(t, flags)}})
		if err == nil || !errors.Is(err, ErrKeyInValue) {
			t.Fatalf("%s: err = %v", name, err)
		}
		msg := err.Error()
		if strings.Contains(msg, body[20:40]) || strings.Contains(msg, "PRIVATE") {
			t.Errorf("%s: message quotes the key:\n%s", name, msg)
		}
		for _, want := range []string{"--service-account-signing-key-file (" + p.dir, "apiserver.env:2)", "--tls-sni-cert-key (", "apiserver.env:"} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: message lacks %q:\n%s", name, want, msg)
			}
		}
	}
}
