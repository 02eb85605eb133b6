// Package backends turns a key/value store into snapshots of
// (key → value, revision) and notifications that watched keys changed.
// It knows nothing of templates or files.
package backends

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// StoreClient is what the resource layer needs of a store. A store that
// can be watched (etcd) also has Revision, Watch and Diagnose, as daemon.WatchStore
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
	// WatchStallTimeout is how long a watch waits for any answer, progress
	// requests included, before it reconnects (etcd only); zero: connect's
	// default.
	WatchStallTimeout time.Duration
}

// WatchEvent is one answer of a watch: keys that changed up to Revision,
// or, with no keys, a sign of life at the store's current Revision.
type WatchEvent struct {
	Revision int64
	Keys     []string
	// Changes are the changes behind Keys, with their values, in the
	// order the store made them.
	Changes []Change
	// Whole, when set, is a watched key whose every change (to it and
	// to the keys below it) comes in one range, in revision order: so
	// Changes applied to a read of keys under Whole at a revision below
	// theirs give those keys' state at Revision, without reading again.
	// It is empty when the key is watched as two ranges (as itself and as
	// "key/", for a role granted exactly those), whose answers may be
	// delivered in either order.
	Whole string
	// Resume is the revision up to which every change in the watched
	// ranges has been delivered: a new watch from Resume+1 misses nothing.
	Resume int64
}

// Change is one key's change in a WatchEvent.
type Change struct {
	Key, Value string
	Rev        int64 // the revision that made it
	Deleted    bool
}

// RevisionBehindError means the store answered with a revision lower than
// one it had shown before: it was restored from a snapshot or rebuilt, and
// a watch from the old revision would wait for revisions that may not come
// for a long time. Everything must be read again.
type RevisionBehindError struct {
	Current, Seen int64
}

func (e *RevisionBehindError) Error() string {
	return fmt.Sprintf("etcd is at revision %d, lower than revision %d seen before (restored from a snapshot or rebuilt?)", e.Current, e.Seen)
}

// ErrStalled is wrapped by a watch whose store answered nothing, not even
// a progress request, within the stall timeout: the connection is down or
// the member is stuck, and the client library would retry silently.
var ErrStalled = errors.New("watch stalled")

// ErrCompacted is wrapped by a watch when the store no longer has the
// revisions after the one it was asked to resume from: changes may have
// been missed, so the caller must read everything again and watch from the
// new revision. Test with errors.Is.
var ErrCompacted = errors.New("etcd revision compacted")

// KeyUnder is the one rule every backend uses for whether key belongs to a
// requested key: key is prefix itself or lies below it as a path, so
// "/foo" covers "/foo" and "/foo/x" but never "/foobar". A prefix ending in
// "/" (including "/" itself) covers every key that starts with it, and the
// empty prefix covers everything, as a plain prefix range would.
//
// confd matched with strings.HasPrefix in some backends, so a template asking
// for "/app" silently received "/app-staging/..." as well; that is the bug
// this rule exists to avoid.
func KeyUnder(key, prefix string) bool {
	if prefix == "" || strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(key, prefix)
	}
	return key == prefix || (strings.HasPrefix(key, prefix) && key[len(prefix)] == '/')
}

// KeyUnderAny reports whether key is KeyUnder at least one of prefixes.
func KeyUnderAny(key string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return KeyUnder(key, p) })
}
