package signer

import (
	"bytes"
	"crypto"
	"os"
	"path/filepath"
	"sync"
	"testing"
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
