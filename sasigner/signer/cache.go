package signer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keysync/confd/internal/atomicfile"
)

// cacheVersion changes when the cache format does; another version is
// ignored (with a log line), never misread.
const cacheVersion = 1

// Cache is the last good key set, kept on disk so that a signer started
// while etcd is unreachable serves every key it served before, not fewer.
// It holds public keys only.
type Cache struct {
	Version int              `json:"version"`
	Time    time.Time        `json:"time"`              // the snapshot's data_timestamp
	IDs     []string         `json:"kids"`              // every key ID served
	Signing string           `json:"signing,omitempty"` // the key ID that signed (past the trust barrier)
	Hosts   map[string][]Key `json:"hosts"`             // the published keys by host
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

// Write replaces path atomically: a crash leaves the old cache or the new
// one, never a part of either.
func (c *Cache) Write(path string) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("key cache: %w", err)
	}
	return atomicfile.WriteFile(path, append(data, '\n'), 0o644)
}

// ChangeWriter follows a KeySet's changes (KeySet.OnDiff = w.Changed) for
// the command: each change is logged with the key IDs added and removed,
// never the whole set (thousands of hosts would log megabytes per event);
// the metrics and the cache file are brought up to date once Quiet has
// passed after a change, so at most once per Quiet.
type ChangeWriter struct {
	Keys *KeySet
	// CacheFile is written with the set served at the moment of the write.
	CacheFile string
	// Quiet is the wait after a change before the write (0: at once).
	Quiet   time.Duration
	Log     logrus.FieldLogger
	Metrics *Metrics

	mu      sync.Mutex
	pending *time.Timer
	// wmu makes writes one at a time, each of the set served then.
	wmu     sync.Mutex
	failing bool
}

// Changed logs c and schedules the write.
func (w *ChangeWriter) Changed(c Change) {
	l := w.Log.WithField("keys", c.Keys).WithField("signing", c.Signing)
	if len(c.Added) > 0 {
		l = l.WithField("added", c.Added)
	}
	if len(c.Removed) > 0 {
		l = l.WithField("removed", c.Removed)
	}
	l.Info("key set changed")
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == nil {
		w.pending = time.AfterFunc(w.Quiet, w.Flush)
	}
}

// Flush writes the metrics and the cache now (after the first read of
// etcd, so that the cache exists after a first start, and when stopping).
func (w *ChangeWriter) Flush() {
	w.mu.Lock()
	if w.pending != nil {
		w.pending.Stop()
		w.pending = nil
	}
	w.mu.Unlock()
	w.wmu.Lock()
	defer w.wmu.Unlock()
	c := w.Keys.Cache()
	w.Metrics.SetKeys(len(c.IDs), c.Time)
	if err := c.Write(w.CacheFile); err != nil {
		w.Metrics.cacheFails.Inc()
		if !w.failing {
			w.failing = true
			w.Log.WithError(err).Error("key cache not written: a start while etcd is unreachable would serve an older set")
		}
		return
	}
	if w.failing {
		w.failing = false
		w.Log.WithField("file", w.CacheFile).Info("key cache written again")
	}
}

// Close writes a change not yet written.
func (w *ChangeWriter) Close() {
	w.mu.Lock()
	pending := w.pending != nil
	w.mu.Unlock()
	if pending {
		w.Flush()
	}
}
