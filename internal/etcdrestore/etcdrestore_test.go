package etcdrestore

import (
	"context"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestDetector(t *testing.T) {
	type step struct {
		h       Header
		ordered bool
		want    Evidence // "": no restore
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"revisions going up", []step{{Header{1, 10}, true, ""}, {Header{1, 10}, true, ""}, {Header{1, 12}, true, ""}}},
		{"revision back", []step{{Header{1, 10}, true, ""}, {Header{1, 9}, true, RevisionBack}}},
		// Reported once: the detector follows the restored store.
		{"revision back once", []step{{Header{1, 10}, true, ""}, {Header{1, 5}, true, RevisionBack}, {Header{1, 6}, true, ""}}},
		// A lagging member's watch or serializable read: no restore,
		// and its revision does not lower what was seen.
		{"unordered lag", []step{{Header{1, 10}, true, ""}, {Header{1, 9}, false, ""}, {Header{1, 9}, true, RevisionBack}}},
		{"unordered raises", []step{{Header{1, 10}, false, ""}, {Header{1, 9}, true, RevisionBack}}},
		{"cluster changed, revision higher", []step{{Header{1, 10}, true, ""}, {Header{2, 50}, true, ClusterChanged}, {Header{2, 51}, true, ""}}},
		{"cluster changed, unordered", []step{{Header{1, 10}, true, ""}, {Header{2, 5}, false, ClusterChanged}}},
		{"cluster and revision: cluster named", []step{{Header{1, 10}, true, ""}, {Header{2, 5}, true, ClusterChanged}}},
		// confd's watch passes revisions alone.
		{"unknown cluster", []step{{Header{0, 10}, true, ""}, {Header{7, 11}, true, ""}, {Header{0, 12}, true, ""}, {Header{0, 3}, true, RevisionBack}}},
		{"unknown revision", []step{{Header{1, 10}, true, ""}, {Header{1, 0}, true, ""}, {Header{1, 10}, true, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Detector
			for i, s := range tc.steps {
				seen := d.Seen()
				r := d.Check(s.h, s.ordered)
				switch {
				case s.want == "" && r != nil:
					t.Fatalf("step %d %+v: %v, want no restore", i, s.h, r)
				case s.want != "" && (r == nil || r.Evidence != s.want):
					t.Fatalf("step %d %+v: %v, want %s", i, s.h, r, s.want)
				case r != nil && (r.Seen != seen || r.Current != s.h):
					t.Fatalf("step %d: seen %+v current %+v, want %+v and %+v", i, r.Seen, r.Current, seen, s.h)
				}
			}
		})
	}
}

func TestCompaction(t *testing.T) {
	var d Detector
	d.Check(Header{1, 10}, true)
	r := d.Compaction(1000)
	if r.Evidence != Compacted || r.Seen != (Header{1, 10}) || r.Current.Revision != 1000 {
		t.Fatalf("%+v", r)
	}
	if !strings.Contains(r.Error(), "compacted at revision 1000, past revision 10") {
		t.Errorf("message %q", r.Error())
	}
	if m := (&Restored{Evidence: Compacted, Seen: Header{1, 10}}).Error(); !strings.HasPrefix(m, "etcd is compacted, past revision 10 seen before") {
		t.Errorf("compaction revision unknown: %q", m)
	}
	// --bump-revision: the restored store answers above the compaction.
	if r := d.Check(Header{1, 1001}, true); r != nil {
		t.Errorf("after the compaction: %v", r)
	}
}

// TestMessages: the revision message is confd's RevisionBehindError's, so
// that both say a restore the same way.
func TestMessages(t *testing.T) {
	back := (&Restored{Evidence: RevisionBack, Seen: Header{1, 10}, Current: Header{1, 4}}).Error()
	if want := "etcd is at revision 4, lower than revision 10 seen before (restored from a snapshot or rebuilt?)"; back != want {
		t.Errorf("%q, want %q", back, want)
	}
	cl := (&Restored{Evidence: ClusterChanged, Seen: Header{0xa, 10}, Current: Header{0xb, 40}}).Error()
	if !strings.Contains(cl, "cluster ID b, not a") {
		t.Errorf("%q", cl)
	}
}

func TestHeaderOf(t *testing.T) {
	if h := HeaderOf(nil); h != (Header{}) {
		t.Errorf("nil: %+v", h)
	}
	if h := HeaderOf(&pb.ResponseHeader{ClusterId: 3, MemberId: 4, Revision: 5, RaftTerm: 6}); h != (Header{3, 5}) {
		t.Errorf("%+v", h)
	}
}

// fakeKV answers Get: at a revision, ErrCompacted when compacted; else a
// header at rev.
type fakeKV struct {
	clientv3.KV
	cluster, rev uint64
	compacted    bool
}

func (f *fakeKV) Get(_ context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if clientv3.OpGet(key, opts...).Rev() > 0 && f.compacted {
		return nil, rpctypes.ErrCompacted
	}
	return &clientv3.GetResponse{Header: &pb.ResponseHeader{ClusterId: f.cluster, Revision: int64(f.rev)}}, nil
}

// Read: the first read only records; a store compacted past the revision
// seen, or gone back, or another cluster, is told by the next read.
func TestRead(t *testing.T) {
	ctx := context.Background()
	var d Detector
	kv := &fakeKV{cluster: 1, rev: 10}
	if _, r, err := d.Read(ctx, kv, "/k"); r != nil || err != nil {
		t.Fatalf("first read: %v %v", r, err)
	}
	kv.rev = 12
	if _, r, err := d.Read(ctx, kv, "/k"); r != nil || err != nil {
		t.Fatalf("revision up: %v %v", r, err)
	}
	kv.rev = 5
	if _, r, _ := d.Read(ctx, kv, "/k"); r == nil || r.Evidence != RevisionBack {
		t.Fatalf("revision back: %v", r)
	}
	kv.rev, kv.compacted = 50, true
	if _, r, _ := d.Read(ctx, kv, "/k"); r == nil || r.Evidence != Compacted {
		t.Fatalf("compacted past the revision seen: %v", r)
	}
	kv.compacted, kv.cluster = false, 2
	if _, r, _ := d.Read(ctx, kv, "/k"); r == nil || r.Evidence != ClusterChanged {
		t.Fatalf("another cluster: %v", r)
	}
}
