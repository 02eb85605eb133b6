package signer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/keytest"
)

// TestKeySetDiff: each change reports the key IDs added and removed, not
// the set; a key another host still serves is not removed; a batch of
// hosts is one change; a new signing key is a change.
func TestKeySetDiff(t *testing.T) {
	sk := mustSigningKey(t, keytest.EC(t))
	ks := NewKeySet(nil, sk)
	var got []Change
	ks.OnDiff = func(c Change) { got = append(got, c) }
	a, b, c := keyOf(t, &keytest.EC(t).PublicKey), keyOf(t, &keytest.EC(t).PublicKey), keyOf(t, &keytest.EC(t).PublicKey)

	ks.SetHost("h1", []Key{a})
	ks.SetHost("h2", []Key{a, b})
	ks.SetHost("h1", nil) // a stays: h2 serves it
	ks.SetHosts(map[string][]Key{"h2": {c}, "h3": {b}})
	ks.SetHost("h3", []Key{b}) // no change
	want := []Change{
		{Added: []string{a.ID}, Signing: sk.KeyID, Keys: 2},
		{Added: []string{b.ID}, Signing: sk.KeyID, Keys: 3},
		{Added: []string{c.ID}, Removed: []string{a.ID}, Signing: sk.KeyID, Keys: 3},
	}
	if !slices.EqualFunc(got, want, sameChange) {
		t.Fatalf("changes %+v, want %+v", got, want)
	}
	if s := ks.Snapshot(); !slices.Equal(s.IDs(), sortedIDs(sk.KeyID, b.ID, c.ID)) {
		t.Fatalf("serving %v", s.IDs())
	}

	got = nil
	sk2 := mustSigningKey(t, keytest.EC(t))
	ks.SetSigning(sk, sk2)
	ks.SetSigning(sk2, sk)
	want = []Change{{Added: []string{sk2.KeyID}, Signing: sk.KeyID, Keys: 4}, {Signing: sk2.KeyID, Keys: 4}}
	if !slices.EqualFunc(got, want, sameChange) {
		t.Fatalf("signing changes %+v, want %+v", got, want)
	}
}

func sameChange(x, y Change) bool {
	return slices.Equal(x.Added, y.Added) && slices.Equal(x.Removed, y.Removed) && x.Signing == y.Signing && x.Keys == y.Keys
}

func sortedIDs(ids ...string) []string { slices.Sort(ids); return ids }

// TestChangeWriter: each change is logged with what it added and removed
// only; the cache is written once Quiet has passed, with every change
// made meanwhile, not at each change.
func TestChangeWriter(t *testing.T) {
	sk := mustSigningKey(t, keytest.EC(t))
	ks := NewKeySet(nil, sk)
	logs := &syncBuffer{}
	log := logrus.New()
	log.SetOutput(logs)
	path := filepath.Join(t.TempDir(), "keys.json")
	m := NewMetrics()
	w := &ChangeWriter{Keys: ks, CacheFile: path, Quiet: 500 * time.Millisecond, Log: log, Metrics: m}
	ks.OnDiff = w.Changed

	keys := make([]Key, 50)
	for i := range keys {
		keys[i] = keyOf(t, &keytest.EC(t).PublicKey)
	}
	burst := func(from, to int) {
		for i := from; i < to; i++ {
			ks.SetHost(fmt.Sprintf("h%d", i), []Key{keys[i]})
		}
	}
	burst(0, 25)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("cache written before the quiet period: %v", err)
	}
	waitCache(t, path, 26)
	first := inode(t, path)
	burst(25, 50)
	if inode(t, path) != first {
		t.Fatal("cache rewritten at a change, before the quiet period")
	}
	waitCache(t, path, 51)
	if n := metricValue(t, m, "kube_apiserver_sa_signer_keys", "", ""); n != 51 {
		t.Errorf("keys gauge %v after the write, want 51", n)
	}

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d log lines for 50 changes:\n%s", len(lines), logs)
	}
	last := lines[49]
	if !strings.Contains(last, keys[49].ID) || strings.Contains(last, keys[0].ID) {
		t.Errorf("the last change's line names more than the key it added: %s", last)
	}
}

func waitCache(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := ReadCache(path)
		if err == nil && c != nil && len(c.IDs) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cache %s: %v, want %d keys", path, err, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
