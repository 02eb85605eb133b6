package saferestart

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/saferestart/internal/cmdkit"
	"github.com/keysync/confd/sasigner/signer"
)

// check on a signer host: the apiserver's flags name the signer's socket,
// and --signing-key is the key the signer must serve. The project's own
// signer answers on a temporary socket.
func TestCheckSigningEndpoint(t *testing.T) {
	keyFile := func(dir, name string) (*ecdsa.PrivateKey, string) {
		k := keytest.EC(t)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, keytest.SEC1PEM(t, k), 0o600); err != nil {
			t.Fatal(err)
		}
		return k, p
	}
	dir := t.TempDir()
	self, selfFile := keyFile(dir, "sa.key")
	_, otherFile := keyFile(dir, "other.key")

	sk, err := signer.NewSigningKey(self)
	if err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "sigcheck") // socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "run", "signer.sock")
	l, err := signer.Listen(context.Background(), sock, -1)
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	g := signer.NewGRPCServer(&signer.Service{Keys: signer.NewKeySet(nil, sk), RefreshHint: 10 * time.Second, MaxTokenExpiration: time.Hour, Log: log, Metrics: signer.NewMetrics()})
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)

	flags := filepath.Join(dir, "kube-apiserver.env")
	if err := os.WriteFile(flags, []byte(`KUBE_API_ARGS="--service-account-issuer=https://kubernetes.default.svc --service-account-signing-endpoint=`+sock+`"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	both := filepath.Join(dir, "both.env")
	if err := os.WriteFile(both, []byte("--service-account-signing-endpoint="+sock+"\n--service-account-signing-key-file="+selfFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"signer serves the key", []string{"--preflight-flags-file", flags, "--signing-key", selfFile}, cmdkit.ExitOK, ""},
		{"signer lacks the key", []string{"--preflight-flags-file", flags, "--signing-key", otherFile}, cmdkit.ExitPreflight,
			"--service-account-signing-endpoint (" + flags + ":1): the external signer does not serve the signing key"},
		{"endpoint with key file", []string{"--preflight-flags-file", both, "--signing-key", selfFile}, cmdkit.ExitPreflight,
			"--service-account-signing-endpoint (" + both + ":1) with --service-account-signing-key-file (" + both + ":2): kube-apiserver refuses"},
		// Last: it stops the signer.
		{"no signer", []string{"--preflight-flags-file", flags, "--signing-key", selfFile}, cmdkit.ExitPreflight, "does not answer FetchKeys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no signer" {
				g.Stop()
			}
			var out, errb bytes.Buffer
			code := run(context.Background(), nil, append([]string{"check"}, tc.args...), &out, &errb)
			if code != tc.code || (tc.want == "") != (errb.Len() == 0) || !strings.Contains(errb.String(), tc.want) {
				t.Fatalf("exit %d (want %d), stderr %q (want %q)", code, tc.code, errb.String(), tc.want)
			}
		})
	}
}
