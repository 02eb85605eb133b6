package preflight

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"fmt"
	"time"

	"github.com/keysync/confd/internal/pemcheck"
)

// role is what kube-apiserver does with the file a flag names.
type role int

const (
	roleSAKey      role = iota + 1 // verifies service-account tokens
	roleSigningKey                 // signs them
	roleCA                         // certificate bundle to trust
	roleCert                       // certificate half of a key pair
	roleKey                        // private key half
	roleSNI                        // --tls-sni-cert-key certfile,keyfile[:names]
	// roleSigningEndpoint names the external signer's Unix socket, which
	// signs and serves the verification keys instead of the two
	// service-account key-file flags (endpoint.go).
	roleSigningEndpoint
	// roleSetting is a value, not a file: read for a check elsewhere.
	roleSetting
)

type flagSpec struct {
	role  role
	multi bool   // repeatable: every occurrence counts (pflag string array)
	key   string // for roleCert: the flag naming its private key
	// emptyUnset: an empty value is the flag unset (kube-apiserver tests
	// the value's length), not an error; the last occurrence still wins.
	emptyUnset bool
}

// apiserverFlags are the kube-apiserver flags naming PEM files whose breakage
// stops the apiserver or breaks what it serves. A function, not a variable,
// so nothing can mutate it.
func apiserverFlags() map[string]flagSpec {
	return map[string]flagSpec{
		"service-account-key-file":         {role: roleSAKey, multi: true},
		"service-account-signing-key-file": {role: roleSigningKey},
		"service-account-signing-endpoint": {role: roleSigningEndpoint, emptyUnset: true},
		// Checked against the external signer's Metadata (endpoint.go).
		"service-account-max-token-expiration": {role: roleSetting},
		"tls-cert-file":                        {role: roleCert, key: "tls-private-key-file"},
		"tls-private-key-file":                 {role: roleKey},
		"tls-sni-cert-key":                     {role: roleSNI, multi: true},
		"client-ca-file":                       {role: roleCA},
		"requestheader-client-ca-file":         {role: roleCA},
		"proxy-client-cert-file":               {role: roleCert, key: "proxy-client-key-file"},
		"proxy-client-key-file":                {role: roleKey},
		"kubelet-client-certificate":           {role: roleCert, key: "kubelet-client-key"},
		"kubelet-client-key":                   {role: roleKey},
		"kubelet-certificate-authority":        {role: roleCA},
		"etcd-certfile":                        {role: roleCert, key: "etcd-keyfile"},
		"etcd-keyfile":                         {role: roleKey},
		"etcd-cafile":                          {role: roleCA},
		"oidc-ca-file":                         {role: roleCA},
	}
}

// options returns the pemcheck rules for a file in role r. Certificate and
// key files may be one combined file, as Go's TLS loader allows.
func options(r role, now time.Time) pemcheck.Options {
	o := map[role]pemcheck.Options{
		// ForbidCA: the apiserver would trust the CA's key (issue 34).
		roleSAKey:      {Validate: apiserverReadsSAKey, APIServerSAKeys: true, ForbidCA: true},
		roleSigningKey: {Require: pemcheck.PrivateKey, Validate: apiserverSigns},
		roleCA:         {Allow: pemcheck.Certificate, Require: pemcheck.Certificate},
		roleCert:       {Allow: pemcheck.Certificate | pemcheck.PrivateKey, Require: pemcheck.Certificate},
		roleKey:        {Allow: pemcheck.Certificate | pemcheck.PrivateKey, Require: pemcheck.PrivateKey},
	}[r]
	o.Now = now
	return o
}

// apiserverReadsSAKey mirrors which blocks kube-apiserver's
// --service-account-key-file reader (client-go keyutil.ParsePublicKeysPEM)
// takes: it tries each block's bytes as a PKCS#1/PKCS#8 RSA private key, a
// PKIX key or certificate, or a SEC1 EC private key, and silently skips
// anything else. A skipped key is the dangerous case: the apiserver starts,
// and every token signed with that key is then rejected.
func apiserverReadsSAKey(b pemcheck.Block) error {
	switch b.Kind {
	case pemcheck.Certificate, pemcheck.PublicKey:
		if b.Encoding == pemcheck.PKCS1 {
			return fmt.Errorf(`%w: PKCS#1 "RSA PUBLIC KEY" blocks are skipped; re-encode as PKIX "PUBLIC KEY" (openssl rsa -RSAPublicKey_in -pubout)`, ErrIgnoredKey)
		}
		switch b.Public.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey:
			return nil
		}
		return fmt.Errorf("%w: %T keys are skipped; only RSA and ECDSA keys are read", ErrIgnoredKey, b.Public)
	case pemcheck.PrivateKey:
		switch b.Private.(type) {
		case *rsa.PrivateKey:
			return nil
		case *ecdsa.PrivateKey:
			if b.Encoding == pemcheck.SEC1 {
				return nil
			}
			return fmt.Errorf(`%w: ECDSA private keys in %s are skipped; use SEC1 "EC PRIVATE KEY" or the public key`, ErrIgnoredKey, b.Encoding)
		}
		return fmt.Errorf("%w: %T keys are skipped; only RSA and ECDSA keys are read", ErrIgnoredKey, b.Private)
	}
	return nil
}

// apiserverSigns accepts the private keys kube-apiserver can sign tokens
// with (RS256 and ES256/384/512). Its signing-key reader (keyutil
// ParsePrivateKeyPEM), unlike the others, believes the PEM type, so a
// mislabelled block is refused too.
func apiserverSigns(b pemcheck.Block) error {
	if b.Kind != pemcheck.PrivateKey {
		return nil
	}
	want := map[string]pemcheck.Encoding{"RSA PRIVATE KEY": pemcheck.PKCS1, "EC PRIVATE KEY": pemcheck.SEC1, "PRIVATE KEY": pemcheck.PKCS8}[b.Type]
	if b.Encoding != want {
		return fmt.Errorf("%w: block labelled %q holds %s, which the signing-key reader does not accept", ErrIgnoredKey, b.Type, b.Encoding)
	}
	switch k := b.Private.(type) {
	case *rsa.PrivateKey:
		return nil
	case *ecdsa.PrivateKey:
		switch k.Curve.Params().BitSize {
		case 256, 384, 521:
			return nil
		}
	}
	return fmt.Errorf("%w: cannot sign service-account tokens with a %T", ErrIgnoredKey, b.Private)
}
