package etcdtest

import (
	"context"
	"net"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestProxyForwardsThenCuts(t *testing.T) {
	s := Start(t)
	p := NewProxy(t, s.Endpoint)
	cfg := s.ClientConfig()
	cfg.Endpoints = []string{p.Endpoint()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/via-proxy", "1"); err != nil {
		t.Fatalf("put through proxy: %v", err)
	}
	p.Cut()
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatal("proxy accepted a connection after Cut")
	}
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := cli.Get(short, "/via-proxy"); err == nil {
		t.Fatal("request through a cut proxy succeeded")
	}
}
