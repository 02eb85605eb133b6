// Package backends turns a key/value store into snapshots of
// (key → value, revision) and notifications that watched keys changed.
// It knows nothing of templates or files.
package backends

import (
	"context"
	"time"

	"github.com/keysync/confd/backends/etcdv3"
	"github.com/keysync/confd/backends/internal/keypath"
)

// StoreClient is what the resource layer needs of a store. A store that
// can be watched (etcd) also has Revision and Watch, as daemon.WatchStore
// names them; the others are polled with -interval.
type StoreClient interface {
	// GetValues returns every key equal to, or below (as a path: "/foo"
	// matches "/foo/x", never "/foobar"), one of keys, all read at one
	// revision. The revision is 0 for stores that have none.
	GetValues(ctx context.Context, keys []string) (map[string]string, int64, error)
	// Close releases connections.
	Close() error
}

// Config selects and configures a store; field names follow confd's flags.
type Config struct {
	Backend        string // "etcdv3" (alias "etcd"), "env" or "file"
	Nodes          []string
	Scheme         string // for nodes found through SRV records: http or https
	SRVDomain      string
	SRVRecord      string
	ClientCert     string
	ClientKey      string
	ClientCAKeys   string
	ClientInsecure bool
	BasicAuth      bool
	Username       string
	Password       string
	YAMLFiles      []string // file backend
	Filter         string   // file backend: glob applied to names under directories in YAMLFiles
	DialTimeout    time.Duration
	RequestTimeout time.Duration
}

// WatchEvent is one answer of a watch: keys changed up to Revision, or,
// without keys, a sign of life; Resume is where a new watch may resume.
type WatchEvent = etcdv3.WatchEvent

// Change is one key's change in a WatchEvent, with its value.
type Change = etcdv3.Change

// RevisionBehindError reports a store whose revision went backwards
// (restored from a snapshot): everything must be read again.
type RevisionBehindError = etcdv3.RevisionBehindError

// ErrStalled is wrapped by a watch that got no answer to its probes.
var ErrStalled = etcdv3.ErrStalled

// KeyUnder is the one rule for whether key belongs to a requested key: as a
// path, so "/foo" covers "/foo/x" but never "/foobar".
func KeyUnder(key, prefix string) bool { return keypath.Under(key, prefix) }
