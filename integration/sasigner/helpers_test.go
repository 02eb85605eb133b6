// Package sasigner runs the built kube-apiserver-sa-signer against a real
// etcd and, when it is built, a real kube-apiserver.
package sasigner

import (
	"bytes"
	"context"
	"crypto"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/testbin"
)

var signerBin, safeRestartBin string

func TestMain(m *testing.M) {
	bins, cleanup, err := testbin.Build(nil, map[string]string{"kube-apiserver-sa-signer": "./cmd/kube-apiserver-sa-signer", "kube-apiserver-safe-restart": "./cmd/kube-apiserver-safe-restart"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	signerBin = bins["kube-apiserver-sa-signer"]
	safeRestartBin = bins["kube-apiserver-safe-restart"]
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// shortDir is a temporary directory with a path short enough for a Unix
// socket (108 bytes), removed when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "sas")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// saKey is a service-account key pair on disk.
type saKey struct {
	priv crypto.Signer
	kid  string
	pub  string // PKIX PEM
}

func newSAKey(t testing.TB, alg string) saKey {
	t.Helper()
	var k crypto.Signer
	if alg == "rsa" {
		k = keytest.RSA(t, 2048)
	} else {
		k = keytest.EC(t)
	}
	return saKey{priv: k, kid: keytest.KeyID(t, k.Public()), pub: string(keytest.PublicPEM(t, k.Public()))}
}

// writeKey replaces path with k's private key, as rotate-key installs one
// (a rename, so the signer never reads half a file).
func (k saKey) write(t testing.TB, path string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, keytest.PKCS8PEM(t, k.priv), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects a process's output and lets a test wait for a line.
type logBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	cond chan struct{}
}

func newLogBuffer() *logBuffer { return &logBuffer{cond: make(chan struct{})} }

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	close(b.cond)
	b.cond = make(chan struct{})
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the output contains s (counting from offset from).
func (b *logBuffer) waitFor(t testing.TB, s string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		b.mu.Lock()
		ok := strings.Contains(b.buf.String(), s)
		c := b.cond
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("%q not logged within %s; output:\n%s", s, within, b.String())
		}
	}
}

// signer is one running kube-apiserver-sa-signer.
type signer struct {
	cmd    *exec.Cmd
	out    *logBuffer
	done   chan struct{}
	socket string
	args   []string
}

func startSigner(t testing.TB, args ...string) *signer {
	t.Helper()
	s := &signer{out: newLogBuffer(), done: make(chan struct{}), args: args}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--socket="); ok {
			s.socket = v
		}
	}
	s.cmd = exec.Command(signerBin, append([]string{"--log-format=json"}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() { s.stop(syscall.SIGKILL) })
	s.out.waitFor(t, "serving ExternalJWTSigner", 20*time.Second)
	return s
}

func (s *signer) stop(sig syscall.Signal) {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	<-s.done
}

func (s *signer) client(t testing.TB) externaljwtv1.ExternalJWTSignerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+s.socket, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return externaljwtv1.NewExternalJWTSignerClient(conn)
}

func (s *signer) fetch(t testing.TB) *externaljwtv1.FetchKeysResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.client(t).FetchKeys(ctx, &externaljwtv1.FetchKeysRequest{})
	if err != nil {
		t.Fatalf("FetchKeys: %v\n%s", err, s.out.String())
	}
	return r
}

func kids(r *externaljwtv1.FetchKeysResponse) []string {
	var out []string
	for _, k := range r.Keys {
		out = append(out, k.KeyId)
	}
	return out
}

func signerArgs(dir, endpoint, keyFile string, extra ...string) []string {
	return append([]string{
		"--socket=" + filepath.Join(dir, "run", "signer.sock"),
		"--signing-key=" + keyFile,
		"--endpoints=" + endpoint,
		"--cache-file=" + filepath.Join(dir, "keys.json"),
		"--dial-timeout=1s",
		"--config=", // never the host's /etc/kubernetes/safe-restart.toml
	}, extra...)
}

// runSigner runs the signer to completion (it must exit on its own).
func runSigner(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, signerBin, args...).CombinedOutput()
	return string(out), err
}
