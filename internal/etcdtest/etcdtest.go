// Package etcdtest starts real etcd servers on loopback for tests: plain or
// TLS with client-certificate authentication, each with its own free ports
// and temporary data directory, stopped when the test ends.
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/keysync/confd/internal/toolbin"
)

// Server is one running etcd member.
type Server struct {
	// Endpoint is the client URL, http://127.0.0.1:PORT or https://...
	Endpoint string
	// TLS holds the certificate files when the server was started WithTLS.
	TLS *TLSFiles

	t       testing.TB
	dataDir string
	peerURL string
	useTLS  bool
	binDir  string   // etcd and etcdctl to run; empty: toolbin.Etcd's choice
	etcd    string   // the etcd binary
	extra   []string // more etcd flags

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	stderr *bytes.Buffer
}

// Option changes how Start runs etcd.
type Option func(*Server)

// WithTLS serves clients over TLS and requires a client certificate signed
// by the test CA (etcd's --client-cert-auth).
func WithTLS() Option { return func(s *Server) { s.useTLS = true } }

// Tool is the path of the etcd tool ("etcd" or "etcdctl") this server runs
// with: WithVersion's, else the default one (toolbin.Etcd).
func (s *Server) Tool(t testing.TB, name string) string {
	t.Helper()
	if s.binDir != "" {
		return filepath.Join(s.binDir, name)
	}
	return toolbin.Etcd(t, name)
}

// RepoRoot is the module root, so that tests find the examples and the
// binaries make builds from any package.
func RepoRoot() string { return toolbin.RepoRoot() }

// Start runs a fresh single-member etcd and registers its shutdown with
// t.Cleanup. Without an etcd binary the test skips (fails under CI), as
// toolbin.Missing says.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{t: t, dataDir: t.TempDir()}
	for _, o := range opts {
		o(s)
	}
	s.etcd = s.Tool(t, "etcd")
	if s.useTLS {
		s.TLS = WriteTLSFiles(t, t.TempDir())
	}
	var lastErr error
	// A port picked free can be taken before etcd binds it; a fresh pair fixes that.
	for attempt := 0; attempt < 3; attempt++ {
		ports := freePorts(t, 2)
		scheme := "http"
		if s.useTLS {
			scheme = "https"
		}
		s.Endpoint = fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[0])
		s.peerURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
		if lastErr = s.start(); lastErr == nil {
			break
		}
		_ = os.RemoveAll(s.dataDir)
		_ = os.MkdirAll(s.dataDir, 0o700)
	}
	if lastErr != nil {
		t.Fatalf("etcd did not start: %v", lastErr)
	}
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) args() []string {
	a := []string{
		"--name", "t",
		"--data-dir", s.dataDir,
		"--listen-client-urls", s.Endpoint,
		"--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", s.peerURL,
		"--initial-advertise-peer-urls", s.peerURL,
		"--initial-cluster", "t=" + s.peerURL,
		"--heartbeat-interval=10", "--election-timeout=100",
		"--log-level", "error",
	}
	a = append(a, s.extra...)
	if s.useTLS {
		a = append(a,
			"--cert-file", s.TLS.ServerCert,
			"--key-file", s.TLS.ServerKey,
			"--trusted-ca-file", s.TLS.CA,
			"--client-cert-auth",
		)
	}
	return a
}

func (s *Server) start() error {
	cmd := exec.Command(s.etcd, s.args()...)
	stderr := &bytes.Buffer{}
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done, s.stderr = cmd, done, stderr
	s.mu.Unlock()
	if err := s.waitReady(done, 15*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%w; etcd output:\n%s", err, stderr.String())
	}
	return nil
}

// waitReady polls with a short request: etcd has no readiness signal a
// parent can block on besides answering.
func (s *Server) waitReady(done <-chan struct{}, within time.Duration) error {
	// Wait for the port first: a gRPC client whose first dial is refused
	// backs off for a full second before it tries again.
	host := strings.TrimPrefix(strings.TrimPrefix(s.Endpoint, "https://"), "http://")
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", host, 100*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			return errors.New("etcd exited during start-up")
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not listening on %s within %s: %w", host, within, err)
		}
	}
	cli, err := clientv3.New(s.ClientConfig())
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, err = cli.Get(ctx, "health-probe")
		cancel()
		// With authentication on, a refusal is an answer too.
		if err == nil || errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrInvalidAuthToken) {
			return nil
		}
		select {
		case <-done:
			return errors.New("etcd exited during start-up")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not ready within %s: %w", within, err)
		}
	}
}

// ClientConfig is a client configuration that the server accepts (with the
// client certificate when TLS is on).
func (s *Server) ClientConfig() clientv3.Config {
	cfg := clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: quietLogger()}
	if s.TLS != nil {
		tc, err := s.TLS.ClientTLSConfig()
		if err != nil {
			s.t.Fatalf("client TLS config: %v", err)
		}
		cfg.TLS = tc
	}
	return cfg
}

// Client returns a connected client closed at the end of the test.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(s.ClientConfig())
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Put writes key=value and fails the test on error.
func (s *Server) Put(t testing.TB, key, value string) int64 {
	t.Helper()
	cli := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, value)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

// Stop terminates etcd and waits for it; safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGCONT) // a paused server cannot act on SIGTERM
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Kill ends etcd with SIGKILL, as a crash or `kill -9` does, and waits
// for it; Restart or RestoreBackup starts it again.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart stops etcd and starts it again on the same ports and data.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.start(); err != nil {
		t.Fatalf("etcd restart: %v", err)
	}
}

// Pause freezes the server (SIGSTOP): connections stay open but nothing is
// answered, as with a partitioned or overloaded member.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Alive is nil while etcd runs (or is paused), and otherwise says how it
// ended and what it printed: a test waiting on a dead etcd would only see
// timeouts.
func (s *Server) Alive() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return errors.New("etcd was never started")
	}
	select {
	case <-done:
		return fmt.Errorf("etcd %s exited (%s); its output:\n%s", s.Endpoint, cmd.ProcessState, s.Output())
	default:
		return nil
	}
}

// Output is what etcd has printed so far, for failure messages.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stderr == nil {
		return ""
	}
	return s.stderr.String()
}

// EtcdctlEnv is the environment that points etcdctl at this server.
func (s *Server) EtcdctlEnv() []string {
	env := []string{"ETCDCTL_ENDPOINTS=" + s.Endpoint}
	if s.TLS != nil {
		env = append(env, "ETCDCTL_CACERT="+s.TLS.CA, "ETCDCTL_CERT="+s.TLS.ClientCert, "ETCDCTL_KEY="+s.TLS.ClientKey)
	}
	return env
}

// UnusedEndpoint is a loopback URL where nothing listens, for unreachable-etcd tests.
func UnusedEndpoint(t testing.TB) string {
	return fmt.Sprintf("http://127.0.0.1:%d", FreePort(t))
}

// quietLogger keeps the client's retry chatter out of test output.
func quietLogger() *zap.Logger { return zap.NewNop() }
