package signer

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
	"github.com/keysync/confd/internal/pemcheck"
)

func TestParsePublished(t *testing.T) {
	rk := keytest.RSA(t, 2048)
	ek := keytest.EC(t)
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	pkcs1Pub := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rk.PublicKey)}))
	sec1 := string(keytest.SEC1PEM(t, ek))
	// An expired certificate: its key stays trusted until retired.
	cert := string(keytest.CertPEM(t, rk, "sa", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour)))
	rkid, ekid := keytest.KeyID(t, &rk.PublicKey), keytest.KeyID(t, &ek.PublicKey)
	for _, tc := range []struct {
		name, value string
		kids        []string
		err         error
		errText     string
	}{
		{"pkix rsa", string(keytest.PublicPEM(t, &rk.PublicKey)), []string{rkid}, nil, ""},
		{"pkix ec", string(keytest.PublicPEM(t, &ek.PublicKey)), []string{ekid}, nil, ""},
		{"two keys, CRLF", strings.ReplaceAll(string(keytest.PublicPEM(t, &rk.PublicKey))+string(keytest.PublicPEM(t, &ek.PublicKey)), "\n", "\r\n"), []string{rkid, ekid}, nil, ""},
		{"duplicate", string(keytest.PublicPEM(t, &rk.PublicKey)) + pkcs1Pub, []string{rkid}, nil, ""},
		{"pkcs1 public key (publicKeys re-encodes it)", pkcs1Pub, []string{rkid}, nil, ""},
		{"expired certificate", cert, []string{rkid}, nil, ""},
		{"private key", sec1, nil, pemcheck.ErrPrivateKey, ""},
		{"public key beside a private key", string(keytest.PublicPEM(t, &rk.PublicKey)) + sec1, nil, pemcheck.ErrPrivateKey, ""},
		{"ed25519", string(keytest.PublicPEM(t, edPriv.Public())), nil, nil, "RSA and ECDSA keys only"},
		{"empty", "", nil, nil, "/keys/h1"},
		{"garbage", "hello", nil, nil, "/keys/h1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := ParsePublished("/keys/h1", []byte(tc.value), "", nil)
			if tc.err != nil || tc.errText != "" {
				if err == nil || (tc.err != nil && !errors.Is(err, tc.err)) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err = %v, want %v / %q", err, tc.err, tc.errText)
				}
				if !strings.Contains(err.Error(), "/keys/h1") {
					t.Errorf("error does not name the etcd key: %v", err)
				}
				if strings.Contains(err.Error(), "PRIVATE KEY-----") || strings.Contains(err.Error(), "MII") {
					t.Errorf("error quotes the value: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.ID)
				if err := checkKey(k); err != nil {
					t.Error(err)
				}
			}
			if !slices.Equal(got, tc.kids) {
				t.Errorf("kids %v, want %v", got, tc.kids)
			}
		})
	}
}

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }

func keyOf(_ testing.TB, pub any) Key { return newKey(pub) }

// TestDataTimestamp pins FetchKeys' data_timestamp: it moves when the set
// of key IDs served changes, and only then (kube-apiserver re-broadcasts its
// keys to its listeners whenever the timestamp differs).
func TestDataTimestamp(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	sk := mustSigningKey(t, keytest.EC(t))
	ks := NewKeySet(c.now, sk)
	var changes []*Snapshot
	ks.OnDiff = func(Change) { changes = append(changes, ks.Snapshot()) }
	s0 := ks.Snapshot()
	if !s0.Time.Equal(c.t) || !slices.Equal(s0.IDs(), []string{sk.KeyID}) || s0.Signing != sk.KeyID {
		t.Fatalf("initial snapshot %v at %s, want only the signing key at %s", s0.IDs(), s0.Time, c.t)
	}

	h1 := keyOf(t, &keytest.EC(t).PublicKey)
	c.add(time.Minute)
	ks.SetHost("h1", []Key{h1})
	s1 := ks.Snapshot()
	if !s1.Time.Equal(c.t) || len(s1.Keys) != 2 || len(changes) != 1 {
		t.Fatalf("after a new host key: %v at %s (%d changes), want 2 keys at %s", s1.IDs(), s1.Time, len(changes), c.t)
	}
	if !slices.IsSortedFunc(s1.Keys, func(a, b Key) int { return strings.Compare(a.ID, b.ID) }) {
		t.Error("keys not sorted by ID: kube-apiserver compares them in order")
	}

	// The same keys again, from another host, or a full re-read with the
	// same content: the set is unchanged, so is its time.
	c.add(time.Minute)
	ks.SetHost("h1", []Key{h1})
	ks.SetHost("h2", []Key{h1, {ID: sk.KeyID, DER: sk.PublicDER}})
	ks.Replace(map[string][]Key{"h1": {h1}})
	if s := ks.Snapshot(); s != s1 || len(changes) != 1 {
		t.Fatalf("unchanged set published again: time %s (%d changes), want %s", s.Time, len(changes), s1.Time)
	}

	// A withdrawn key changes the set.
	c.add(time.Minute)
	ks.Replace(nil)
	if s := ks.Snapshot(); !s.Time.Equal(c.t) || len(s.Keys) != 1 || len(changes) != 2 {
		t.Fatalf("after withdrawal: %v at %s, want 1 key at %s", s.IDs(), s.Time, c.t)
	}

	// A new signing key changes the set and the signer.
	c.add(time.Minute)
	sk2 := mustSigningKey(t, keytest.RSA(t, 2048))
	ks.SetSigning(sk2, sk)
	if s := ks.Snapshot(); !s.Time.Equal(c.t) || len(s.Keys) != 2 || s.Signing != sk2.KeyID || ks.Signer() != sk2 {
		t.Fatalf("after a new signing key: %v signing %s at %s", s.IDs(), s.Signing, s.Time)
	}
	// Same IDs, another key signing: the apiserver sees the same set, so
	// the time stays; the snapshot names the new signer.
	before := ks.Snapshot()
	c.add(time.Minute)
	ks.SetSigning(sk, sk2)
	if s := ks.Snapshot(); !s.Time.Equal(before.Time) || s.Signing != sk.KeyID {
		t.Fatalf("signer swapped within the set: signing %s at %s, want %s at %s", s.Signing, s.Time, sk.KeyID, before.Time)
	}
}

// TestRestoreKeepsTime: a restart that finds the cached set keeps its
// time; one that finds another set (a new signing key) gets a new time.
func TestRestoreKeepsTime(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	sk := mustSigningKey(t, keytest.EC(t))
	h1 := keyOf(t, &keytest.RSA(t, 2048).PublicKey)
	ks := NewKeySet(c.now, sk)
	ks.SetHost("h1", []Key{h1})
	cache := ks.Cache()

	c.add(time.Hour)
	again := NewKeySet(c.now, sk)
	again.Restore(cache.Hosts, cache.IDs, cache.Time)
	if s := again.Snapshot(); !s.Time.Equal(cache.Time) || !slices.Equal(s.IDs(), cache.IDs) {
		t.Fatalf("restored %v at %s, want %v at %s", s.IDs(), s.Time, cache.IDs, cache.Time)
	}
	for _, k := range again.Snapshot().Keys {
		if len(k.DER) == 0 {
			t.Fatalf("restored key %s has no DER", k.ID)
		}
	}
	// The same set read from etcd afterwards changes nothing.
	again.Replace(map[string][]Key{"h1": {h1}})
	if s := again.Snapshot(); !s.Time.Equal(cache.Time) {
		t.Fatalf("re-read of the same set moved the time to %s", s.Time)
	}

	other := NewKeySet(c.now, mustSigningKey(t, keytest.EC(t)))
	other.Restore(cache.Hosts, cache.IDs, cache.Time)
	if s := other.Snapshot(); !s.Time.Equal(c.t) {
		t.Fatalf("restored with another signing key: time %s, want %s", s.Time, c.t)
	}
}

// SetHost sets one host's keys; nil or empty removes the host.
func (ks *KeySet) SetHost(host string, keys []Key) {
	ks.SetHosts(map[string][]Key{host: keys})
}

// Replace sets every host's keys at once, as the Follower's full read of
// the prefix does: hosts absent from hosts are dropped.
func (ks *KeySet) Replace(hosts map[string][]Key) {
	all := map[string][]Key{}
	for h := range ks.Hosts() {
		all[h] = nil
	}
	maps.Copy(all, hosts)
	ks.SetHosts(all)
}
