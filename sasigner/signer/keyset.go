package signer

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/pemcheck"
)

// Key is one verification key as FetchKeys serves it.
type Key struct {
	ID  string `json:"kid"`
	DER []byte `json:"der"` // PKIX
}

// Snapshot is the key set served at one moment. It is never modified once
// published: readers share it without locks.
type Snapshot struct {
	Keys []Key // sorted by ID, no duplicates
	// Time is when the set of key IDs last changed: FetchKeys'
	// data_timestamp. kube-apiserver treats a new timestamp as a new set
	// (keycache.keysChanged), so it moves only when the IDs do.
	Time time.Time
	// Signing is the ID of the key Sign uses.
	Signing string
}

// IDs returns the snapshot's key IDs in order.
func (s *Snapshot) IDs() []string {
	ids := make([]string, len(s.Keys))
	for i, k := range s.Keys {
		ids[i] = k.ID
	}
	return ids
}

// ParsePublished reads one published value (the PEM a host writes under
// KEYS-PREFIX/HOST) as the bundle confd renders from the same values does
// (template publicKeys, then `check --public-only`): every public key,
// PKCS#1 "RSA PUBLIC KEY" included, re-encoded as PKIX; a certificate gives
// its key (issue 24: a certificate is key material, and its key stays
// trusted after it expires until it is retired); a private key, a key
// kube-apiserver cannot verify with (not RSA or ECDSA), or a value with no
// key refuses the whole value. name (the etcd key) is used in errors, which
// never quote the value.
//
// A certificate authority's key (pemcheck.CAs: a CA certificate published
// after the leaf it issued, `cat leaf.crt ca.crt`) is dropped and the rest
// of the value served, as publicKeys does: kube-apiserver trusts every key
// the signer serves, so the CA's key would let whoever holds the CA's
// private key mint tokens every apiserver accepts (issue 34). A renewal's
// two leaves are two keys, both served.
func ParsePublished(name string, value []byte) ([]Key, error) {
	return parsePublished(name, value, "", nil)
}

// parsePublished is ParsePublished logging each block dropped to log (nil:
// silent), with host quoted: it comes from etcd, and a name with a newline
// must not forge a log line.
func parsePublished(name string, value []byte, host string, log logrus.FieldLogger) ([]Key, error) {
	f, err := pemcheck.Parse(name, value)
	if err != nil {
		return nil, err
	}
	cas := f.CAs()
	ca := map[int]bool{}
	for _, c := range cas {
		ca[c.Block.Index] = true
	}
	var out []Key
	for _, b := range f.Blocks {
		if b.Kind == pemcheck.PrivateKey {
			return nil, fmt.Errorf("%s %s: %w: a private key must never be published", name, b, pemcheck.ErrPrivateKey)
		}
		if b.Public == nil || ca[b.Index] {
			continue // EC PARAMETERS, or a CA's key
		}
		switch pub := b.Public.(type) {
		case *rsa.PublicKey:
		case *ecdsa.PublicKey:
			if n := pub.Curve.Params().Name; n != "P-256" && n != "P-384" && n != "P-521" {
				return nil, fmt.Errorf("%s %s: ECDSA curve %s: kube-apiserver verifies P-256, P-384 and P-521", name, b, n)
			}
		default:
			return nil, fmt.Errorf("%s %s: %T: kube-apiserver verifies RSA and ECDSA keys only", name, b, b.Public)
		}
		k, err := newKey(b.Public)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		if !slices.ContainsFunc(out, func(o Key) bool { return o.ID == k.ID }) {
			out = append(out, k)
		}
	}
	if len(out) == 0 && len(cas) > 0 {
		return nil, fmt.Errorf("%s %s: %w: %s, and the value holds no other key", name, cas[0].Block, pemcheck.ErrCA, cas[0].Reason)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w", name, pemcheck.ErrNoKey)
	}
	// Logged once the value is accepted: a refused value is logged as such.
	for _, c := range cas {
		if log != nil {
			log.WithField("key", name).Warnf("host %q published a certificate authority's key in %s: %s: not served (its holder could mint tokens every apiserver accepts); the value's other keys are", host, c.Block, c.Reason)
		}
	}
	return out, nil
}

func newKey(pub crypto.PublicKey) (Key, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return Key{}, err
	}
	id, err := pemcheck.KeyID(pub)
	if err != nil {
		return Key{}, err
	}
	return Key{ID: id, DER: der}, nil
}

// KeySet holds what FetchKeys serves: the keys every host published, each
// host's last good value, and the local signing key(s), and publishes a new
// Snapshot when the set of key IDs changes.
type KeySet struct {
	mu    sync.Mutex
	hosts map[string][]Key
	// signer signs (nil: none may yet, see Service.Sign); it and extra
	// are served.
	signer *SigningKey
	extra  []*SigningKey
	cur    *Snapshot
	now    func() time.Time
	// onChange is called, outside mu, with every new snapshot.
	onChange func(*Snapshot)
}

// NewKeySet starts a set that signs with signer (nil: not yet) and serves
// it and extra, with no published keys. Start it from a cache with Restore.
func NewKeySet(now func() time.Time, signer *SigningKey, extra ...*SigningKey) *KeySet {
	if now == nil {
		now = time.Now
	}
	ks := &KeySet{hosts: map[string][]Key{}, signer: signer, extra: extra, now: now}
	ks.cur = ks.build(nil)
	return ks
}

// OnChange sets the function called with each new snapshot (once a change
// is published, in order).
func (ks *KeySet) OnChange(f func(*Snapshot)) {
	ks.mu.Lock()
	ks.onChange = f
	ks.mu.Unlock()
}

// Snapshot returns the set served now.
func (ks *KeySet) Snapshot() *Snapshot {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.cur
}

// Signer returns the key Sign uses now; nil while none may sign.
func (ks *KeySet) Signer() *SigningKey {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.signer
}

// Hosts returns a copy of the published keys by host.
func (ks *KeySet) Hosts() map[string][]Key {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	out := make(map[string][]Key, len(ks.hosts))
	for h, k := range ks.hosts {
		out[h] = slices.Clone(k)
	}
	return out
}

// Restore seeds the set from a cache: the hosts' keys, and the time the
// cached set of IDs was current, kept if the set built now has the same IDs
// (a restart changes nothing the apiserver sees).
func (ks *KeySet) Restore(hosts map[string][]Key, ids []string, at time.Time) {
	ks.mu.Lock()
	ks.hosts = map[string][]Key{}
	for h, k := range hosts {
		ks.hosts[h] = slices.Clone(k)
	}
	prev := &Snapshot{Time: at}
	for _, id := range ids {
		prev.Keys = append(prev.Keys, Key{ID: id})
	}
	ks.cur = ks.build(prev)
	ks.mu.Unlock()
}

// Replace sets every host's keys at once (a full read of the prefix).
// Hosts absent from hosts are dropped: their key was withdrawn.
func (ks *KeySet) Replace(hosts map[string][]Key) {
	ks.update(func() {
		ks.hosts = map[string][]Key{}
		for h, k := range hosts {
			ks.hosts[h] = slices.Clone(k)
		}
	})
}

// SetHost sets one host's keys; nil or empty removes the host.
func (ks *KeySet) SetHost(host string, keys []Key) {
	ks.update(func() {
		if len(keys) == 0 {
			delete(ks.hosts, host)
			return
		}
		ks.hosts[host] = slices.Clone(keys)
	})
}

// SetSigning makes signer sign (nil: none) and serves it and extra.
func (ks *KeySet) SetSigning(signer *SigningKey, extra ...*SigningKey) {
	ks.update(func() { ks.signer, ks.extra = signer, extra })
}

func (ks *KeySet) update(f func()) {
	ks.mu.Lock()
	f()
	next := ks.build(ks.cur)
	changed := next != ks.cur
	ks.cur = next
	cb := ks.onChange
	ks.mu.Unlock()
	if changed && cb != nil {
		cb(next)
	}
}

// build computes the snapshot from hosts and signing keys; it returns prev
// itself when nothing served changed. Called with mu held.
func (ks *KeySet) build(prev *Snapshot) *Snapshot {
	byID := map[string]Key{}
	for _, keys := range ks.hosts {
		for _, k := range keys {
			byID[k.ID] = k
		}
	}
	for _, s := range append([]*SigningKey{ks.signer}, ks.extra...) {
		if s != nil {
			byID[s.KeyID] = Key{ID: s.KeyID, DER: s.PublicDER}
		}
	}
	next := &Snapshot{Keys: make([]Key, 0, len(byID))}
	if ks.signer != nil {
		next.Signing = ks.signer.KeyID
	}
	for _, k := range byID {
		next.Keys = append(next.Keys, k)
	}
	sort.Slice(next.Keys, func(i, j int) bool { return next.Keys[i].ID < next.Keys[j].ID })
	if prev != nil && sameIDs(prev.Keys, next.Keys) {
		if prev.Signing == next.Signing && sameDER(prev.Keys, next.Keys) {
			return prev
		}
		next.Time = prev.Time
		return next
	}
	next.Time = ks.now().UTC()
	return next
}

func sameIDs(a, b []Key) bool {
	return slices.EqualFunc(a, b, func(x, y Key) bool { return x.ID == y.ID })
}

// sameDER is false when a restored snapshot (IDs only) meets real keys:
// the keys are then published, with the restored time.
func sameDER(a, b []Key) bool {
	return slices.EqualFunc(a, b, func(x, y Key) bool { return bytes.Equal(x.DER, y.DER) })
}

// checkKey checks that k's DER is an RSA or ECDSA PKIX public key whose
// Kubernetes key ID is k.ID.
func checkKey(k Key) error {
	pub, err := x509.ParsePKIXPublicKey(k.DER)
	if err != nil {
		return fmt.Errorf("key %s: %w", k.ID, err)
	}
	switch pub.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey:
	default:
		return fmt.Errorf("key %s: %T, want RSA or ECDSA", k.ID, pub)
	}
	id, err := pemcheck.KeyID(pub)
	if err != nil {
		return err
	}
	if id != k.ID {
		return fmt.Errorf("key %s: its key ID is %s", k.ID, id)
	}
	return nil
}

// Cache returns the cache of the set served now, read under one lock so
// that the hosts and the snapshot agree.
func (ks *KeySet) Cache() *Cache {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	hosts := make(map[string][]Key, len(ks.hosts))
	for h, k := range ks.hosts {
		hosts[h] = slices.Clone(k)
	}
	return NewCache(ks.cur, hosts)
}
