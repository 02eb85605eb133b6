// Package keystate is one host's published service-account key set in etcd
// and its lifecycle record. A host's value (KEYS-PREFIX/HOST, concatenated
// PEM public keys sorted by key ID, what confd renders into the bundle) is
// always its current keys, plus the keys it superseded, minus the keys
// retired; the record (RECORD-PREFIX/HOST/kept) says which keys are
// superseded (with their PEM, so that any writer can rebuild the value) and
// which are retired (tombstones: never written into a value again). Both
// are written together by one compare-and-swap, so that concurrent writers
// (publish-key, rotate-key, retire-keys on any master) never lose each
// other's changes. A key leaves a value only by retirement.
//
// The merge rules are pure functions of a State (Publish, Supersede,
// Retire), tested without etcd; Store reads and writes them.
package keystate

import (
	"bytes"
	"cmp"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/keysync/confd/internal/pemcheck"
)

// Item is one key (or certificate) of a published value.
type Item struct {
	KID string
	PEM []byte
}

// ParseValue reads a published value (or a file to publish) the way it is
// compared and written: each key re-encoded as PKIX "PUBLIC KEY" (LF, 64
// columns), a certificate as its key unless keepCerts (then re-armoured as
// it is), sorted by key ID. A private key is an error that never quotes it.
func ParseValue(name string, data []byte, keepCerts bool) ([]Item, error) {
	f, err := pemcheck.Parse(name, data)
	if err != nil {
		return nil, err
	}
	var out []Item
	seen := map[string]bool{}
	for _, b := range f.Blocks {
		switch {
		case b.Kind == pemcheck.PrivateKey:
			return nil, fmt.Errorf("%s %s: %w: a private key must never be published", name, b, pemcheck.ErrPrivateKey)
		case b.Public == nil:
			continue // EC PARAMETERS beside a key
		}
		kid, err := pemcheck.KeyID(b.Public)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		it := Item{KID: kid}
		if b.Cert != nil && keepCerts {
			it.PEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Cert.Raw})
		} else if it.PEM, err = pemcheck.PublicPEM(b.Public); err != nil {
			return nil, fmt.Errorf("%s %s: %w", name, b, err)
		}
		id := kid
		if keepCerts {
			id = string(it.PEM)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, it)
	}
	SortItems(out)
	return out, nil
}

// SortItems sorts by key ID (then bytes): the value's one order, so that
// every writer produces the same bytes for the same keys.
func SortItems(items []Item) {
	slices.SortStableFunc(items, func(a, b Item) int {
		return cmp.Or(strings.Compare(a.KID, b.KID), bytes.Compare(a.PEM, b.PEM))
	})
}

// Join is the value holding items, in their order.
func Join(items []Item) []byte {
	var out []byte
	for _, it := range items {
		out = append(out, it.PEM...)
	}
	return out
}

// KIDs lists items' key IDs, each once, in order.
func KIDs(items []Item) []string {
	var out []string
	for _, it := range items {
		if !slices.Contains(out, it.KID) {
			out = append(out, it.KID)
		}
	}
	return out
}

// Superseded is a key that left the host's current keys and stays
// published until retire-keys after RetireAfter. RetireAfter is fixed when
// the key is superseded (from that command's --grace), never recomputed.
type Superseded struct {
	Since       time.Time `json:"since"`
	RetireAfter time.Time `json:"retire_after"`
	// PEM is the public key (or certificate) as it was published: what
	// puts the key back into a value an operator's edit lost.
	PEM string `json:"pem,omitempty"`
	// By is the command that superseded it (publish-key, rotate-key).
	By string `json:"by,omitempty"`
}

// Record is one host's key lifecycle record. It holds public keys only.
type Record struct {
	Host       string                `json:"host"`
	Superseded map[string]Superseded `json:"superseded,omitempty"`
	// Retired are tombstones: key ID -> when it was retired. No writer
	// puts a retired key into any value again.
	Retired map[string]time.Time `json:"retired,omitempty"`
	// Forgotten is when forget-host removed the host from the fleet (zero:
	// a member). Its keys stay published as superseded until retire-keys
	// retires them, and then its value goes; the record stays, its
	// tombstones still refusing the old keys. Trust waits, the fleet check
	// and the signer's barrier leave a forgotten host out; publish-key under
	// its name (a new host of the same name) makes it a member again.
	Forgotten time.Time `json:"forgotten,omitzero"`
	// Keep is the record publish-key --certificate wrote before this
	// package (key ID -> retire after, the PEM in the value): read, folded
	// into Superseded, never written.
	Keep map[string]time.Time `json:"keep,omitempty"`
}

// Legacy names the writer of a superseded key read from the old `keep`
// record.
const Legacy = "publish-key --certificate (before keystate)"

// parseRecord reads a stored record, folding the legacy keep map into
// Superseded with the PEM from the host's current value (items).
func parseRecord(key, host string, data []byte, items []Item) (Record, error) {
	rec := Record{Host: host}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &rec); err != nil {
			return Record{}, fmt.Errorf("%s: not a key record (%v): fix or delete it (etcdctl del %s), then run the command again", key, err, key)
		}
	}
	rec.Host = cmp.Or(rec.Host, host)
	rec = rec.clone()
	for kid, until := range rec.Keep {
		_, sup := rec.Superseded[kid]
		if _, gone := rec.Retired[kid]; sup || gone {
			continue
		}
		it, _ := find(items, kid) // no PEM when the value lacks it
		rec.Superseded[kid] = Superseded{RetireAfter: until, PEM: string(it.PEM), By: Legacy}
	}
	rec.Keep = nil
	return rec, nil
}

func (r Record) clone() Record {
	c := r
	c.Superseded, c.Retired = map[string]Superseded{}, map[string]time.Time{}
	maps.Copy(c.Superseded, r.Superseded)
	maps.Copy(c.Retired, r.Retired)
	return c
}

// supersede marks kid (published as pem) superseded since now, retired
// after retireAfter, unless it is retired or already superseded (the first
// time stands). r is a clone: its maps are its own.
func (r Record) supersede(kid string, pem []byte, by string, now, retireAfter time.Time) {
	_, gone := r.Retired[kid]
	if _, ok := r.Superseded[kid]; !ok && !gone {
		r.Superseded[kid] = Superseded{Since: now.UTC(), RetireAfter: retireAfter.UTC(), PEM: string(pem), By: by}
	}
}

// empty reports whether the record says nothing worth storing.
func (r Record) empty() bool {
	return len(r.Superseded) == 0 && len(r.Retired) == 0 && r.Forgotten.IsZero()
}

// State is one host's value (as items) and record, read at one revision.
type State struct {
	Host   string
	Items  []Item
	Record Record
	// ValueErr says why the stored value does not parse (it is then
	// treated as holding no key; only Publish replaces it).
	ValueErr error

	valueRev, recordRev int64
	value, recordRaw    []byte
}

// RetiredError refuses to publish keys that were all retired.
type RetiredError struct {
	Host string
	KIDs []string
}

func (e *RetiredError) Error() string {
	return fmt.Sprintf("%s: key(s) %s were retired (tombstoned in the key record) and are never published again: publish the host's current key (generate a new pair if these are all it has)",
		e.Host, strings.Join(e.KIDs, ", "))
}

// ErrRetired is what RetiredError matches with errors.Is.
var ErrRetired = errors.New("key retired")

// Is makes errors.Is(err, ErrRetired) true.
func (e *RetiredError) Is(target error) bool { return target == ErrRetired }

func find(items []Item, kid string) (Item, bool) {
	for _, it := range items {
		if it.KID == kid {
			return it, true
		}
	}
	return Item{}, false
}

// build is the value rule: current ∪ superseded − retired, sorted. A
// superseded key the current items lack comes back from its PEM.
func (s State) build(current []Item) []Item {
	var out []Item
	have := map[string]bool{}
	for _, it := range current {
		if _, gone := s.Record.Retired[it.KID]; gone {
			continue
		}
		have[it.KID] = true
		out = append(out, it)
	}
	for kid, sup := range s.Record.Superseded {
		if _, gone := s.Record.Retired[kid]; gone || have[kid] || sup.PEM == "" {
			continue
		}
		items, err := ParseValue(s.Host+" superseded "+kid, []byte(sup.PEM), true)
		if err != nil || len(items) != 1 || items[0].KID != kid {
			continue // a record edited by hand: the key cannot be rebuilt
		}
		have[kid] = true
		out = append(out, items[0])
	}
	SortItems(out)
	return out
}

// Publish makes source the host's current keys: every key of the current
// value that source lacks becomes superseded (since now, retired after
// now+grace; a key already superseded keeps its time), keys already
// superseded stay so (a source that still holds them does not restart
// their grace), retired keys are left out. A source that holds only
// retired keys is refused with a *RetiredError.
func (s State) Publish(source []Item, by string, now time.Time, grace time.Duration) (State, []string, error) {
	next := s
	next.Record = s.Record.clone()
	var dropped []string
	var keep []Item
	for _, it := range source {
		if _, gone := next.Record.Retired[it.KID]; gone {
			if !slices.Contains(dropped, it.KID) {
				dropped = append(dropped, it.KID)
			}
			continue
		}
		keep = append(keep, it)
	}
	if len(keep) == 0 && len(dropped) > 0 {
		return s, dropped, &RetiredError{Host: s.Host, KIDs: dropped}
	}
	for _, it := range s.Items {
		if _, ok := find(keep, it.KID); !ok {
			next.Record.supersede(it.KID, it.PEM, by, now, now.Add(grace))
		}
	}
	// Publishing under a forgotten name is a new host of that name.
	next.Record.Forgotten = time.Time{}
	next.Items = next.build(keep)
	return next, dropped, nil
}

// Forget is forget-host: every current key of the value becomes superseded
// (since now, retired after now+grace; a key already superseded keeps its
// time) and the record says the host is gone since now (a second forget
// keeps the first time). The value keeps every key until retire-keys.
func (s State) Forget(by string, now time.Time, grace time.Duration) State {
	next := s
	next.Record = s.Record.clone()
	for _, it := range s.Items {
		next.Record.supersede(it.KID, it.PEM, by, now, now.Add(grace))
	}
	if next.Record.Forgotten.IsZero() {
		next.Record.Forgotten = now.UTC()
	}
	next.Items = next.build(s.Items)
	return next
}

// Supersede records that kid stopped being a current key (rotate-key's
// install: its previous key), retired after retireAfter unless already
// superseded (the first time stands), and that resumed ("" none) is a
// current key again (rotate-key --rollback), refused when it was retired.
func (s State) Supersede(kid string, retireAfter time.Time, by, resumed string, now time.Time) (State, error) {
	next := s
	next.Record = s.Record.clone()
	if resumed != "" {
		if _, gone := s.Record.Retired[resumed]; gone {
			return s, &RetiredError{Host: s.Host, KIDs: []string{resumed}}
		}
		delete(next.Record.Superseded, resumed)
	}
	if kid != "" {
		it, _ := find(s.Items, kid)
		next.Record.supersede(kid, it.PEM, by, now, retireAfter)
	}
	next.Items = next.build(s.Items)
	return next, nil
}

// Retire tombstones kids: they leave the value and the superseded list,
// and no writer publishes them again. A value that would hold no key is
// refused, but a forgotten host's: its value goes with its last key
// (Store.Update deletes it).
func (s State) Retire(kids []string, now time.Time) (State, error) {
	next := s
	next.Record = s.Record.clone()
	for _, kid := range kids {
		delete(next.Record.Superseded, kid)
		if _, ok := next.Record.Retired[kid]; !ok {
			next.Record.Retired[kid] = now.UTC()
		}
	}
	next.Items = next.build(s.Items)
	if len(next.Items) == 0 && len(s.Items) > 0 && s.Record.Forgotten.IsZero() {
		return s, fmt.Errorf("%s: retiring %s would leave no key published: not retiring (publish the host's current key first)", s.Host, strings.Join(kids, ", "))
	}
	return next, nil
}

// Stored reports whether etcd holds anything of the host: a value or a
// record. A host with neither (removed by forget-host, or newer than the
// snapshot etcd was restored from) has no value a tombstone must keep a
// key out of.
func (s State) Stored() bool { return s.valueRev != 0 || s.recordRev != 0 }

// KeepRetired writes back tombstones a restore (or a record deleted by
// mistake) lost: each of retired (key ID -> when it was retired) missing
// from the record is added with its original time, and the key leaves the
// superseded list and the value. Unlike Retire it never refuses: a retired
// key may be compromised, and a value that would hold no key is better
// than one holding it (the host's publisher publishes its current key).
// added lists, sorted, the tombstones it wrote back.
func (s State) KeepRetired(retired map[string]time.Time) (next State, added []string) {
	next = s
	next.Record = s.Record.clone()
	for kid, at := range retired {
		if _, ok := next.Record.Retired[kid]; ok {
			continue
		}
		next.Record.Retired[kid] = at.UTC()
		delete(next.Record.Superseded, kid)
		added = append(added, kid)
	}
	slices.Sort(added)
	next.Items = next.build(s.Items)
	return next, added
}
