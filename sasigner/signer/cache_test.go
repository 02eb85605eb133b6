package signer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keysync/confd/internal/keytest"
)

func TestCacheRoundTrip(t *testing.T) {
	sk := mustSigningKey(t, keytest.EC(t))
	ks := NewKeySet(nil, sk)
	ks.SetHost("h1", []Key{keyOf(t, &keytest.RSA(t, 2048).PublicKey)})
	path := filepath.Join(t.TempDir(), "keys.json")
	if c, err := ReadCache(path); c != nil || err != nil {
		t.Fatalf("missing cache: %v, %v; want nothing, no error", c, err)
	}
	want := ks.Cache()
	if err := want.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCache(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(want.Time) || !slices.Equal(got.IDs, want.IDs) || len(got.Hosts["h1"]) != 1 {
		t.Fatalf("read back %+v, want %+v", got, want)
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "PRIVATE") {
		t.Fatal("cache holds private material")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left beside the cache: %v", entries)
	}
}

// TestCacheRefusesTampering: a cached key whose DER does not hash to its
// ID, or a damaged file, is refused rather than served.
func TestCacheRefusesTampering(t *testing.T) {
	k1, k2 := keyOf(t, &keytest.RSA(t, 2048).PublicKey), keyOf(t, &keytest.EC(t).PublicKey)
	dir := t.TempDir()
	for name, c := range map[string]*Cache{
		"swapped": {Version: cacheVersion, Time: time.Now(), Hosts: map[string][]Key{"h1": {{ID: k1.ID, DER: k2.DER}}}},
		"version": {Version: 99, Time: time.Now()},
		"no time": {Version: cacheVersion},
	} {
		p := filepath.Join(dir, name)
		data, _ := json.Marshal(c)
		_ = os.WriteFile(p, data, 0o644)
		if _, err := ReadCache(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: err = %v, want one naming %s", name, err, p)
		}
	}
	p := filepath.Join(dir, "truncated")
	_ = os.WriteFile(p, []byte(`{"version":1,"ti`), 0o644)
	if _, err := ReadCache(p); err == nil {
		t.Error("truncated cache accepted")
	}
}
