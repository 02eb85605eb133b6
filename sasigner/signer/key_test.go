package signer

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/keysync/confd/internal/keytest"
)

// verifyJWS checks a JWS the way a JOSE library does, written out here so
// that the test does not share code with what it tests: RS256 is PKCS#1
// v1.5 over SHA-256, ES256 is r||s, 32 bytes each (RFC 7518 3.3, 3.4).
func verifyJWS(t *testing.T, pub crypto.PublicKey, header, claims, sig string) {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		t.Fatalf("signature is not base64url: %v", err)
	}
	digest := sha256.Sum256([]byte(header + "." + claims))
	switch p := pub.(type) {
	case *rsa.PublicKey:
		if err := rsa.VerifyPKCS1v15(p, crypto.SHA256, digest[:], raw); err != nil {
			t.Fatalf("RS256 signature does not verify: %v", err)
		}
	case *ecdsa.PublicKey:
		if len(raw) != 64 {
			t.Fatalf("ES256 signature of %d bytes, want 64 (r||s, not ASN.1)", len(raw))
		}
		r, s := new(big.Int).SetBytes(raw[:32]), new(big.Int).SetBytes(raw[32:])
		if !ecdsa.Verify(p, digest[:], r, s) {
			t.Fatal("ES256 signature does not verify")
		}
	}
}

func TestSignVerifies(t *testing.T) {
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:default:x"}`))
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		alg  string
	}{
		{"rsa-2048", keytest.RSA(t, 2048), "RS256"},
		{"ecdsa-p256", keytest.EC(t), "ES256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := mustSigningKey(t, tc.key)
			header, sig, err := k.Sign(claims)
			if err != nil {
				t.Fatal(err)
			}
			verifyJWS(t, tc.key.Public(), header, claims, sig)

			// The header holds exactly alg, kid and typ: kube-apiserver
			// decodes it with DisallowUnknownFields.
			hj, err := base64.RawURLEncoding.DecodeString(header)
			if err != nil {
				t.Fatalf("header is not base64url: %v", err)
			}
			var h map[string]any
			if err := json.Unmarshal(hj, &h); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{"alg": tc.alg, "kid": keytest.KeyID(t, tc.key.Public()), "typ": "JWT"}
			if len(h) != len(want) {
				t.Errorf("header %s: want exactly %v", hj, want)
			}
			for f, v := range want {
				if h[f] != v {
					t.Errorf("header %s: %s = %v, want %v", hj, f, h[f], v)
				}
			}
			if k.KeyID != want["kid"] {
				t.Errorf("KeyID %s, want %s", k.KeyID, want["kid"])
			}
			der, _ := x509.MarshalPKIXPublicKey(tc.key.Public())
			if !bytes.Equal(k.PublicDER, der) {
				t.Error("PublicDER is not the PKIX DER of the public half")
			}
		})
	}
}

func TestSignRefusesBadClaims(t *testing.T) {
	k := mustSigningKey(t, keytest.EC(t))
	for _, claims := range []string{"", "not base64!", "eyJhIjoxfQ=="} {
		if _, _, err := k.Sign(claims); !errors.Is(err, ErrBadClaims) {
			t.Errorf("Sign(%q) = %v, want ErrBadClaims", claims, err)
		}
	}
}

func TestLoadSigningKey(t *testing.T) {
	rk := keytest.RSA(t, 2048)
	ek := keytest.EC(t)
	pkcs1 := string(keytest.PKCS1PEM(rk))
	sec1 := string(keytest.SEC1PEM(t, ek))
	pkcs8 := string(keytest.PKCS8PEM(t, ek))
	small := string(keytest.PKCS1PEM(keytest.RSA(t, 1024)))
	for _, tc := range []struct {
		name, data string
		alg        string
		wantErr    string
	}{
		{"pkcs1 rsa", pkcs1, "RS256", ""},
		{"sec1 ec", sec1, "ES256", ""},
		{"pkcs8 ec", pkcs8, "ES256", ""},
		{"public key only", string(keytest.PublicPEM(t, ek.Public())), "", "private key"},
		{"two keys", pkcs1 + sec1, "", "2 private keys"},
		{"rsa-1024", small, "", "1024 bits"},
		{"garbage", "hello\n", "", "sa.key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "sa.key", tc.data)
			k, err := LoadSigningKey(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "PRIVATE KEY-----") {
					t.Fatalf("error quotes the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if k.Alg != tc.alg {
				t.Errorf("alg %s, want %s", k.Alg, tc.alg)
			}
		})
	}
}

func TestSigningAlgorithmByCurve(t *testing.T) {
	for c, alg := range map[elliptic.Curve]string{elliptic.P384(): "ES384", elliptic.P521(): "ES512"} {
		if k := mustSigningKey(t, keytest.ECCurve(t, c)); k.Alg != alg {
			t.Errorf("%s: alg %s, want %s", c.Params().Name, k.Alg, alg)
		}
	}
}
