package pemcheck

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Options say what a file must hold. The zero value asks only for at least
// one key or certificate, with certificates valid now.
type Options struct {
	// Now is the instant certificates must be valid at; zero means time.Now().
	Now time.Time
	// Allow is the set of kinds permitted; zero permits every kind. For
	// example a CA bundle allows Certificate only, while kube-apiserver's
	// --service-account-key-file takes Certificate|PublicKey|PrivateKey.
	Allow Kind
	// Require lists kinds that must each appear at least once.
	Require Kind
	// ForbidPrivate refuses private keys, for bundles that get published.
	// It is Allow without PrivateKey, kept separate because it is the one
	// rule whose breach leaks a secret, and reads so at the call site.
	ForbidPrivate bool
	// Validate, if set, is called for every permitted key or certificate
	// block, for rules that belong to one consumer (such as which key
	// encodings kube-apiserver actually reads). Its error is wrapped with
	// the block's position.
	Validate func(Block) error
	// APIServerSAKeys demands that kube-apiserver's --service-account-key-file
	// reader load every key or certificate block: a block it skips is a key
	// whose tokens are refused, without a log line.
	APIServerSAKeys bool
	// ForbidCA refuses a certificate authority's key (see CAs): among
	// service-account keys it would let the CA's holder mint tokens.
	ForbidCA bool
}

// Check checks f against opts and returns every problem found, joined.
func (f *File) Check(opts Options) error {
	now := cmp.Or(opts.Now, time.Now())
	allow := cmp.Or(opts.Allow, keyOrCert)
	if opts.ForbidPrivate {
		allow &^= PrivateKey
	}
	var errs []error
	var seen Kind
	for i := range f.Blocks {
		b := &f.Blocks[i]
		if b.Kind == ECParameters {
			continue
		}
		seen |= b.Kind
		if b.Kind&allow == 0 {
			switch {
			case b.Kind == PrivateKey && opts.ForbidPrivate:
				errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: a private key must never be published", ErrPrivateKey)))
			case b.Kind == PrivateKey:
				errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: want %s", ErrPrivateKey, allow&keyOrCert)))
			default:
				errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: %s, want %s", ErrKind, b.Kind, allow&keyOrCert)))
			}
			continue
		}
		if c := b.Cert; c != nil {
			switch {
			case now.Before(c.NotBefore):
				errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: %q is valid from %s (now %s)", ErrNotYetValid, c.Subject.String(),
					c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))))
			case now.After(c.NotAfter):
				errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: %q expired at %s (now %s)", ErrExpired, c.Subject.String(),
					c.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))))
			}
		}
		if opts.Validate != nil {
			if err := opts.Validate(*b); err != nil {
				errs = append(errs, BlockError(f.Name, b, err))
				continue
			}
		}
		if opts.APIServerSAKeys && !slices.ContainsFunc(f.apiserverKeys, func(k APIServerKey) bool { return k.Line == b.Line && sameKey(b.Public, k.Public) }) {
			errs = append(errs, BlockError(f.Name, b, fmt.Errorf("%w: kube-apiserver would skip this block (it reads RSA keys and certificates, PKIX ECDSA public keys and SEC1 EC private keys)", ErrSkipped)))
		}
	}
	if opts.ForbidCA {
		errs = append(errs, f.caErrors()...)
	}
	if seen&keyOrCert == 0 {
		errs = append(errs, &Error{File: f.Name, Err: ErrNoKey})
	}
	for _, k := range []Kind{Certificate, PublicKey, PrivateKey} {
		if opts.Require&k != 0 && seen&k == 0 {
			errs = append(errs, &Error{File: f.Name, Err: fmt.Errorf("%w: no %s", ErrMissingKind, k)})
		}
	}
	return errors.Join(errs...)
}

// Certificates returns the file's certificates in order.
func (f *File) Certificates() []*x509.Certificate {
	var out []*x509.Certificate
	for _, b := range f.Blocks {
		if b.Cert != nil {
			out = append(out, b.Cert)
		}
	}
	return out
}

// First returns the file's first block of kind k, or nil.
func (f *File) First(k Kind) *Block {
	if i := slices.IndexFunc(f.Blocks, func(b Block) bool { return b.Kind == k }); i >= 0 {
		return &f.Blocks[i]
	}
	return nil
}

// MatchPair checks that the first certificate in certs (the leaf, as Go's
// tls.X509KeyPair takes it) belongs to the first private key in keys. The
// two may be the same File, for combined cert-and-key files. On a mismatch
// it names both key IDs, which are hashes of public keys and so safe to
// print, to help find which file is stale.
func MatchPair(certs, keys *File) error {
	leaf := certs.First(Certificate)
	if leaf == nil {
		return &Error{File: certs.Name, Err: fmt.Errorf("%w: no certificate", ErrMissingKind)}
	}
	key := keys.First(PrivateKey)
	if key == nil {
		return &Error{File: keys.Name, Err: fmt.Errorf("%w: no private key", ErrMissingKind)}
	}
	if sameKey(leaf.Public, key.Public) {
		return nil
	}
	certID, _ := KeyID(leaf.Public)
	keyID, _ := KeyID(key.Public)
	return BlockError(certs.Name, leaf, fmt.Errorf("against %s %s: %w (certificate %q has key ID %s, private key has key ID %s)",
		keys.Name, key, ErrMismatch, leaf.Cert.Subject.String(), certID, keyID))
}
