package template

import (
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/internal/pemcheck"
)

// The PEM functions read values through pemcheck, the same strict reader
// the bundle's check_cmd uses, so a template never renders a block the
// check would refuse or kube-apiserver would skip. None of their errors
// quotes a value: values may hold private keys.

// PEMBlock is one block of a value, as pemBlocks returns it.
type PEMBlock struct {
	Type  string // the PEM type as written, e.g. "RSA PUBLIC KEY"
	Kind  string // "certificate", "public key", "private key" or "EC parameters"
	Bytes []byte // the DER content

	source string // the key or "value N" it came from, for errors
	block  pemcheck.Block
}

// String is the block re-armoured under its own type with LF line endings
// and 64-column base64, so {{.}} prints a clean copy of the block.
func (b PEMBlock) String() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes}))
}

// PublicKey is one public key found by publicKeys.
type PublicKey struct {
	KeyID   string   // Kubernetes' service-account key ID (the JWKS "kid")
	PEM     string   // the key as pemNormalize writes it
	Sources []string // the keys (or "value N") it was found in, in input order
}

// String is the canonical PEM, so {{.}} prints the key.
func (k PublicKey) String() string { return k.PEM }

// pemBlocks returns the blocks of a PEM value in order.
func pemBlocks(value string) ([]PEMBlock, error) {
	blocks, name, err := blocksOf("pemBlocks", value)
	if err != nil {
		return nil, err
	}
	out := make([]PEMBlock, 0, len(blocks))
	for _, b := range blocks {
		pb := PEMBlock{Type: b.Type, Kind: b.Kind.String(), source: name, block: b}
		if b.Kind != pemcheck.ECParameters {
			if pb.Bytes, err = b.DER(); err != nil {
				return nil, pemcheck.BlockError(name, &b, err)
			}
		}
		out = append(out, pb)
	}
	return out, nil
}

// blocksOf accepts what a template may hold: a PEM string, one block from
// pemBlocks, or a key from publicKeys.
// A value is named "value" in errors, a pair by its key.
func blocksOf(fn string, v any) ([]pemcheck.Block, string, error) {
	var name, value string
	switch x := v.(type) {
	case PEMBlock:
		return []pemcheck.Block{x.block}, x.source, nil
	case *PEMBlock:
		return []pemcheck.Block{x.block}, x.source, nil
	case string:
		name, value = "value", x
	case PublicKey:
		name, value = "key "+x.KeyID, x.PEM
	case memkv.KVPair:
		name, value = x.Key, x.Value
	default:
		return nil, "", fmt.Errorf("%s: cannot read PEM from a %T", fn, v)
	}
	f, err := pemcheck.Parse(name, []byte(value))
	if err != nil {
		return nil, name, err
	}
	return f.Blocks, name, nil
}

// keyID returns the key ID kube-apiserver gives the key in v (a public key,
// certificate or private key; an EC PARAMETERS block beside it is ignored).
// A value holding two different keys is an error: which one was meant?
func keyID(v any) (string, error) {
	blocks, name, err := blocksOf("keyID", v)
	if err != nil {
		return "", err
	}
	ids, err := (&pemcheck.File{Name: name, Blocks: blocks}).KeyIDs()
	if err != nil {
		return "", err
	}
	if len(ids) == 0 {
		return "", fmt.Errorf("keyID: %s: %w", name, pemcheck.ErrNoKey)
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			return "", fmt.Errorf("keyID: %s holds more than one key (%s and %s); use pemBlocks or publicKeys", name, ids[0], id)
		}
	}
	return ids[0], nil
}

// pemNormalize re-encodes every public key in v canonically (PKIX
// "PUBLIC KEY", LF, 64 columns, one trailing newline); a certificate gives
// its public key. A private key is an error, not silently reduced to its
// public half: a private key where a public one belongs is a leak to stop.
func pemNormalize(v any) (string, error) {
	blocks, name, err := blocksOf("pemNormalize", v)
	if err != nil {
		return "", err
	}
	var out []byte
	for _, b := range blocks {
		if b.Kind == pemcheck.PrivateKey {
			return "", pemcheck.BlockError(name, &b, fmt.Errorf("%w: a private key must never be published", pemcheck.ErrPrivateKey))
		}
		if b.Public == nil {
			continue // EC PARAMETERS
		}
		p, err := pemcheck.PublicPEM(b.Public)
		if err != nil {
			return "", pemcheck.BlockError(name, &b, err)
		}
		out = append(out, p...)
	}
	if len(out) == 0 {
		return "", fmt.Errorf("pemNormalize: %s: %w", name, pemcheck.ErrNoKey)
	}
	return string(out), nil
}

// publicKeys collects the public keys of every value given (strings, lists
// of strings as getvs returns, or key/value pairs as gets returns, whose
// keys then name the value in errors; a certificate gives its public key),
// de-duplicated by key ID (a certificate and the same key published bare
// are one key) and sorted by key ID, so the result depends only on the set
// of keys published.
//
// A certificate authority's key in a value (`cat leaf.crt ca.crt`) is
// dropped (pemcheck's PublishedKeys, as kube-apiserver-sa-signer does) and
// told to the render's Options.Warn (confd logs it); publish-key refuses
// such a file. A value left with no key is an error, as a value with
// nothing but a private key is.
//
// The template function is bound to its render's warn (funcMap); warn may be nil.
func publicKeys(warn func(string), values ...any) ([]PublicKey, error) {
	type named struct{ name, value string }
	var all []named
	var add func(v any) error
	add = func(v any) error {
		switch x := v.(type) {
		case string:
			all = append(all, named{fmt.Sprintf("value %d", len(all)+1), x})
		case []string:
			for _, s := range x {
				all = append(all, named{fmt.Sprintf("value %d", len(all)+1), s})
			}
		case memkv.KVPair:
			all = append(all, named{x.Key, x.Value})
		case memkv.KVPairs:
			return add([]memkv.KVPair(x))
		case []memkv.KVPair:
			for _, p := range x {
				all = append(all, named{p.Key, p.Value})
			}
		case []any:
			for _, item := range x {
				if err := add(item); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("publicKeys: cannot read PEM from a %T", v)
		}
		return nil
	}
	for _, v := range values {
		if err := add(v); err != nil {
			return nil, err
		}
	}
	byID := map[string]*PublicKey{}
	var errs []error
	for _, n := range all {
		f, err := pemcheck.Parse(n.name, []byte(n.value))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		blocks, dropped, err := f.PublishedKeys()
		for _, ca := range dropped {
			if warn != nil {
				warn(fmt.Sprintf("publicKeys: %s %s: a certificate authority's key (%s): left out of the render, since every apiserver would trust tokens its holder signs; publish the leaf certificate alone", n.name, ca.Block, ca.Reason))
			}
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// A certificate counts as its public key: kube-apiserver takes
		// certificates in --service-account-key-file and trusts exactly
		// their key (neither name nor expiry means anything there), and
		// PKIs that renew a master's certificate publish it, not the key.
		for _, b := range blocks {
			p, err := pemcheck.PublicPEM(b.Public)
			var id string
			if err == nil {
				id, err = pemcheck.KeyID(b.Public)
			}
			if err != nil {
				errs = append(errs, pemcheck.BlockError(n.name, &b, err))
				continue
			}
			k, ok := byID[id]
			if !ok {
				k = &PublicKey{KeyID: id, PEM: string(p)}
				byID[id] = k
			}
			if len(k.Sources) == 0 || k.Sources[len(k.Sources)-1] != n.name {
				k.Sources = append(k.Sources, n.name)
			}
		}
	}
	// Every bad value is reported, not just the first: fixing one at a
	// time across a fleet's masters is slow.
	if len(errs) > 0 {
		return nil, fmt.Errorf("publicKeys: %w", oneLine{errors.Join(errs...)})
	}
	out := make([]PublicKey, 0, len(byID))
	for _, k := range byID {
		out = append(out, *k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].KeyID < out[j].KeyID })
	return out, nil
}

// oneLine is an error (errors.Join's) on one line: a render error ends up
// in one log line.
type oneLine struct{ error }

func (e oneLine) Error() string { return strings.ReplaceAll(e.error.Error(), "\n", "; ") }
func (e oneLine) Unwrap() error { return e.error }
