package pemcheck

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
)

// MinRSABits is the smallest RSA modulus a key may be published with:
// kube-apiserver-sa-signer refuses to sign with less, and a key too weak to
// sign with is too weak to verify with (whoever factors it mints tokens).
const MinRSABits = 2048

var (
	// ErrCA is a certificate authority's key among service-account keys.
	// kube-apiserver trusts every key in --service-account-key-file, so a
	// CA's key there lets whoever holds the CA's private key mint tokens
	// every apiserver accepts.
	ErrCA = errors.New("certificate authority's key where a service-account key belongs")
	// ErrLeaves is a file to publish holding several leaf certificates: a
	// host publishes its own, one.
	ErrLeaves = errors.New("more than one leaf certificate")
	// ErrWeakKey is an RSA key under MinRSABits.
	ErrWeakKey = errors.New("RSA key under 2048 bits")
)

// CA is a block found to be a certificate authority's, and why.
type CA struct {
	Block  Block
	Reason string
}

// CAs returns the blocks of f that belong to a certificate authority, in
// order: a certificate with basic constraints CA:TRUE or the keyCertSign
// usage, or any block whose key signed another certificate in the file (a
// CA pasted after the leaf it issued: `cat leaf.crt ca.crt`, whatever the
// CA's extensions say). A self-signed certificate is not its own CA's, nor
// is a key beside the certificate it signed for itself: both carry the
// certificate's own key.
func (f *File) CAs() []CA {
	var out []CA
	for _, b := range f.Blocks {
		if r := f.caReason(b); r != "" {
			out = append(out, CA{Block: b, Reason: r})
		}
	}
	return out
}

func (f *File) caReason(b Block) string {
	if c := b.Cert; c != nil {
		switch {
		case c.BasicConstraintsValid && c.IsCA:
			return fmt.Sprintf("%q has basic constraints CA:TRUE", c.Subject.String())
		case c.KeyUsage&x509.KeyUsageCertSign != 0:
			return fmt.Sprintf("%q has the keyCertSign key usage", c.Subject.String())
		}
	}
	if b.Public == nil {
		return ""
	}
	// CheckSignature uses the certificate's PublicKey alone, so a bare key
	// is checked as the issuer it would be; CheckSignatureFrom would also
	// demand CA:TRUE, which is what this test must not rely on.
	issuer := &x509.Certificate{PublicKey: b.Public}
	for _, o := range f.Blocks {
		c := o.Cert
		if c == nil || o.Index == b.Index || sameKey(b.Public, c.PublicKey) {
			continue
		}
		if issuer.CheckSignature(c.SignatureAlgorithm, c.RawTBSCertificate, c.Signature) == nil {
			return fmt.Sprintf("its key signed the certificate of block %d, %q", o.Index, c.Subject.String())
		}
	}
	return ""
}

func sameKey(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// PublishedKeys reads f as a published service-account value, as confd's
// publicKeys and kube-apiserver-sa-signer serve it: the blocks whose keys
// are served, in order, and the CA blocks dropped (see ErrCA), to be told.
// Each private key is an error, never dropped in silence (dropped is still
// returned); so is a value whose only keys are CAs'. No key at all is left
// to the caller.
func (f *File) PublishedKeys() (keys []Block, dropped []CA, err error) {
	var errs []error
	for i := range f.Blocks {
		b := &f.Blocks[i]
		switch reason := f.caReason(*b); {
		case b.Kind == PrivateKey:
			errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: a private key must never be published", ErrPrivateKey)))
		case reason != "":
			dropped = append(dropped, CA{Block: *b, Reason: reason})
		case b.Public != nil:
			keys = append(keys, *b)
		}
	}
	if len(keys) == 0 && len(errs) == 0 && len(dropped) > 0 {
		return nil, nil, BlockError(f.Name, &dropped[0].Block, fmt.Errorf("%w: %s, and the value holds no other key", ErrCA, dropped[0].Reason))
	}
	return keys, dropped, errors.Join(errs...)
}

// caErrors returns an error naming each CA block of f.
func (f *File) caErrors() []error {
	var errs []error
	for _, ca := range f.CAs() {
		errs = append(errs, BlockError(f.Name, &ca.Block, fmt.Errorf(
			"%w: %s; whoever holds its private key could sign tokens every apiserver accepts: publish the leaf certificate alone", ErrCA, ca.Reason)))
	}
	return errs
}

// WeakKeys returns an error naming each block of f whose key is RSA under
// MinRSABits. Callers decide whether that refuses (a key about to be
// published) or warns (a key already published: dropping it at once would
// refuse the live tokens it signed).
func (f *File) WeakKeys() []error {
	var errs []error
	for i := range f.Blocks {
		b := &f.Blocks[i]
		if k, ok := b.Public.(*rsa.PublicKey); ok && k.N.BitLen() < MinRSABits {
			errs = append(errs, BlockError(f.Name, b, fmt.Errorf(
				"%w: %d bits; kube-apiserver-sa-signer signs with %d or more: replace it (rotate-key with a new key)", ErrWeakKey, k.N.BitLen(), MinRSABits)))
		}
	}
	return errs
}

// CheckPublishable checks a file publish-key is about to publish (given by
// --certificate or --public-key, or --signing-key's public half), beyond
// what `check --public-only` asks of a bundle: no certificate authority's
// key (CAs), at most one leaf certificate (this host's; a renewal keeps
// the previous one published by itself), and no RSA key under MinRSABits.
// Every problem is returned, joined, each naming the file and the block.
func CheckPublishable(f *File) error {
	errs := f.caErrors()
	var leaf *Block
	for i := range f.Blocks {
		b := &f.Blocks[i]
		if b.Cert == nil || f.caReason(*b) != "" {
			continue
		}
		if leaf != nil {
			errs = append(errs, BlockError(f.Name, b, fmt.Errorf(
				"%w: block %d is one too; publish this host's certificate alone", ErrLeaves, leaf.Index)))
			continue
		}
		leaf = b
	}
	errs = append(errs, f.WeakKeys()...)
	return errors.Join(errs...)
}
