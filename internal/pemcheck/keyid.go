package pemcheck

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
)

// KeyID returns the key ID Kubernetes gives a service-account public key in
// token headers and in /openid/v1/jwks: the unpadded base64url SHA-256 of the
// key's PKIX DER (keyIDFromPublicKey in k8s.io/kubernetes
// pkg/serviceaccount/jwt.go). It is a one-way hash, safe to log.
// pub must be a public key; a private key is refused rather than silently
// converted so a mix-up shows.
func KeyID(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("%w: key ID of %T: %w", ErrUnsupported, pub, err)
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// KeyIDs returns the KeyID of every block that has a public key, in order:
// a certificate's subject key, a public key, a private key's public half.
// Duplicates are kept, so the result lines up with the blocks.
func (f *File) KeyIDs() ([]string, error) {
	var out []string
	for _, b := range f.Blocks {
		if b.Public == nil {
			continue
		}
		id, err := KeyID(b.Public)
		if err != nil {
			return nil, BlockError(f.Name, &b, err)
		}
		out = append(out, id)
	}
	return out, nil
}
