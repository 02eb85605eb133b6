package template

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	texttemplate "text/template"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/kelseyhightower/memkv"
)

// Keyring holds the OpenPGP secret keys of confd's -secret-keyring, which
// the crypt functions (cget, cgets, cgetv, cgetvs) decrypt values with.
type Keyring struct {
	entities openpgp.EntityList
}

// ReadKeyring reads an armoured OpenPGP secret keyring, as confd 0.16's
// -secret-keyring. The error names the file, never its content.
func ReadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-secret-keyring: %w", err)
	}
	defer f.Close()
	el, err := openpgp.ReadArmoredKeyRing(f)
	if err != nil {
		return nil, fmt.Errorf("-secret-keyring %s: not an armored OpenPGP keyring: %w", path, err)
	}
	if !slices.ContainsFunc(el, func(e *openpgp.Entity) bool { return e.PrivateKey != nil }) {
		return nil, fmt.Errorf("-secret-keyring %s: holds no secret key, so no value can be decrypted", path)
	}
	return &Keyring{entities: el}, nil
}

// decrypt undoes confd's crypt encoding (xordataexchange/crypt's secconf):
// base64(OpenPGP(gzip(value))). The error never carries the value.
func (k *Keyring) decrypt(value string) (string, error) {
	md, err := openpgp.ReadMessage(base64.NewDecoder(base64.StdEncoding, bytes.NewBufferString(value)), k.entities, nil, nil)
	if err != nil {
		return "", fmt.Errorf("not an OpenPGP message for -secret-keyring: %w", err)
	}
	zr, err := gzip.NewReader(md.UnverifiedBody)
	if err != nil {
		return "", fmt.Errorf("decrypted value is not gzip data: %w", err)
	}
	defer zr.Close()
	b, err := io.ReadAll(zr)
	if err != nil {
		return "", fmt.Errorf("decrypted value: %w", err)
	}
	return string(b), nil
}

// errNoKeyring is what a crypt function says without -secret-keyring.
// confd 0.16 left the functions undefined then ("function cget not
// defined"); naming the flag says what to do.
var errNoKeyring = errors.New("needs -secret-keyring (the crypt functions decrypt with its keys)")

// cryptFuncs returns cget, cgets, cgetv and cgetvs over the key functions of
// b's store, decrypting with b's keyring. Every decrypted value is passed
// to b.seen (when not nil), so that errors can be kept clean of it.
func cryptFuncs(b *binding) texttemplate.FuncMap {
	dec := func(fn, key, v string) (string, error) {
		if b.keyring == nil {
			return "", fmt.Errorf("%s %q: %w", fn, key, errNoKeyring)
		}
		p, err := b.keyring.decrypt(v)
		if err != nil {
			return "", fmt.Errorf("%s %q: %w", fn, key, err)
		}
		if b.seen != nil {
			b.seen(p)
		}
		return p, nil
	}
	// On an error text/template drops the result, so a half-decrypted
	// list is never seen.
	return texttemplate.FuncMap{
		"cget": func(key string) (memkv.KVPair, error) {
			kv, err := b.store.Get(key)
			if err == nil {
				kv.Value, err = dec("cget", kv.Key, kv.Value)
			}
			return kv, err
		},
		"cgets": func(pattern string) (memkv.KVPairs, error) {
			kvs, err := b.store.GetAll(pattern)
			for i := 0; i < len(kvs) && err == nil; i++ {
				kvs[i].Value, err = dec("cgets", kvs[i].Key, kvs[i].Value)
			}
			return kvs, err
		},
		"cgetv": func(key string) (string, error) {
			v, err := b.store.GetValue(key)
			if err == nil {
				v, err = dec("cgetv", key, v)
			}
			return v, err
		},
		"cgetvs": func(pattern string) ([]string, error) {
			vs, err := b.store.GetAllValues(pattern)
			for i := 0; i < len(vs) && err == nil; i++ {
				vs[i], err = dec("cgetvs", pattern, vs[i])
			}
			return vs, err
		},
	}
}
