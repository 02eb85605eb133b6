package signer

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	externaljwtv1 "k8s.io/externaljwt/apis/v1"
)

// serveSocket serves ks on a Unix socket in a temporary directory and
// returns a client dialled as kube-apiserver dials (plugin.New).
func serveSocket(t testing.TB, ks *KeySet, fetched func(*Snapshot)) (externaljwtv1.ExternalJWTSignerClient, string) {
	t.Helper()
	// Unix socket paths are limited to ~108 bytes; t.TempDir can be long.
	dir, err := os.MkdirTemp("", "sasigner")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "run", "signer.sock")
	l, err := Listen(context.Background(), path, -1)
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(testWriter{t})
	g := NewGRPCServer(&Service{Keys: ks, RefreshHint: 10 * time.Second, MaxTokenExpiration: 8760 * time.Hour, Log: log, Metrics: NewMetrics(), Fetched: fetched})
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return externaljwtv1.NewExternalJWTSignerClient(conn), path
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestServiceOverSocket(t *testing.T) {
	ctx := context.Background()
	ek := keytest.EC(t)
	sk := mustSigningKey(t, ek)
	ks := NewKeySet(nil, sk)
	h1 := keyOf(t, &keytest.RSA(t, 2048).PublicKey)
	ks.SetHost("h1", []Key{h1})
	var fetched []*Snapshot
	cli, path := serveSocket(t, ks, func(s *Snapshot) { fetched = append(fetched, s) })

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want 0660", fi.Mode().Perm())
	}

	claims := "eyJpc3MiOiJodHRwczovL2t1YmVybmV0ZXMuZGVmYXVsdC5zdmMifQ"
	sr, err := cli.Sign(ctx, &externaljwtv1.SignJWTRequest{Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	verifyJWS(t, &ek.PublicKey, sr.Header, claims, sr.Signature)

	if _, err := cli.Sign(ctx, &externaljwtv1.SignJWTRequest{Claims: ""}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("Sign with no claims: %v, want InvalidArgument", err)
	}

	fr, err := cli.FetchKeys(ctx, &externaljwtv1.FetchKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// kube-apiserver's keycache refuses the answer without a valid
	// timestamp, a positive refresh hint, or a key that is not PKIX.
	if err := fr.DataTimestamp.CheckValid(); err != nil {
		t.Fatalf("data_timestamp: %v", err)
	}
	if !fr.DataTimestamp.AsTime().Equal(ks.Snapshot().Time) {
		t.Errorf("data_timestamp %s, want %s", fr.DataTimestamp.AsTime(), ks.Snapshot().Time)
	}
	if fr.RefreshHintSeconds != 10 {
		t.Errorf("refresh_hint_seconds %d, want 10", fr.RefreshHintSeconds)
	}
	want := map[string]bool{sk.KeyID: true, h1.ID: true}
	for _, k := range fr.Keys {
		pub, err := x509.ParsePKIXPublicKey(k.Key)
		if err != nil {
			t.Fatalf("key %s: %v", k.KeyId, err)
		}
		if keytest.KeyID(t, pub) != k.KeyId {
			t.Errorf("key %s: its key ID is %s", k.KeyId, keytest.KeyID(t, pub))
		}
		if k.ExcludeFromOidcDiscovery {
			t.Errorf("key %s excluded from OIDC discovery", k.KeyId)
		}
		if !want[k.KeyId] {
			t.Errorf("unexpected key %s", k.KeyId)
		}
		delete(want, k.KeyId)
	}
	if len(want) > 0 {
		t.Errorf("keys missing: %v", want)
	}
	if len(fetched) != 1 || fetched[0] != ks.Snapshot() {
		t.Errorf("Fetched hook saw %d snapshots, want the one served", len(fetched))
	}

	mr, err := cli.Metadata(ctx, &externaljwtv1.MetadataRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if mr.MaxTokenExpirationSeconds != 8760*3600 {
		t.Errorf("max_token_expiration_seconds %d, want %d", mr.MaxTokenExpirationSeconds, 8760*3600)
	}
}

func TestListenSocketStates(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sasigner")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// A stale socket (its server gone, as after SIGKILL) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	l2, err := Listen(ctx, stale, -1)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	// A live one is not taken over.
	if _, err := Listen(ctx, stale, -1); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("live socket: err = %v, want 'another process'", err)
	}
	_ = l2.Close()

	// Something that is not a socket is never removed.
	file := filepath.Join(dir, "file.sock")
	_ = os.WriteFile(file, []byte("x"), 0o600)
	if _, err := Listen(ctx, file, -1); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("regular file: err = %v, want 'not a socket'", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
}
