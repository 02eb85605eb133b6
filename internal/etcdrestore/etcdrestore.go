// Package etcdrestore tells a long-lived etcd reader that the etcd it reads
// is no longer the store it has been following: restored from a snapshot
// (or a copied data directory), rebuilt, or another cluster behind the same
// endpoints. After that, a watch resumed from the reader's own revision
// waits for revisions that may never come, or comes back with changes of a
// different history: the reader must read everything again and watch from
// that read's revision.
//
// Three kinds of evidence, from response headers and compaction errors:
//
//   - the revision went back: a read answered with a revision lower than
//     one seen before (a restore not followed by enough writes);
//   - the cluster ID changed: a restore with a new --initial-cluster-token,
//     a rebuilt cluster, or another cluster behind the endpoints;
//   - compacted past what was seen: the store no longer has the revisions
//     after the last one seen. `etcdutl snapshot restore --bump-revision
//     --mark-compacted` (etcd >= 3.6) leaves every restored store so, which
//     makes every watcher notice, however many writes followed. An
//     ordinary compaction during a long outage looks the same; the re-read
//     it asks for is right either way.
//
// A restore that keeps the cluster ID, is not marked compacted and is
// followed by enough writes to pass the revisions seen before cannot be
// told from an outage; a reader that reads everything again after every
// reconnect still ends up right.
//
// confd's watch (backends/etcdv3), the signer's follower (sasigner/signer)
// and the key publisher (publish-key --watch) share this: one definition
// of what a restore looks like.
package etcdrestore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Header is what a response says about the store it came from. A zero
// field is unknown and not compared.
type Header struct {
	ClusterID uint64
	Revision  int64
}

// HeaderOf is the part of an etcd response header that tells a restore.
func HeaderOf(h *pb.ResponseHeader) Header {
	return Header{ClusterID: h.GetClusterId(), Revision: h.GetRevision()} // zero for nil
}

// Evidence is how a restore was noticed; its string is a metric label.
type Evidence string

const (
	RevisionBack   Evidence = "revision"
	ClusterChanged Evidence = "cluster"
	Compacted      Evidence = "compacted"
)

// Restored is a restore noticed, with what was seen before and now.
type Restored struct {
	Evidence Evidence
	// Seen is the newest header seen before.
	Seen Header
	// Current is the header that told, or for Compacted the oldest
	// revision the store still keeps (0 if not known; its cluster ID
	// unknown).
	Current Header
}

func (r *Restored) Error() string {
	switch r.Evidence {
	case ClusterChanged:
		return fmt.Sprintf("etcd answers with cluster ID %x, not %x as before (restored with a new cluster token, rebuilt, or another cluster behind the endpoints?)", r.Current.ClusterID, r.Seen.ClusterID)
	case Compacted:
		at := ""
		if r.Current.Revision != 0 {
			at = fmt.Sprintf(" at revision %d", r.Current.Revision)
		}
		return fmt.Sprintf("etcd is compacted%s, past revision %d seen before (restored with --mark-compacted, or compacted during an outage)", at, r.Seen.Revision)
	default:
		return fmt.Sprintf("etcd is at revision %d, lower than revision %d seen before (restored from a snapshot or rebuilt?)", r.Current.Revision, r.Seen.Revision)
	}
}

// Detector remembers the newest header seen from one store. The zero
// value has seen nothing. It is safe for concurrent use: a reader's watch
// and its reads may report headers from two goroutines.
type Detector struct {
	mu   sync.Mutex
	seen Header
}

// Seen is the newest header seen: its revision is one the store reached.
func (d *Detector) Seen() Header {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.seen
}

// Check compares h with what was seen and records it. Its revision is
// compared only when ordered: h comes from a linearizable read, or from
// the same watch stream as every header seen before. A serializable read
// or another member's watch may lag a few revisions behind a revision
// seen elsewhere without any restore; such headers are recorded (their
// revision was reached) with ordered false, which compares the cluster ID
// alone.
//
// On a restore the detector starts over from h, so that one restore is
// reported once.
func (d *Detector) Check(h Header, ordered bool) *Restored {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r *Restored
	switch {
	case h.ClusterID != 0 && d.seen.ClusterID != 0 && h.ClusterID != d.seen.ClusterID:
		r = &Restored{Evidence: ClusterChanged, Seen: d.seen, Current: h}
	case ordered && h.Revision != 0 && h.Revision < d.seen.Revision:
		r = &Restored{Evidence: RevisionBack, Seen: d.seen, Current: h}
	}
	if r != nil {
		d.seen = h
		return r
	}
	if h.ClusterID != 0 {
		d.seen.ClusterID = h.ClusterID
	}
	d.seen.Revision = max(d.seen.Revision, h.Revision)
	return nil
}

// Compaction is a watch from a revision after one seen, or a read at a
// revision seen, refused because the store is compacted at compactRev (0:
// not said, as a read's ErrCompacted does not): revisions the reader had
// not read are gone. The detector starts over from compactRev.
func (d *Detector) Compaction(compactRev int64) *Restored {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := &Restored{Evidence: Compacted, Seen: d.seen, Current: Header{Revision: compactRev}}
	d.seen.Revision = max(d.seen.Revision, compactRev)
	return r
}

// Read is a linearizable read of key (opts as clientv3's Get takes them)
// that also tells whether the store was restored since the last header d
// saw. A read after a restore must look for two kinds of evidence: a
// count-only read at the newest revision seen finds a store compacted past
// it (a restore with --mark-compacted, however many writes followed), and
// the read's own header tells a revision gone back or another cluster.
// The read that tells is itself a read of the restored store. r is nil
// when nothing says the store was restored.
func (d *Detector) Read(ctx context.Context, kv clientv3.KV, key string, opts ...clientv3.OpOption) (resp *clientv3.GetResponse, r *Restored, err error) {
	if seen := d.Seen().Revision; seen > 0 {
		_, err := kv.Get(ctx, key, clientv3.WithCountOnly(), clientv3.WithRev(seen))
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			r = d.Compaction(0)
		case errors.Is(err, rpctypes.ErrFutureRev):
			// The revision went back: the read below tells.
		case err != nil:
			return nil, nil, fmt.Errorf("read %s at revision %d: %w", key, seen, err)
		}
	}
	resp, err = kv.Get(ctx, key, opts...)
	if err != nil {
		return nil, r, fmt.Errorf("read %s: %w", key, err)
	}
	// Linearizable: its revision is at least any revision etcd had
	// reached before, unless etcd went back.
	if back := d.Check(HeaderOf(resp.Header), true); back != nil {
		r = back
	}
	return resp, r, nil
}
