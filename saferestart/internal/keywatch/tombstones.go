package keywatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/keysync/confd/internal/atomicfile"
)

// TombstonesFile is the file under --state-dir that keeps every tombstone
// this master has seen.
const TombstonesFile = "tombstones.json"

// tombstones is what a master remembers of every host's retired keys
// (host -> key ID -> when retired), so that a restore of etcd from a
// snapshot older than a retirement cannot bring the key back: a retired
// key may be compromised. Public key IDs only.
type tombstones map[string]map[string]time.Time

// readTombstones reads path; a missing file is an empty set.
func readTombstones(path string) (tombstones, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return tombstones{}, nil
	}
	if err != nil {
		return tombstones{}, fmt.Errorf("read %s: %w", path, err)
	}
	var f struct {
		Hosts tombstones `json:"hosts"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return tombstones{}, fmt.Errorf("%s is not a tombstone file (%v): it is rewritten from etcd's tombstones; remove it if that fails too", path, err)
	}
	if f.Hosts == nil {
		f.Hosts = tombstones{}
	}
	return f.Hosts, nil
}

// write replaces path atomically, making its directory if needed.
func (t tombstones) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("state directory %s: %w", filepath.Dir(path), err)
	}
	data, err := json.MarshalIndent(map[string]tombstones{"hosts": t}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(data, '\n'), 0o644)
}

// add merges more into t and reports whether t changed.
func (t tombstones) add(host string, more map[string]time.Time) bool {
	changed := false
	for kid, at := range more {
		if t[host] == nil {
			t[host] = map[string]time.Time{}
		}
		if _, ok := t[host][kid]; !ok {
			t[host][kid] = at.UTC()
			changed = true
		}
	}
	return changed
}

// missing lists host's tombstones in t that have lacks.
func (t tombstones) missing(host string, has map[string]time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for kid, at := range t[host] {
		if _, ok := has[kid]; !ok {
			out[kid] = at
		}
	}
	return out
}
