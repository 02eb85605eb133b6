package signer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/keysync/confd/internal/atomicfile"
)

// cacheVersion changes when the cache format does; another version is
// ignored (with a log line), never misread.
const cacheVersion = 1

// Cache is the last good key set, kept on disk so that a signer started
// while etcd is unreachable serves every key it served before, not fewer.
// It holds public keys only.
type Cache struct {
	Version int `json:"version"`
	// Time is the snapshot's data_timestamp.
	Time time.Time `json:"time"`
	// IDs are every key ID served (published and signing keys).
	IDs []string `json:"kids"`
	// Signing is the key ID that signed (it passed the trust barrier).
	Signing string `json:"signing,omitempty"`
	// Hosts are the published keys by host.
	Hosts map[string][]Key `json:"hosts"`
}

// ReadCache reads path. A missing file is (nil, nil): a first start.
func ReadCache(path string) (*Cache, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("key cache: %w", err)
	}
	var c Cache
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("key cache %s: %w", path, err)
	}
	if c.Version != cacheVersion {
		return nil, fmt.Errorf("key cache %s: version %d, want %d", path, c.Version, cacheVersion)
	}
	// Every cached key is checked as a published one would be: a cache
	// edited by hand or damaged on disk must not add a key.
	for host, keys := range c.Hosts {
		for _, k := range keys {
			if err := checkKey(k); err != nil {
				return nil, fmt.Errorf("key cache %s: host %s: %w", path, host, err)
			}
		}
	}
	if c.Time.IsZero() {
		return nil, fmt.Errorf("key cache %s: no time", path)
	}
	return &c, nil
}

// NewCache returns the cache of snapshot s with hosts' published keys.
func NewCache(s *Snapshot, hosts map[string][]Key) *Cache {
	return &Cache{Version: cacheVersion, Time: s.Time, IDs: s.IDs(), Signing: s.Signing, Hosts: hosts}
}

// Write replaces path atomically: a crash leaves the old cache or the new
// one, never a part of either.
func (c *Cache) Write(path string) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("key cache: %w", err)
	}
	return atomicfile.WriteFile(path, append(data, '\n'), 0o644)
}
