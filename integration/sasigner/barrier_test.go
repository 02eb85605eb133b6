package sasigner

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	externaljwtv1 "k8s.io/externaljwt/apis/v1"

	"github.com/keysync/confd/internal/etcdtest"
)

const trustPrefix = "/kubernetes/service-account-keys-trust/"

func signKid(t *testing.T, s *signer) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.client(t).Sign(ctx, &externaljwtv1.SignJWTRequest{Claims: "e30"})
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(r.Header)
	var h map[string]string
	_ = json.Unmarshal(raw, &h)
	return h["kid"]
}

// TestBarrierHoldsTheNewKey, without an apiserver (this test's FetchKeys
// calls play its part): after SIGHUP with a new key, the previous key
// signs while another host's record lacks the new key; once it lists it,
// the new key signs. With a short --trust-timeout and a host that never
// fetches, the previous key keeps signing and the host is named.
func TestBarrierHoldsTheNewKey(t *testing.T) {
	e := etcdtest.Start(t)
	dir := shortDir(t)
	old, next := newSAKey(t, "ecdsa"), newSAKey(t, "ecdsa")
	keyFile := filepath.Join(dir, "sa.key")
	old.write(t, keyFile)
	e.Put(t, keysPrefix+"m1", old.pub)
	record := func(host string, kids ...string) {
		b, _ := json.Marshal(map[string]any{"host": host, "trusted": kids, "time": time.Now()})
		e.Put(t, trustPrefix+host, string(b))
	}
	record("m2", old.kid)

	s := startSigner(t, signerArgs(dir, e.Endpoint, keyFile, "--host=m1", "--trust-timeout=60s")...)
	s.out.waitFor(t, "every recorded host's apiserver fetched this host's key: signing", 20*time.Second)
	if kid := signKid(t, s); kid != old.kid {
		t.Fatalf("signing with %s, want %s", kid, old.kid)
	}

	e.Put(t, keysPrefix+"m1", old.pub+next.pub)
	next.write(t, keyFile)
	_ = s.cmd.Process.Signal(syscall.SIGHUP)
	s.out.waitFor(t, "new signing key served", 10*time.Second)
	s.fetch(t) // this host's apiserver fetches: m1's record lists the new key
	s.out.waitFor(t, `"hosts":"m2"`, 10*time.Second)
	if kid := signKid(t, s); kid != old.kid && !strings.Contains(s.out.String(), "fetched the new key: signing with it") {
		t.Fatalf("signing with %s before m2 fetched the new key, want the previous %s", kid, old.kid)
	}
	record("m2", old.kid, next.kid)
	s.out.waitFor(t, "every recorded host's apiserver fetched the new key: signing with it", 20*time.Second)
	if kid := signKid(t, s); kid != next.kid {
		t.Fatalf("signing with %s after every host fetched, want %s", kid, next.kid)
	}

	// A host that never fetches: the timeout keeps the previous key.
	third := newSAKey(t, "ecdsa")
	s.stop(syscall.SIGTERM)
	s2 := startSigner(t, signerArgs(dir, e.Endpoint, keyFile, "--host=m1", "--trust-timeout=2s")...)
	if kid := signKid(t, s2); kid != next.kid {
		t.Fatalf("restarted signer signs with %s, want %s (it signed before the restart)", kid, next.kid)
	}
	third.write(t, keyFile)
	_ = s2.cmd.Process.Signal(syscall.SIGHUP)
	s2.out.waitFor(t, "trust barrier timed out: still signing with the previous key", 20*time.Second)
	if !strings.Contains(s2.out.String(), "m2") {
		t.Error("the timeout does not name m2")
	}
	if kid := signKid(t, s2); kid != next.kid {
		t.Fatalf("after the timeout signing with %s, want the previous %s", kid, next.kid)
	}
}
