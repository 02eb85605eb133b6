package signer

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"maps"
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
	Time    time.Time
	Signing string // the ID of the key Sign uses
}

// IDs returns the snapshot's key IDs in order.
func (s *Snapshot) IDs() []string {
	ids := make([]string, len(s.Keys))
	for i, k := range s.Keys {
		ids[i] = k.ID
	}
	return ids
}

// ParsePublished reads one published value (KEYS-PREFIX/HOST) as confd's
// bundle (template publicKeys) reads it: every public key as PKIX, a
// certificate's key even expired; a private key, a key kube-apiserver
// cannot verify with, or no key refuses the value. A certificate
// authority's key (pemcheck's PublishedKeys) is dropped and logged to log
// (nil: silent) with host quoted against forged log lines. Errors name name, never the value.
func ParsePublished(name string, value []byte, host string, log logrus.FieldLogger) ([]Key, error) {
	f, err := pemcheck.Parse(name, value)
	if err != nil {
		return nil, err
	}
	blocks, cas, err := f.PublishedKeys()
	if err != nil {
		return nil, err
	}
	var out []Key
	for _, b := range blocks {
		switch pub := b.Public.(type) {
		case *rsa.PublicKey:
		case *ecdsa.PublicKey:
			if n := pub.Curve.Params().Name; n != "P-256" && n != "P-384" && n != "P-521" {
				return nil, fmt.Errorf("%s %s: ECDSA curve %s: kube-apiserver verifies P-256, P-384 and P-521", name, b, n)
			}
		default:
			return nil, fmt.Errorf("%s %s: %T: kube-apiserver verifies RSA and ECDSA keys only", name, b, b.Public)
		}
		if k := newKey(b.Public); !slices.ContainsFunc(out, func(o Key) bool { return o.ID == k.ID }) {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w", name, pemcheck.ErrNoKey)
	}
	for _, c := range cas { // logged once accepted: a refused value is logged as such
		if log != nil {
			log.WithField("key", name).Warnf("host %q published a certificate authority's key in %s: %s: not served (its holder could mint tokens every apiserver accepts); the value's other keys are", host, c.Block, c.Reason)
		}
	}
	return out, nil
}

// newKey serves pub, an RSA key or an ECDSA key on a named curve: its
// encodings cannot fail.
func newKey(pub crypto.PublicKey) Key {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	id, _ := pemcheck.KeyID(pub)
	return Key{ID: id, DER: der}
}

// KeySet holds what FetchKeys serves: each host's last good keys and the
// local signing key(s). A change costs what it changes, not the set, so
// that thousands of hosts publishing at once converge in linear time: each
// key ID served is counted (hosts and signing keys may share one), and the
// sorted snapshot is built when asked for, once after any number of changes.
type KeySet struct {
	// OnDiff, if set before the set is shared, is called outside the lock
	// and in order with each change of the key IDs served or of the
	// signing key.
	OnDiff func(Change)

	mu    sync.Mutex
	hosts map[string][]Key
	refs  map[string]*keyRef // by key ID, the hosts and signing keys serving it
	// signer signs (nil: none may yet); it and extra are served.
	signer *SigningKey
	extra  []*SigningKey
	// cur is the snapshot last built, stale says refs or the signer
	// changed since, and changed is when the IDs last did.
	cur     *Snapshot
	stale   bool
	changed time.Time
	now     func() time.Time
}

type keyRef struct {
	key Key
	n   int
}

// Change is one change of the set served: the key IDs added and removed
// (sorted), the ID of the key Sign uses ("" while none may), and how many
// key IDs are served.
type Change struct {
	Added, Removed []string
	Signing        string
	Keys           int
}

// NewKeySet starts a set that signs with signer (nil: not yet) and serves
// it and extra, with no published keys. Start it from a cache with Restore.
func NewKeySet(now func() time.Time, signer *SigningKey, extra ...*SigningKey) *KeySet {
	if now == nil {
		now = time.Now
	}
	ks := &KeySet{hosts: map[string][]Key{}, refs: map[string]*keyRef{}, signer: signer, extra: extra, now: now}
	for _, k := range ks.signingKeys() {
		ks.ref(k, nil)
	}
	ks.cur = ks.build(nil, now().UTC())
	return ks
}

// Snapshot returns the set served now.
func (ks *KeySet) Snapshot() *Snapshot {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.snapshotLocked()
}

func (ks *KeySet) snapshotLocked() *Snapshot {
	if ks.stale {
		ks.cur = ks.build(ks.cur, ks.changed)
		ks.stale = false
	}
	return ks.cur
}

// Signer returns the key Sign uses now; nil while none may sign.
func (ks *KeySet) Signer() *SigningKey {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.signer
}

// Hosts returns a copy of the published keys by host. A host's keys are
// replaced, never modified in place, so copies share them.
func (ks *KeySet) Hosts() map[string][]Key {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return maps.Clone(ks.hosts)
}

// Host returns host's published keys, shared: they are never modified.
func (ks *KeySet) Host(host string) []Key {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return ks.hosts[host]
}

// Restore seeds a new set from a cache: the hosts' keys, and the time the
// cached set of IDs was current, kept if the set built now has the same IDs
// (a restart changes nothing the apiserver sees).
func (ks *KeySet) Restore(hosts map[string][]Key, ids []string, at time.Time) {
	ks.mu.Lock()
	for h, k := range hosts {
		ks.setHost(h, k, nil)
	}
	prev := &Snapshot{Time: at}
	for _, id := range ids {
		prev.Keys = append(prev.Keys, Key{ID: id})
	}
	ks.cur, ks.stale = ks.build(prev, ks.now().UTC()), false
	ks.mu.Unlock()
}

func (ks *KeySet) signingKeys() []Key {
	var out []Key
	for _, s := range append([]*SigningKey{ks.signer}, ks.extra...) {
		if s != nil {
			out = append(out, Key{ID: s.KeyID, DER: s.PublicDER})
		}
	}
	return out
}

// SetHosts sets the keys of each host named (nil or empty removes it) in
// one change: a watch response's events, or a full read of the prefix.
func (ks *KeySet) SetHosts(hosts map[string][]Key) {
	ks.update(func(d diff) {
		for h, k := range hosts {
			ks.setHost(h, k, d)
		}
	})
}

// SetSigning makes signer sign (nil: none) and serves it and extra.
func (ks *KeySet) SetSigning(signer *SigningKey, extra ...*SigningKey) {
	ks.update(func(d diff) {
		for _, k := range ks.signingKeys() {
			ks.unref(k.ID, d)
		}
		ks.signer, ks.extra = signer, extra
		for _, k := range ks.signingKeys() {
			ks.ref(k, d)
		}
	})
}

// setHost replaces host's keys, moving the counts of its old and new keys
// only. Called with mu held.
func (ks *KeySet) setHost(host string, keys []Key, d diff) {
	old := ks.hosts[host]
	if sameIDs(old, keys) {
		return
	}
	if len(keys) == 0 {
		delete(ks.hosts, host)
	} else {
		ks.hosts[host] = slices.Clone(keys)
	}
	for _, k := range old {
		ks.unref(k.ID, d)
	}
	for _, k := range keys {
		ks.ref(k, d)
	}
}

// diff records, for each key ID an update touched, whether it was served
// before the update.
type diff map[string]bool

func (d diff) touch(id string, served bool) {
	if d == nil {
		return
	}
	if _, ok := d[id]; !ok {
		d[id] = served
	}
}

func (ks *KeySet) ref(k Key, d diff) {
	r := ks.refs[k.ID]
	d.touch(k.ID, r != nil)
	if r == nil {
		ks.refs[k.ID] = &keyRef{key: k, n: 1}
		return
	}
	r.n++
}

func (ks *KeySet) unref(id string, d diff) {
	r := ks.refs[id]
	if r == nil {
		return
	}
	d.touch(id, true)
	if r.n--; r.n == 0 {
		delete(ks.refs, id)
	}
}

func (ks *KeySet) update(f func(diff)) {
	ks.mu.Lock()
	d := diff{}
	signing := ks.signer.id()
	f(d)
	var c Change
	for id, was := range d {
		switch _, now := ks.refs[id]; {
		case now && !was:
			c.Added = append(c.Added, id)
		case was && !now:
			c.Removed = append(c.Removed, id)
		}
	}
	c.Signing, c.Keys = ks.signer.id(), len(ks.refs)
	changed := len(c.Added)+len(c.Removed) > 0 || c.Signing != signing
	if len(c.Added)+len(c.Removed) > 0 {
		ks.changed = ks.now().UTC()
	}
	ks.stale = ks.stale || changed
	ks.mu.Unlock()
	if changed && ks.OnDiff != nil {
		sort.Strings(c.Added)
		sort.Strings(c.Removed)
		ks.OnDiff(c)
	}
}

// id is the key's ID; "" for none (nil), as while no key may sign.
func (k *SigningKey) id() string {
	if k == nil {
		return ""
	}
	return k.KeyID
}

// build computes the snapshot from the counted keys; it returns prev
// itself when nothing served changed, and keeps prev's time when the IDs
// are prev's. at is the time of a snapshot with other IDs. Called with mu
// held.
func (ks *KeySet) build(prev *Snapshot, at time.Time) *Snapshot {
	next := &Snapshot{Keys: make([]Key, 0, len(ks.refs)), Signing: ks.signer.id()}
	for _, r := range ks.refs {
		next.Keys = append(next.Keys, r.key)
	}
	sort.Slice(next.Keys, func(i, j int) bool { return next.Keys[i].ID < next.Keys[j].ID })
	if prev != nil && sameIDs(prev.Keys, next.Keys) {
		// The DER differs when a restored snapshot (IDs only) meets real
		// keys: the keys are then published, with the restored time.
		if prev.Signing == next.Signing && slices.EqualFunc(prev.Keys, next.Keys, func(x, y Key) bool { return bytes.Equal(x.DER, y.DER) }) {
			return prev
		}
		next.Time = prev.Time
		return next
	}
	next.Time = at
	return next
}

func sameIDs(a, b []Key) bool {
	return slices.EqualFunc(a, b, func(x, y Key) bool { return x.ID == y.ID })
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
	if id, _ := pemcheck.KeyID(pub); id != k.ID { // an RSA or ECDSA key parsed from PKIX encodes again
		return fmt.Errorf("key %s: its key ID is %s", k.ID, id)
	}
	return nil
}

// Cache returns the cache of the set served now, read under one lock so
// that the hosts and the snapshot agree.
func (ks *KeySet) Cache() *Cache {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	s := ks.snapshotLocked()
	return &Cache{Version: cacheVersion, Time: s.Time, IDs: s.IDs(), Signing: s.Signing, Hosts: maps.Clone(ks.hosts)}
}
