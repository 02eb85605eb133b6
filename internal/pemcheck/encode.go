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
// the one place that reads PEM. An EC PARAMETERS block has none.
func (b Block) DER() ([]byte, error) {
	switch {
	case b.Cert != nil:
		return b.Cert.Raw, nil
	case b.Kind == PublicKey && b.Encoding == PKIX:
		return x509.MarshalPKIXPublicKey(b.Public)
	case b.Kind == PublicKey && b.Encoding == PKCS1:
		return marshalPKCS1Public(b.Public)
	case b.Kind == PrivateKey && b.Encoding == PKCS8:
		return x509.MarshalPKCS8PrivateKey(b.Private)
	case b.Kind == PrivateKey && b.Encoding == PKCS1:
		return marshalPKCS1Private(b.Private)
	case b.Kind == PrivateKey && b.Encoding == SEC1:
		return marshalSEC1(b.Private)
	}
	return nil, fmt.Errorf("%w: %s has no DER content", ErrUnsupported, b)
}

func marshalPKCS1Public(k crypto.PublicKey) ([]byte, error) {
	if rk, ok := k.(*rsa.PublicKey); ok {
		return x509.MarshalPKCS1PublicKey(rk), nil
	}
	return nil, fmt.Errorf("%w: PKCS#1 public key of type %T", ErrUnsupported, k)
}

func marshalPKCS1Private(k crypto.PrivateKey) ([]byte, error) {
	if rk, ok := k.(*rsa.PrivateKey); ok {
		return x509.MarshalPKCS1PrivateKey(rk), nil
	}
	return nil, fmt.Errorf("%w: PKCS#1 private key of type %T", ErrUnsupported, k)
}

func marshalSEC1(k crypto.PrivateKey) ([]byte, error) {
	if ek, ok := k.(*ecdsa.PrivateKey); ok {
		return x509.MarshalECPrivateKey(ek)
	}
	return nil, fmt.Errorf("%w: SEC1 private key of type %T", ErrUnsupported, k)
}
