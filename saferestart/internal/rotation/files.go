package rotation

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"

	"github.com/keysync/confd/internal/atomicfile"
	"github.com/keysync/confd/internal/keystate"
	"github.com/keysync/confd/internal/pemcheck"
)

// Algorithms rotate-key can generate.
const (
	RSA2048   = "rsa-2048"
	ECDSAP256 = "ecdsa-p256"
)

// Files are one host's service-account key files and the rotation's own
// files beside them.
type Files struct {
	SigningKey string // e.g. /etc/kubernetes/pki/sa.key
	PublicKey  string // e.g. /etc/kubernetes/pki/sa.pub: what the host publishes
}

// NextKey is where the next signing key waits until it is installed.
func (f Files) NextKey() string { return f.SigningKey + ".next" }

// NextPub is the next key's public half, kept for operators and wait-trusted.
func (f Files) NextPub() string { return f.PublicKey + ".next" }

// Backup is where the previous signing key is kept after the install.
func (f Files) Backup() string { return f.SigningKey + ".previous" }

// generate makes a key pair: the private key PEM in the encoding
// kube-apiserver's signing-key reader and kubeadm use (PKCS#1 for RSA, SEC1
// for ECDSA) and the public key as PKIX.
func generate(algorithm string) (privPEM, pubPEM []byte, err error) {
	var pub crypto.PublicKey
	switch algorithm {
	case RSA2048:
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, nil, err
		}
		privPEM = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
		pub = &k.PublicKey
	case ECDSAP256:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, nil, err
		}
		privPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
		pub = &k.PublicKey
	default:
		return nil, nil, fmt.Errorf("--algorithm %q: want %s or %s", algorithm, RSA2048, ECDSAP256)
	}
	pubPEM, err = pemcheck.PublicPEM(pub)
	return privPEM, pubPEM, err
}

// signingKeyID is the key ID of the single private key in path.
func signingKeyID(path string) (string, error) {
	f, err := pemcheck.ReadFile(path)
	if err != nil {
		return "", err
	}
	var kids []string
	for _, b := range f.Blocks {
		if b.Kind == pemcheck.PrivateKey {
			kid, err := pemcheck.KeyID(b.Public)
			if err != nil {
				return "", fmt.Errorf("%s: %w", path, err)
			}
			kids = append(kids, kid)
		}
	}
	if len(kids) != 1 {
		return "", fmt.Errorf("%s: holds %d private keys, want 1", path, len(kids))
	}
	return kids[0], nil
}

// publicBlocks returns the public keys in PEM bytes, re-encoded as PKIX
// "PUBLIC KEY" (what the apiserver's reader takes), in order, duplicates once.
func publicBlocks(name string, data []byte) ([]keystate.Item, error) {
	f, err := pemcheck.Parse(name, data)
	if err != nil {
		return nil, err
	}
	var out []keystate.Item
	seen := map[string]bool{}
	for _, b := range f.Blocks {
		if b.Kind != pemcheck.PublicKey {
			return nil, fmt.Errorf("%s %s: %s, want public keys only", name, b, b.Kind)
		}
		kid, err := pemcheck.KeyID(b.Public)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		if seen[kid] {
			continue
		}
		seen[kid] = true
		pub, err := pemcheck.PublicPEM(b.Public)
		if err != nil {
			return nil, err
		}
		out = append(out, keystate.Item{KID: kid, PEM: pub})
	}
	return out, nil
}

// readPublic is publicBlocks of the file at path, and its bytes.
func readPublic(path string) ([]byte, []keystate.Item, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	keys, err := publicBlocks(path, data)
	return data, keys, err
}

// nextPublic is the next key's public half, an error unless NextPub holds
// exactly kid.
func (f Files) nextPublic(kid string) (keystate.Item, error) {
	_, nb, err := readPublic(f.NextPub())
	if err != nil {
		return keystate.Item{}, err
	}
	if len(nb) != 1 || nb[0].KID != kid {
		return keystate.Item{}, fmt.Errorf("%s does not hold exactly the next key %s", f.NextPub(), kid)
	}
	return nb[0], nil
}

// writePublic makes the public key file hold keys (its mode kept) unless
// it holds exactly those bytes (old) already, and returns them.
func (f Files) writePublic(old []byte, keys []keystate.Item) ([]byte, error) {
	value := keystate.Join(keys)
	if !bytes.Equal(value, old) {
		if err := atomicfile.WriteFile(f.PublicKey, value, modeOf(f.PublicKey, 0o644)); err != nil {
			return nil, err
		}
	}
	return value, nil
}

// modeOf is path's permission bits, or def when it does not exist.
func modeOf(path string, def fs.FileMode) fs.FileMode {
	st, err := os.Stat(path)
	if err != nil {
		return def
	}
	return st.Mode().Perm()
}
