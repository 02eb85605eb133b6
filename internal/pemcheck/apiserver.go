package pemcheck

import (
	"bytes"
	"crypto"
	"encoding/pem"

	"k8s.io/client-go/util/keyutil"
)

// APIServerKey is one key that kube-apiserver's --service-account-key-file
// reader loads, with the line of the BEGIN it came from.
type APIServerKey struct {
	Line   int
	Public crypto.PublicKey
}

// APIServerKeys returns the keys kube-apiserver would load from data, in
// order, as client-go's keyutil.ParsePublicKeysPEM reads them: blocks
// come from encoding/pem's Decode, which skips everything up to a line that
// starts with "-----BEGIN " (so a BEGIN after a byte-order mark or
// indentation is invisible), and each block's bytes are tried as an RSA
// private key (PKCS#1, PKCS#8), an RSA public key (PKIX, certificate), an
// EC private key (SEC1 only) and an ECDSA public key (PKIX, certificate);
// the PEM type is ignored and anything else is skipped without a word.
// The rules are pinned by TestAPIServerKeysTable against a real apiserver.
func APIServerKeys(data []byte) []APIServerKey {
	var keys []APIServerKey
	rest := data
	for {
		before := rest
		var p *pem.Block
		p, rest = pem.Decode(rest)
		if p == nil {
			return keys
		}
		// keyutil on the one block: the reader itself, which returns an
		// error when it skips the block.
		pub, err := keyutil.ParsePublicKeysPEM(pem.EncodeToMemory(p))
		if err != nil {
			continue
		}
		// The block's BEGIN is the last one before the END of what Decode took.
		chunk := before[:len(before)-len(rest)]
		if end := bytes.LastIndex(chunk, endMarker); end >= 0 {
			chunk = chunk[:end]
		}
		begin := len(data) - len(before) + max(bytes.LastIndex(chunk, beginMarker), 0)
		keys = append(keys, APIServerKey{Line: bytes.Count(data[:begin], []byte("\n")) + 1, Public: pub[0]})
	}
}
