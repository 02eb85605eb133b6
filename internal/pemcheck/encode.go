package pemcheck

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// PublicPEM encodes pub canonically: one PKIX "PUBLIC KEY" block, base64 in
// 64 columns, LF line endings, one trailing newline. Two encodings of the
// same key (PKCS#1 or PKIX, CRLF or LF, with or without trailing blanks)
// give the same bytes, so a file built from it changes only when a key does.
func PublicPEM(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("%w: encode %T: %w", ErrUnsupported, pub, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// DER returns the block's content re-encoded from what was parsed, in the
// encoding it was found in (b.Encoding). For a well-formed block this is the
// block's own DER; it is derived rather than kept so that the parser stays
// the one place that reads PEM. An EC PARAMETERS block has none. Parse
// gives PKCS#1 to RSA keys only and SEC1 to EC keys only.
func (b Block) DER() ([]byte, error) {
	switch {
	case b.Cert != nil:
		return b.Cert.Raw, nil
	case b.Kind == PublicKey && b.Encoding == PKIX:
		return x509.MarshalPKIXPublicKey(b.Public)
	case b.Kind == PublicKey && b.Encoding == PKCS1:
		return x509.MarshalPKCS1PublicKey(b.Public.(*rsa.PublicKey)), nil
	case b.Kind == PrivateKey && b.Encoding == PKCS8:
		return x509.MarshalPKCS8PrivateKey(b.Private)
	case b.Kind == PrivateKey && b.Encoding == PKCS1:
		return x509.MarshalPKCS1PrivateKey(b.Private.(*rsa.PrivateKey)), nil
	case b.Kind == PrivateKey && b.Encoding == SEC1:
		return x509.MarshalECPrivateKey(b.Private.(*ecdsa.PrivateKey))
	}
	return nil, fmt.Errorf("%w: %s has no DER content", ErrUnsupported, b)
}
