package redact

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"
)

// Base64 detection. A key can reach a log base64-encoded in many shapes:
// `base64 -w0 FILE` of a PEM file whose key starts at any byte offset (the
// encoded "-----BEGIN" then looks different at each offset modulo 3),
// wrapped `base64 FILE` output, base64 of the bare DER (no armour at all),
// kubeconfig's client-key-data, JWK-style URL-alphabet text. Matching the
// encoded text cannot cover these; decoding it can. So every long base64 run
// is decoded (once per possible alignment of its first character, since a
// prefix such as a diff's "+" or a URL-alphabet "-" may be glued to it) and
// the bytes are tested for key material: a PEM private key BEGIN or END
// armour, the OpenSSH key magic, or a DER structure of PKCS#1, PKCS#8 (plain
// or encrypted) or SEC 1 at the start.

// urlToStd folds the URL-safe alphabet onto the standard one.
var urlToStd = strings.NewReplacer("-", "+", "_", "/")

// minRun is the shortest base64 run decoded on its own: the smallest private
// key (an Ed25519 PKCS#8 DER, 48 bytes) encodes to 64 characters. Shorter
// runs are only looked at as lines of a block.
const minRun = 64

// isB64 reports whether c is in the standard or the URL-safe alphabet.
func isB64(c byte) bool { return b64Val[c] >= 0 }

// runs returns the [start, end) of every base64 run in s at least n long,
// trailing "=" padding included.
func runs(s string, n int) [][2]int {
	var out [][2]int
	for i := 0; i < len(s); {
		if !isB64(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isB64(s[j]) {
			j++
		}
		e := j
		for e < len(s) && e-j < 2 && s[e] == '=' {
			e++
		}
		if j-i >= n {
			out = append(out, [2]int{i, e})
		}
		i = e
	}
	return out
}

// hasRun reports cheaply whether s has a base64 run at least n long. It
// looks at every n-th byte only: a run of n covers one of them, and only
// around those is a run measured (this is on every log record's path).
func hasRun(s string, n int) bool {
	for i := n - 1; i < len(s); {
		if !isB64(s[i]) {
			i += n
			continue
		}
		l, r := i, i+1
		for l > 0 && isB64(s[l-1]) {
			l--
		}
		for r < len(s) && isB64(s[r]) {
			r++
		}
		if r-l >= n {
			return true
		}
		i = r + n
	}
	return false
}

// EncodedKey reports whether the base64 text enc (in either alphabet,
// padded or not, possibly with up to three stray characters glued to its
// front) decodes to private key material.
func EncodedKey(enc string) bool {
	enc = strings.TrimRight(enc, "=")
	if len(enc) < 8 {
		return false
	}
	norm := []byte(urlToStd.Replace(enc))
	buf := make([]byte, base64.RawStdEncoding.DecodedLen(len(norm)))
	for skip := 0; skip < 4 && len(norm)-skip >= 8; skip++ {
		t := norm[skip:]
		t = t[:len(t)/4*4]
		if n, err := base64.RawStdEncoding.Decode(buf, t); err == nil && KeyMaterial(buf[:n]) {
			return true
		}
	}
	return false
}

var (
	pemPrivateEnd = []byte("PRIVATE KEY-----")
	pemSecretEnd  = []byte("SECRET KEY-----")
	pemPGPEnd     = []byte("PRIVATE KEY BLOCK-----")
	opensshMagic  = []byte("openssh-key-v1\x00")
	// OIDs that open a PKCS#8 AlgorithmIdentifier: rsaEncryption,
	// id-ecPublicKey, Ed25519/X25519/Ed448/X448, DSA.
	pkcs8OIDs = [][]byte{
		{0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01},
		{0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01},
		{0x06, 0x03, 0x2b, 0x65},
		{0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01},
	}
	// pbes2OID is the PKCS#5 arc that opens an encrypted PKCS#8.
	pbes2OID = []byte{0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x05}
)

// KeyMaterial reports whether b (decoded bytes) holds a private key: PEM
// armour of one (the END armour too, for a block whose BEGIN lies before
// the decoded part), the OpenSSH magic, or the start of the DER of a
// PKCS#1, PKCS#8 or SEC 1 private key, anywhere in b. (The DER patterns
// are 6 to 12 fixed bytes: random data matches one about once in 2^40
// positions, and public keys and certificates never do.)
func KeyMaterial(b []byte) bool {
	if bytes.Contains(b, pemPrivateEnd) || bytes.Contains(b, pemSecretEnd) || bytes.Contains(b, pemPGPEnd) ||
		beginRE.Match(b) || bytes.Contains(b, opensshMagic) {
		return true
	}
	for i, c := range b {
		if c == 0x30 && derKey(b[i:]) {
			return true
		}
	}
	return false
}

// derKey recognises the first bytes of a DER private key:
//
//	PKCS#1  SEQUENCE { INTEGER 0, INTEGER n (long) ... }
//	SEC 1   SEQUENCE { INTEGER 1, OCTET STRING d ... }
//	PKCS#8  SEQUENCE { INTEGER 0|1, SEQUENCE { OID ... } ... }
//	PKCS#8 encrypted  SEQUENCE { SEQUENCE { OID pkcs5 ... } ... }
func derKey(b []byte) bool {
	body, ok := derSeq(b)
	if !ok {
		return false
	}
	if len(body) >= 2 && body[0] == 0x30 { // encrypted PKCS#8
		inner, ok := derSeq(body)
		return ok && bytes.HasPrefix(inner, pbes2OID)
	}
	if len(body) < 5 || body[0] != 0x02 || body[1] != 0x01 {
		return false
	}
	version, rest := body[2], body[3:]
	switch {
	case version == 0 && rest[0] == 0x02 && (rest[1] == 0x81 || rest[1] == 0x82 || rest[1] == 0x83): // PKCS#1
		return true
	case version == 1 && rest[0] == 0x04 && rest[1] >= 0x10 && rest[1] <= 0x42: // SEC 1 (a 128 to 521-bit scalar)
		return true
	case version <= 1 && rest[0] == 0x30: // PKCS#8
		inner, ok := derSeq(rest)
		return ok && slices.ContainsFunc(pkcs8OIDs, func(oid []byte) bool { return bytes.HasPrefix(inner, oid) })
	}
	return false
}

// derSeq returns what follows a SEQUENCE tag and its length at the start
// of b (not cut to the length: b may be a prefix of the DER).
func derSeq(b []byte) ([]byte, bool) {
	if len(b) < 2 || b[0] != 0x30 {
		return nil, false
	}
	switch l := b[1]; {
	case l < 0x80:
		return b[2:], l >= 2
	case l >= 0x81 && l <= 0x83 && len(b) >= int(l)-0x7e:
		return b[int(l)-0x7e:], true
	}
	return nil, false
}
