package signer

import (
	"bytes"
	"context"
	"crypto"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdclient"
)

func mustSigningKey(t testing.TB, k crypto.PrivateKey) *SigningKey {
	t.Helper()
	s, err := NewSigningKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func writeFile(t testing.TB, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// syncBuffer is a bytes.Buffer safe for a logger writing from another
// goroutine while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// metricValue reads a counter or gauge from m's registry: the series whose
// label is label=value, or the unlabelled one when label is "" (0 if
// absent).
func metricValue(t testing.TB, m *Metrics, name, label, value string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			match := label == "" && len(mt.GetLabel()) == 0
			for _, l := range mt.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if !match {
				continue
			}
			if g := mt.GetGauge(); g != nil {
				return g.GetValue()
			}
			return mt.GetCounter().GetValue()
		}
	}
	return 0
}

// connectOnce is a Follower's Connect: one client to endpoint, made at the
// first call that succeeds and closed when the test ends, as the command
// shares one.
func connectOnce(t testing.TB, endpoint string) func(context.Context) (*clientv3.Client, error) {
	var (
		mu  sync.Mutex
		cli *clientv3.Client
	)
	t.Cleanup(func() {
		if cli != nil {
			_ = cli.Close()
		}
	})
	return func(ctx context.Context) (*clientv3.Client, error) {
		mu.Lock()
		defer mu.Unlock()
		var err error
		if cli == nil {
			cli, err = etcdclient.New(ctx, etcdclient.Config{Nodes: []string{endpoint}, DialTimeout: time.Second})
		}
		return cli, err
	}
}
