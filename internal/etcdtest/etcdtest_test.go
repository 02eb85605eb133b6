package etcdtest

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStartPlainAndTLS(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
	}{{"plain", nil}, {"tls", []Option{WithTLS()}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := Start(t, tc.opts...)
			rev := s.Put(t, "/a", "1")
			if rev < 2 {
				t.Fatalf("revision after first put = %d, want >= 2", rev)
			}
			resp, err := s.Client(t).Get(context.Background(), "/a")
			if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "1" {
				t.Fatalf("get /a = %v, %v", resp, err)
			}
		})
	}
}

func TestTLSRefusesUntrustedClient(t *testing.T) {
	s := Start(t, WithTLS())
	f := *s.TLS
	f.ClientCert, f.ClientKey = f.UntrustedClientCert, f.UntrustedClientKey
	tc, err := f.ClientTLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, TLS: tc, DialTimeout: time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := cli.Get(ctx, "/a"); err == nil {
		t.Fatal("server accepted a client certificate from an untrusted CA")
	}
}

// A killed etcd is named as such, with how it ended, instead of leaving
// the test to time out on requests.
func TestAliveReportsDeath(t *testing.T) {
	s := Start(t)
	if err := s.Alive(); err != nil {
		t.Fatalf("Alive on a running etcd: %v", err)
	}
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-done
	err := s.Alive()
	if err == nil || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("Alive after SIGKILL = %v, want an error naming the signal", err)
	}
}

// A restored snapshot brings the store and its revision back to the
// snapshot's, on the same endpoint.
func TestSnapshotRestore(t *testing.T) {
	s := Start(t, WithTLS())
	rev := s.Put(t, "/a", "before")
	snap := s.Snapshot(t)
	s.Put(t, "/a", "after")
	s.Put(t, "/b", "after")
	s.RestoreSnapshot(t, snap)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := s.Client(t).Get(ctx, "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "before" || resp.Header.Revision != rev {
		t.Fatalf("after restore: %v at revision %d, want /a=before at revision %d", resp.Kvs, resp.Header.Revision, rev)
	}
}
