// Package trust records which service-account public keys each host's
// running kube-apiserver loaded at its last successful restart, and answers
// from those records whether a key is trusted by every host that publishes
// keys. Keys are named by their Kubernetes key ID (the JWKS "kid"), never by
// their contents.
package trust

import (
	"context"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/keysync/confd/internal/etcdkey"
	"github.com/keysync/confd/internal/pemcheck"
)

// DefaultPrefix is where trust records live, one key per host.
const DefaultPrefix = "/kubernetes/service-account-keys-trust"

// DefaultKeysPrefix is where hosts publish their public keys, one key per host.
const DefaultKeysPrefix = "/kubernetes/service-account-keys"

// Record is what one host's apiserver loaded at its last successful restart.
type Record struct {
	Host string `json:"host"`
	// Trusted lists the key IDs of every service-account public key the
	// apiserver verifies tokens with, in file order, without duplicates.
	Trusted []string `json:"trusted"`
	// Signing is the key ID of the key it signs tokens with ("" if unknown).
	Signing string `json:"signing,omitempty"`
	// ControllerManagerSigning is the key ID of the key this host's
	// kube-controller-manager signs legacy token Secrets with, read from
	// its --service-account-private-key-file when the record was written
	// ("" when unknown: an older helper, or no --controller-manager-flags-file;
	// such a record blocks nothing).
	ControllerManagerSigning string `json:"controller_manager_signing,omitempty"`
	// BundleSHA256 is the hex SHA-256 of the service-account key files'
	// bytes, concatenated in flag order.
	BundleSHA256 string    `json:"bundle_sha256"`
	Time         time.Time `json:"time"`
	// Source is "kube-apiserver-sa-signer" for a record a signer wrote
	// from what its apiserver fetched (signer mode); empty for one written
	// at a restart from the key files (bundle mode).
	Source string `json:"source,omitempty"`
	// Revision is the etcd revision that last wrote the record (set on read).
	Revision int64 `json:"mod_revision,omitempty"`
	// Unparseable, set on read, says why the stored value is not a record
	// (naming its key); such a record trusts nothing.
	Unparseable string `json:"unparseable,omitempty"`
}

// Trusts reports whether the record lists kid as trusted.
func (r *Record) Trusts(kid string) bool { return r != nil && slices.Contains(r.Trusted, kid) }

// ControllerManagersSigningWith returns, sorted, the hosts whose record
// says their kube-controller-manager signs with kid.
func ControllerManagersSigningWith(recs map[string]Record, kid string) []string {
	return hostsWhere(recs, kid, func(r Record) string { return r.ControllerManagerSigning })
}

// APIServersSigningWith returns, sorted, the hosts whose record says their
// apiserver (or, in signer mode, their signer) signs with kid.
func APIServersSigningWith(recs map[string]Record, kid string) []string {
	return hostsWhere(recs, kid, func(r Record) string { return r.Signing })
}

// hostsWhere returns, sorted, the hosts whose record's field is kid.
func hostsWhere(recs map[string]Record, kid string, field func(Record) string) []string {
	var hosts []string
	for h, r := range recs {
		if kid != "" && field(r) == kid {
			hosts = append(hosts, h)
		}
	}
	slices.Sort(hosts)
	return hosts
}

// Key is the etcd key of host's record under prefix.
func Key(prefix, host string) string { return etcdkey.Join(prefix, host) }

// FromFiles computes the record of an apiserver that reads its
// service-account keys from keyFiles and signs with signingKey ("" when
// unknown). The files are read once, now: call it at the restart, so that the
// record describes what the apiserver loaded, not what the files hold later.
// Key IDs are computed from the parsed key, so the record names no secret.
func FromFiles(host string, keyFiles []string, signingKey string, now time.Time) (Record, error) {
	r := Record{Host: host, Time: now.UTC(), Trusted: []string{}}
	if len(keyFiles) == 0 {
		return r, fmt.Errorf("no service-account key file to record trust from")
	}
	sum := sha256.New()
	for _, path := range keyFiles {
		data, err := os.ReadFile(path)
		if err != nil {
			return r, fmt.Errorf("trust record: %w", err)
		}
		sum.Write(data)
		kids, err := apiServerKeyIDs(path, data)
		if err != nil {
			return r, fmt.Errorf("trust record: %w", err)
		}
		for _, kid := range kids {
			if !slices.Contains(r.Trusted, kid) {
				r.Trusted = append(r.Trusted, kid)
			}
		}
	}
	r.BundleSHA256 = hex.EncodeToString(sum.Sum(nil))
	if signingKey != "" {
		kids, err := FileKeyIDs(signingKey)
		if err != nil {
			return r, fmt.Errorf("trust record: signing key: %w", err)
		}
		if len(kids) != 1 {
			return r, fmt.Errorf("trust record: signing key %s holds %d keys, want 1", signingKey, len(kids))
		}
		r.Signing = kids[0]
	}
	return r, nil
}

// BundleKeyIDs returns the key IDs of the keys kube-apiserver loads from a
// --service-account-key-file (a bundle), in file order: the keys a trust
// record written from it would list.
func BundleKeyIDs(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return apiServerKeyIDs(path, data)
}

// apiServerKeyIDs is exactly the keys kube-apiserver's reader takes from
// data, by the same rules check and preflight use, without duplicates.
func apiServerKeyIDs(path string, data []byte) ([]string, error) {
	var out []string
	for _, k := range pemcheck.APIServerKeys(data) {
		kid, err := pemcheck.KeyID(k.Public)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, k.Line, err)
		}
		if !slices.Contains(out, kid) {
			out = append(out, kid)
		}
	}
	return out, nil
}

// FileKeyIDs returns the key IDs of the keys in a PEM file: a public key's,
// or a private key's public half. Certificates are skipped.
func FileKeyIDs(path string) ([]string, error) {
	f, err := pemcheck.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return keyIDs(f)
}

// keyIDs returns the key IDs of the blocks kube-apiserver's
// service-account key reader takes (client-go keyutil.ParsePublicKeysPEM):
// RSA and ECDSA public keys, certificates and private keys, but not PKCS#1
// "RSA PUBLIC KEY" blocks; an error when there is none. A file that
// preflight let through holds nothing else.
func keyIDs(f *pemcheck.File) ([]string, error) {
	var out []string
	for _, b := range f.Blocks {
		if b.Public == nil || (b.Kind != pemcheck.PrivateKey && b.Encoding == pemcheck.PKCS1) {
			continue
		}
		switch b.Public.(type) {
		case *rsa.PublicKey, *ecdsa.PublicKey:
		default:
			continue
		}
		kid, err := pemcheck.KeyID(b.Public)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", f.Name, b, err)
		}
		if !slices.Contains(out, kid) {
			out = append(out, kid)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no RSA or ECDSA key", f.Name)
	}
	return out, nil
}

// ErrLockGone is Put finding the lock key gone: the record is not written.
var ErrLockGone = errors.New("the restart lock is no longer held")

// Put writes r as host r.Host's record under prefix, in a transaction that
// requires lockKey (the restart lock this host holds) to still exist: a
// helper whose lock was lost (lease expired, key deleted) while its
// apiserver came up must not record what another host's restart may now
// be changing. An empty lockKey writes unconditionally.
func Put(ctx context.Context, kv clientv3.KV, prefix, lockKey string, r Record) error {
	r.Revision, r.Unparseable = 0, ""
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := Key(prefix, r.Host)
	var cmps []clientv3.Cmp
	if lockKey != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(lockKey), ">", 0))
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(clientv3.OpPut(key, string(data))).Commit()
	if err != nil {
		return fmt.Errorf("write trust record %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("write trust record %s: %w (lock key %s is gone)", key, ErrLockGone, lockKey)
	}
	return nil
}

// decode parses a stored record; a value that is not one yields a record
// that trusts nothing, so that a garbled record reads as "stale", never as
// "trusted", and says so, naming its key (never its value).
func decode(key, host string, value []byte, rev int64) Record {
	var r Record
	err := json.Unmarshal(value, &r)
	if err == nil && r.Host == "" {
		err = errors.New("no host")
	}
	if err != nil {
		r = Record{Unparseable: fmt.Sprintf("unparseable trust record %s (%v): it is replaced at the host's next successful restart; `etcdctl del %s` removes it", key, err, key)}
	}
	r.Host = host
	r.Revision = rev
	return r
}

// List returns every record under prefix, by host, and the revision read
// (with opts: Collect reads at its revision). A key deeper than
// PREFIX/HOST is no host's record and is left out.
func List(ctx context.Context, kv clientv3.KV, prefix string, opts ...clientv3.OpOption) (map[string]Record, int64, error) {
	p := etcdkey.Dir(prefix)
	resp, err := kv.Get(ctx, p, append([]clientv3.OpOption{clientv3.WithPrefix()}, opts...)...)
	if err != nil {
		return nil, 0, fmt.Errorf("read trust records %s: %w", p, err)
	}
	out := map[string]Record{}
	for _, ev := range resp.Kvs {
		if host := etcdkey.Host(p, string(ev.Key)); host != "" {
			out[host] = decode(string(ev.Key), host, ev.Value, ev.ModRevision)
		}
	}
	return out, resp.Header.Revision, nil
}
