// Package signer is kube-apiserver's external service-account token signer
// (KEP-740, gRPC service ExternalJWTSigner of k8s.io/externaljwt/apis/v1)
// for a fleet whose masters each keep their own key: it signs with this
// master's key and serves, as verification keys, every key the masters
// publish in etcd, so a key change reaches every apiserver without a restart.
package signer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	_ "crypto/sha256" // crypto.SHA256.New
	_ "crypto/sha512" // crypto.SHA384.New, crypto.SHA512.New
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/keysync/confd/internal/pemcheck"
)

// SigningKey is a private key with what a JWS made with it needs: its
// algorithm, its Kubernetes key ID and the encoded header.
type SigningKey struct {
	// KeyID is Kubernetes' key ID of the public half (pemcheck.KeyID): the
	// kid kube-apiserver's own signer would give it, so tokens signed here
	// and by a bundle-mode master with the same key carry the same kid.
	KeyID string
	// Alg is the JWS algorithm: RS256 for RSA, ES256/ES384/ES512 by curve.
	Alg string
	// PublicDER is the PKIX DER of the public half, as FetchKeys serves it.
	PublicDER []byte

	signer crypto.Signer
	hash   crypto.Hash
	// ecSize is the byte length of r and s in an ECDSA JWS signature
	// (RFC 7518 3.4: fixed-width big-endian, not ASN.1); 0 for RSA.
	ecSize int
	// header is base64url(JSON header): the same for every token.
	header string
}

// ErrBadClaims is returned by Sign for claims that are not base64url.
var ErrBadClaims = errors.New("claims are not unpadded base64url")

// LoadSigningKey reads a PEM file holding exactly one RSA or ECDSA private
// key (the same file --service-account-signing-key-file names in bundle
// mode). Errors name the file and block, never the key.
func LoadSigningKey(path string) (*SigningKey, error) {
	f, err := pemcheck.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if err := f.Check(pemcheck.Options{Allow: pemcheck.PrivateKey, Require: pemcheck.PrivateKey}); err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	keys := slices.DeleteFunc(slices.Clone(f.Blocks), func(b pemcheck.Block) bool { return b.Kind != pemcheck.PrivateKey })
	if len(keys) != 1 {
		return nil, fmt.Errorf("signing key %s: %d private keys, want exactly one", path, len(keys))
	}
	k, err := NewSigningKey(keys[0].Private)
	if err != nil {
		return nil, fmt.Errorf("signing key %s %s: %w", path, keys[0], err)
	}
	return k, nil
}

// NewSigningKey prepares key (*rsa.PrivateKey or *ecdsa.PrivateKey) for
// signing, choosing the algorithm kube-apiserver's own signer would
// (pkg/serviceaccount/jwt.go: RS256 for RSA, ES256/384/512 by curve).
func NewSigningKey(key crypto.PrivateKey) (*SigningKey, error) {
	k := &SigningKey{}
	switch p := key.(type) {
	case *rsa.PrivateKey:
		// kube-apiserver refuses shorter RSA keys nowhere, but a 1024-bit key
		// would sign tokens anyone could forge: refuse what Go refuses too.
		if p.N.BitLen() < pemcheck.MinRSABits {
			return nil, fmt.Errorf("RSA key of %d bits: want at least 2048", p.N.BitLen())
		}
		k.signer, k.Alg, k.hash = p, "RS256", crypto.SHA256
	case *ecdsa.PrivateKey:
		k.signer = p
		switch p.Curve {
		case elliptic.P256():
			k.Alg, k.hash, k.ecSize = "ES256", crypto.SHA256, 32
		case elliptic.P384():
			k.Alg, k.hash, k.ecSize = "ES384", crypto.SHA384, 48
		case elliptic.P521():
			k.Alg, k.hash, k.ecSize = "ES512", crypto.SHA512, 66
		default:
			return nil, fmt.Errorf("ECDSA curve %s: want P-256, P-384 or P-521", p.Curve.Params().Name)
		}
	default:
		return nil, fmt.Errorf("%T: want an RSA or ECDSA private key", key)
	}
	pk := newKey(k.signer.Public())
	k.KeyID, k.PublicDER = pk.ID, pk.DER
	// Only alg, kid and typ: kube-apiserver refuses any other header field
	// (plugin.validateJWTHeader decodes with DisallowUnknownFields). Three
	// strings: the encoding cannot fail.
	h, _ := json.Marshal(struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
		Typ string `json:"typ"`
	}{k.Alg, k.KeyID, "JWT"})
	k.header = base64.RawURLEncoding.EncodeToString(h)
	return k, nil
}

// Sign returns the JWS header and signature, both base64url, for claims
// as the apiserver sends them (the base64url second segment of the JWT):
// the signature covers header "." claims.
func (k *SigningKey) Sign(claims string) (header, signature string, err error) {
	if claims == "" {
		return "", "", fmt.Errorf("%w: empty", ErrBadClaims)
	}
	if _, err := base64.RawURLEncoding.DecodeString(claims); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrBadClaims, err)
	}
	h := k.hash.New()
	h.Write([]byte(k.header + "." + claims))
	digest := h.Sum(nil)
	if k.ecSize == 0 {
		sig, err := k.signer.Sign(rand.Reader, digest, k.hash)
		if err != nil {
			return "", "", fmt.Errorf("RS256 signature: %w", err)
		}
		return k.header, base64.RawURLEncoding.EncodeToString(sig), nil
	}
	r, s, err := ecdsa.Sign(rand.Reader, k.signer.(*ecdsa.PrivateKey), digest)
	if err != nil {
		return "", "", fmt.Errorf("%s signature: %w", k.Alg, err)
	}
	sig := make([]byte, 2*k.ecSize)
	r.FillBytes(sig[:k.ecSize])
	s.FillBytes(sig[k.ecSize:])
	return k.header, base64.RawURLEncoding.EncodeToString(sig), nil
}
