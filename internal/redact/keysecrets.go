package redact

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"strings"

	"golang.org/x/crypto/cryptobyte"
)

// KeySecrets returns the secret values of the private keys in PEM blocks
// of content (a rendered file), for NewSecrets: for each private part of a
// key, its bytes (base64 of them is the key's PEM body, a JWK member, or
// `openssl ... -outform DER | base64`), and the span of the block's text
// that encodes them (base64 of that is `base64 key.pem`, kubeconfig's
// client-key-data). Only the private parts: a key's public parts (an RSA
// modulus, an EC point) are also in certificates and public keys, which
// must stay readable. A block that does not parse as an RSA, EC, Ed25519
// or X25519 key (encrypted, OpenPGP) is secret as a whole, its text and its
// decoded body; of an OpenSSH key, the private section.
func KeySecrets(content []byte) [][]byte {
	var out [][]byte
	for rest := content; ; {
		loc := beginRE.FindIndex(rest)
		if loc == nil {
			return out
		}
		end := endRE.FindIndex(rest[loc[1]:])
		if end == nil {
			return append(out, rest[loc[0]:])
		}
		block := rest[loc[0] : loc[1]+end[1]]
		out = append(out, blockSecrets(block, loc[1]-loc[0])...)
		rest = rest[loc[1]+end[1]:]
	}
}

// blockSecrets are the secrets of one armoured block; body is where the
// text after the BEGIN armour starts.
func blockSecrets(block []byte, body int) [][]byte {
	text := block
	escaped := !bytes.Contains(block, []byte("\n")) && bytes.Contains(block, []byte(`\n`))
	if escaped { // inside a JSON string
		text = []byte(strings.NewReplacer(`\r\n`, "\n", `\n`, "\n").Replace(string(block)))
	}
	p, _ := pem.Decode(text)
	if p == nil || len(p.Headers) > 0 {
		return [][]byte{block}
	}
	parts := privateParts(p.Bytes)
	if parts == nil {
		return [][]byte{block, p.Bytes}
	}
	// The body's base64 characters and where each sits in block.
	var at []int
	for i := body; i < len(block); i++ {
		if escaped && block[i] == '\\' && i+1 < len(block) && (block[i+1] == 'n' || block[i+1] == 'r') {
			i++
			continue
		}
		if block[i] == '-' {
			break // the END armour
		}
		if b64Val[block[i]] >= 0 {
			at = append(at, i)
		}
	}
	var out [][]byte
	for _, r := range parts {
		out = append(out, p.Bytes[r[0]:r[1]])
		// The characters that encode bytes [a, b) alone.
		lo, hi := (8*r[0]+5)/6, 8*r[1]/6
		if hi <= len(at) && lo < hi {
			out = append(out, block[at[lo]:at[hi-1]+1])
		}
	}
	return out
}

// privateParts returns the byte ranges of der that hold the private
// values of the key, or nil if der is not a key this knows.
func privateParts(der []byte) [][2]int {
	if bytes.HasPrefix(der, opensshMagic) {
		return opensshPrivate(der)
	}
	var vals [][]byte
	var k any
	var err error
	if k, err = x509.ParsePKCS8PrivateKey(der); err != nil {
		if k, err = x509.ParsePKCS1PrivateKey(der); err != nil {
			if k, err = x509.ParseECPrivateKey(der); err != nil {
				return nil
			}
		}
	}
	switch k := k.(type) {
	case *rsa.PrivateKey:
		ints := []*big.Int{k.D, k.Precomputed.Dp, k.Precomputed.Dq, k.Precomputed.Qinv}
		ints = append(ints, k.Primes...)
		for _, i := range ints {
			if i != nil {
				vals = append(vals, i.Bytes())
			}
		}
	case *ecdsa.PrivateKey:
		b, err := k.Bytes()
		if err != nil {
			return nil
		}
		vals = append(vals, b)
	case ed25519.PrivateKey:
		vals = append(vals, k.Seed())
	case *ecdh.PrivateKey:
		vals = append(vals, k.Bytes())
	default:
		return nil
	}
	var out [][2]int
	for _, v := range vals {
		if i := bytes.Index(der, v); i >= 0 && len(v) > 0 {
			out = append(out, [2]int{i, i + len(v)})
		}
	}
	return out
}

// opensshPrivate finds the private section of an openssh-key-v1 key:
// magic, cipher, KDF, KDF options, key count, public keys, then it.
func opensshPrivate(der []byte) [][2]int {
	s := cryptobyte.String(der[len(opensshMagic):])
	var field []byte
	str := func() bool {
		var n uint32
		return s.ReadUint32(&n) && s.ReadBytes(&field, int(n))
	}
	for range 3 { // cipher, KDF, KDF options
		if !str() {
			return nil
		}
	}
	var nkeys uint32
	if !s.ReadUint32(&nkeys) {
		return nil
	}
	for range int(nkeys) + 1 { // the public keys, then the private section
		if !str() {
			return nil
		}
	}
	start := len(der) - len(s) - len(field)
	return [][2]int{{start, start + len(field)}}
}
