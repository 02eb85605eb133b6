package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdServer is the harness's own single-member etcd on loopback.
type etcdServer struct {
	endpoint string
	cmd      *exec.Cmd
	done     chan struct{}
	cli      *clientv3.Client
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEtcd(ctx context.Context, bin, dataDir string) (*etcdServer, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		cp, err := freePort()
		if err != nil {
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &etcdServer{endpoint: fmt.Sprintf("http://127.0.0.1:%d", cp), done: make(chan struct{})}
		peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
		_ = os.RemoveAll(dataDir)
		if err := os.MkdirAll(filepath.Dir(dataDir), 0o755); err != nil {
			return nil, err
		}
		s.cmd = exec.Command(bin,
			"--name", "bench", "--data-dir", dataDir,
			"--listen-client-urls", s.endpoint, "--advertise-client-urls", s.endpoint,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "bench="+peer, "--log-level", "error",
			// Room for 100k-key sets loaded several times over.
			"--quota-backend-bytes", strconv.Itoa(4<<30))
		logf, err := os.Create(filepath.Join(filepath.Dir(dataDir), "etcd.log"))
		if err != nil {
			return nil, err
		}
		s.cmd.Stdout, s.cmd.Stderr = logf, logf
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("start %s: %w", bin, err)
		}
		go func() { _ = s.cmd.Wait(); logf.Close(); close(s.done) }()
		if lastErr = s.waitReady(ctx); lastErr == nil {
			return s, nil
		}
		s.stop()
	}
	return nil, fmt.Errorf("etcd did not start: %w", lastErr)
}

func (s *etcdServer) waitReady(ctx context.Context) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = cli.Get(rctx, "bench-probe")
		cancel()
		if err == nil {
			s.cli = cli
			return nil
		}
		select {
		case <-s.done:
			cli.Close()
			return fmt.Errorf("etcd exited during start-up")
		case <-ctx.Done():
			cli.Close()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cli.Close()
			return fmt.Errorf("etcd not ready: %w", err)
		}
	}
}

func (s *etcdServer) stop() {
	if s.cli != nil {
		s.cli.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// watchStats is etcd's own count of open watch streams and watchers, and of
// watch streams ever opened: how many watches a daemon holds, and whether it
// opened them again, seen from the server.
type watchStats struct{ streams, watchers, opened int }

// watchers reads watchStats from etcd's metrics.
func (s *etcdServer) watchers(ctx context.Context) (watchStats, error) {
	var st watchStats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.endpoint+"/metrics", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		f, _ := strconv.ParseFloat(v, 64)
		switch name {
		case "etcd_debugging_mvcc_watch_stream_total":
			st.streams = int(f)
		case "etcd_debugging_mvcc_watcher_total":
			st.watchers = int(f)
		case `grpc_server_started_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"}`:
			st.opened = int(f)
		}
	}
	return st, sc.Err()
}
