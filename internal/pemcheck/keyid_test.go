package pemcheck

import (
	"crypto"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

// k8sVectorKey and k8sVectorKID are the published test vector of
// TestKeyIDStability in k8s.io/kubernetes pkg/serviceaccount/keyid_test.go:
// kube-apiserver must keep deriving this ID from this key, so we must too.
const k8sVectorKey = `-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA249XwEo9k4tM8fMxV7zx
OhcrP+WvXn917koM5Qr2ZXs4vo26e4ytdlrV0bQ9SlcLpQVSYjIxNfhTZdDt+ecI
zshKuv1gKIxbbLQMOuK1eA/4HALyEkFgmS/tleLJrhc65tKPMGD+pKQ/xhmzRuCG
51RoiMgbQxaCyYxGfNLpLAZK9L0Tctv9a0mJmGIYnIOQM4kC1A1I1n3EsXMWmeJU
j7OTh/AjjCnMnkgvKT2tpKxYQ59PgDgU8Ssc7RDSmSkLxnrv+OrN80j6xrw0OjEi
B4Ycr0PqfzZcvy8efTtFQ/Jnc4Bp1zUtFXt7+QeevePtQ2EcyELXE0i63T1CujRM
WwIDAQAB
-----END PUBLIC KEY-----
`

const k8sVectorKID = "JHJehTTTZlsspKHT-GaJxK7Kd1NQgZJu3fyK6K_QDYU"

func TestKeyIDKubernetesVector(t *testing.T) {
	f, err := Parse("vector", []byte(k8sVectorKey))
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.KeyIDs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{k8sVectorKID}) {
		t.Fatalf("KeyIDs = %q, want %q", got, k8sVectorKID)
	}
}

func TestKeyIDIndependent(t *testing.T) {
	rk, ek := keytest.RSA(t, 1024), keytest.EC(t)
	for _, pub := range []crypto.PublicKey{&rk.PublicKey, &ek.PublicKey} {
		want := keytest.KeyID(t, pub)
		got, err := KeyID(pub)
		if err != nil || got != want {
			t.Errorf("KeyID(%T) = %q, %v; want %q", pub, got, err, want)
		}
	}
	if _, err := KeyID(rk); !errors.Is(err, ErrUnsupported) {
		t.Errorf("KeyID(private key) err = %v, want ErrUnsupported", err)
	}
}

// The same key as a certificate, a public key and a private key has one ID.
func TestPublicKeysEveryBlock(t *testing.T) {
	rk, ek := keytest.RSA(t, 1024), keytest.EC(t)
	now := time.Now()
	data := cat(keytest.CertPEM(t, ek, "c", now.Add(-time.Hour), now.Add(time.Hour)),
		keytest.PublicPEM(t, &ek.PublicKey),
		keytest.Encode("EC PARAMETERS", []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}),
		keytest.PKCS8PEM(t, ek),
		keytest.PKCS1PEM(rk))
	f, err := Parse("mixed", data)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := f.KeyIDs()
	if err != nil {
		t.Fatal(err)
	}
	ecID, _ := KeyID(&ek.PublicKey)
	rsaID, _ := KeyID(&rk.PublicKey)
	if want := []string{ecID, ecID, ecID, rsaID}; !slices.Equal(ids, want) {
		t.Errorf("KeyIDs = %q, want %q", ids, want)
	}
}
