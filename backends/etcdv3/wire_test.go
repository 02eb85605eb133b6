package etcdv3

import (
	"fmt"
	"reflect"
	"runtime"
	"runtime/metrics"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/backends/internal/keypath"
)

// The decoder is pinned against the generated one: whatever bytes come,
// it accepts what proto.Unmarshal accepts and reads the same keys,
// values, revision, more and count from it.

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rangeResponse(rev int64, more bool, count int64, keys ...string) *pb.RangeResponse {
	r := &pb.RangeResponse{Header: &pb.ResponseHeader{ClusterId: 7, MemberId: 9, Revision: rev, RaftTerm: 3}, More: more, Count: count}
	for i, k := range keys {
		r.Kvs = append(r.Kvs, &mvccpb.KeyValue{Key: []byte(k), Value: []byte(fmt.Sprintf("v%d", i)), CreateRevision: 2, ModRevision: rev, Version: 1, Lease: int64(i)})
	}
	return r
}

func txnResponse(ops ...*pb.ResponseOp) *pb.TxnResponse {
	return &pb.TxnResponse{Header: &pb.ResponseHeader{Revision: 42}, Succeeded: true, Responses: ops}
}

func rangeOp(r *pb.RangeResponse) *pb.ResponseOp {
	return &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: r}}
}

// wantRange is what readAt took from a generated RangeResponse before the
// decoder: the kept pairs, and the scalars.
func wantRange(r *pb.RangeResponse, under string, pairs []memkv.KVPair) ([]memkv.KVPair, rangeReply) {
	rr := rangeReply{more: r.GetMore(), count: r.GetCount(), kvs: len(r.GetKvs())}
	for _, kv := range r.GetKvs() {
		rr.bytes += len(kv.Key) + len(kv.Value)
		rr.last = string(kv.Key)
		if keypath.Under(string(kv.Key), under) {
			pairs = append(pairs, memkv.KVPair{Key: string(kv.Key), Value: string(kv.Value)})
		}
	}
	return pairs, rr
}

func checkPairs(t *testing.T, got, want []memkv.KVPair) {
	t.Helper()
	if len(got) != len(want) || (len(got) > 0 && !reflect.DeepEqual(got, want)) {
		t.Fatalf("pairs %q, want %q", got, want)
	}
}

func seedRanges(f *testing.F) {
	one := marshal(f, rangeResponse(5, true, 10, "/a", "/a/b", "/ab", "/a/c"))
	two := marshal(f, rangeResponse(6, false, 3, "/a/d"))
	f.Add(one, "/a")
	f.Add(append(append([]byte{}, one...), two...), "/a") // concatenated: merged
	f.Add(marshal(f, &pb.RangeResponse{}), "")
	f.Add(marshal(f, rangeResponse(1, false, 1, "")), "")
	f.Add(one[:len(one)-3], "/a") // truncated
	f.Add(protowire.AppendTag(nil, 2, protowire.VarintType), "")
	f.Add(append(protowire.AppendTag(nil, 9, protowire.StartGroupType), protowire.AppendTag(nil, 9, protowire.EndGroupType)...), "")
	// KeyValues at the edges of the tags and lengths of one byte that
	// keyValue and consumeTag read in place.
	long := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), make([]byte, 128))
	for _, kv := range [][]byte{
		{0x0a, 0x02, 'a', 'b'},             // key "ab", its length exactly what is left
		{0x0a, 0x03, 'a', 'b'},             // length one beyond what is left
		{0x0a, 0x7f, 'a'},                  // the largest length of one byte, truncated
		long,                               // a length of two bytes
		{0x8a, 0x00, 0x01, 'a'},            // the key's tag in two bytes (not minimal, valid)
		{0x02, 0x00},                       // field number 0
		{0x0e, 0x00},                       // wire type 6
		{0x2a, 0x01, 'v', 0x0a, 0x01, 'k'}, // value before key
		{0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, // create_revision overflows
	} {
		f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), kv), "")
	}
}

func FuzzDecodeRange(f *testing.F) {
	seedRanges(f)
	f.Fuzz(func(t *testing.T, b []byte, under string) {
		var want pb.RangeResponse
		werr := proto.Unmarshal(b, &want)
		base := []memkv.KVPair{{Key: "/before", Value: "x"}}
		got, err := decodeRange(b, []string{under}, base)
		if (err != nil) != (werr != nil) {
			t.Fatalf("decode error %v, generated decoder's %v", err, werr)
		}
		if err != nil {
			return
		}
		pairs, rr := wantRange(&want, under, base)
		checkPairs(t, got.pairs, pairs)
		if got.rev != want.GetHeader().GetRevision() || !reflect.DeepEqual(got.ranges, []rangeReply{rr}) {
			t.Fatalf("got rev %d %+v, want %d %+v", got.rev, got.ranges, want.GetHeader().GetRevision(), rr)
		}
	})
}

func FuzzDecodeTxn(f *testing.F) {
	a := rangeResponse(5, true, 10, "/a", "/a/b", "/ab")
	b := rangeResponse(5, false, 1, "/b")
	put := &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: &pb.ResponseHeader{Revision: 3}}}}
	f.Add(marshal(f, txnResponse(rangeOp(a), rangeOp(b))), "/a")
	f.Add(marshal(f, txnResponse()), "")
	f.Add(marshal(f, txnResponse(rangeOp(a), put)), "/a")
	f.Add(marshal(f, txnResponse(rangeOp(&pb.RangeResponse{}))), "")
	// One operation whose range field comes twice (merged), and one whose
	// range is followed by a put (the oneof keeps the put).
	twice := append(marshal(f, rangeOp(a)), marshal(f, rangeOp(b))...)
	replaced := append(marshal(f, rangeOp(a)), marshal(f, put)...)
	for _, op := range [][]byte{twice, replaced} {
		msg := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), op)
		f.Add(msg, "/")
	}
	f.Fuzz(func(t *testing.T, b []byte, under string) {
		var want pb.TxnResponse
		werr := proto.Unmarshal(b, &want)
		_, ops, err := parseTxn(b)
		if err == nil {
			for _, op := range ops {
				for _, m := range op.msgs {
					if serr := (&rangeState{}).scan(m); serr != nil {
						t.Fatalf("a range parseTxn passed fails its scan: %v", serr)
					}
				}
			}
		}
		if (err != nil) != (werr != nil) {
			t.Fatalf("parse error %v, generated decoder's %v", err, werr)
		}
		if err != nil {
			return
		}
		if len(ops) != len(want.Responses) {
			t.Fatalf("%d operations, want %d", len(ops), len(want.Responses))
		}
		unders := make([]string, len(ops))
		for i := range unders {
			unders[i] = under
		}
		got, err := decodeTxn(b, unders, nil)
		var pairs []memkv.KVPair
		var ranges []rangeReply
		for _, op := range want.Responses {
			r := op.GetResponseRange()
			if r == nil {
				if err == nil {
					t.Fatalf("an operation answered %T decoded as a range", op.Response)
				}
				return
			}
			var rr rangeReply
			pairs, rr = wantRange(r, under, pairs)
			ranges = append(ranges, rr)
		}
		if err != nil {
			t.Fatal(err)
		}
		checkPairs(t, got.pairs, pairs)
		if got.rev != want.GetHeader().GetRevision() || len(got.ranges) != len(ranges) || (len(ranges) > 0 && !reflect.DeepEqual(got.ranges, ranges)) {
			t.Fatalf("got rev %d %+v, want %d %+v", got.rev, got.ranges, want.GetHeader().GetRevision(), ranges)
		}
	})
}

// A call that the client retries after its reply was decoded decodes
// again: the pairs of the first decode must not stay beside the second's.
func TestPairsCodecDecodesARetryAfresh(t *testing.T) {
	msg := marshal(t, rangeResponse(5, false, 2, "/k/1", "/k/2"))
	base := make([]memkv.KVPair, 1, 10)
	base[0] = memkv.KVPair{Key: "/first", Value: "x"}
	c := &pairsCodec{under: []string{"/k"}, pairs: base}
	for range 2 {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, &pb.RangeResponse{}); err != nil {
			t.Fatal(err)
		}
	}
	checkPairs(t, c.out.pairs, []memkv.KVPair{{Key: "/first", Value: "x"}, {Key: "/k/1", Value: "v0"}, {Key: "/k/2", Value: "v1"}})
}

// The pairs outlive the wire buffer, which gRPC reuses once Unmarshal
// returns.
func TestPairsCodecCopiesOutOfTheWireBuffer(t *testing.T) {
	msg := marshal(t, rangeResponse(5, false, 1, "/k/1"))
	c := &pairsCodec{under: []string{"/k"}}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, &pb.RangeResponse{}); err != nil {
		t.Fatal(err)
	}
	clear(msg)
	checkPairs(t, c.out.pairs, []memkv.KVPair{{Key: "/k/1", Value: "v0"}})
	if c.out.ranges[0].last != "/k/1" {
		t.Fatalf("last %q", c.out.ranges[0].last)
	}
}

// A response that arrives in frames, as a large one does (16 kB each), is
// decoded as a whole, and from memory of its own: a buffer from gRPC's pool
// stayed alive in the pool after the decode, 1 MiB of it beside a read of
// this size, all through the render that followed.
func TestPairsCodecKeepsNoBufferOfAResponseInFrames(t *testing.T) {
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprintf("/other/%06d", i) // not under /k: nothing is kept
	}
	keys = append(keys, "/k/1")
	msg := marshal(t, rangeResponse(5, false, int64(len(keys)), keys...))
	var frames mem.BufferSlice
	for b := msg; len(b) > 0; b = b[min(len(b), 16<<10):] {
		frames = append(frames, mem.SliceBuffer(b[:min(len(b), 16<<10)]))
	}
	live := func() int64 {
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return int64(s[0].Value.Uint64())
	}
	c := &pairsCodec{under: []string{"/k"}}
	before := live()
	for range 3 {
		if err := c.Unmarshal(frames, &pb.RangeResponse{}); err != nil {
			t.Fatal(err)
		}
	}
	grew := live() - before
	checkPairs(t, c.out.pairs, []memkv.KVPair{{Key: "/k/1", Value: fmt.Sprintf("v%d", len(keys)-1)}})
	if c.out.ranges[0].kvs != len(keys) || c.out.ranges[0].last != "/k/1" {
		t.Fatalf("range %+v", c.out.ranges[0])
	}
	if grew > int64(len(msg))/2 {
		t.Fatalf("live heap grew by %d bytes decoding a response of %d bytes that keeps one pair", grew, len(msg))
	}
}

// etcd's count of a range sizes the list of pairs, but only up to
// maxHint: an answer claiming more keys than it could hold must not make
// the allocation (found by FuzzDecodeTxn: out of memory).
func TestDecodeBoundsTheListACountAsksFor(t *testing.T) {
	for _, count := range []int64{1 << 62, -5} {
		msg := marshal(t, rangeResponse(5, true, count, "/k/1"))
		got, err := decodeRange(msg, []string{"/k"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.pairs) != 1 || cap(got.pairs) > maxHint {
			t.Errorf("count %d: %d pairs in a list of capacity %d", count, len(got.pairs), cap(got.pairs))
		}
	}
}

// BenchmarkDecodeRange is the decoder's own share of a read: one page of
// 10,000 keys of 64-byte values, as etcd sends it.
func BenchmarkDecodeRange(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("/bench/flat/k%07d", i)
	}
	r := rangeResponse(5, false, int64(len(keys)), keys...)
	for _, kv := range r.Kvs {
		kv.Value = []byte(fmt.Sprintf("value-%08s", kv.Key[len(kv.Key)-8:]) + "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
	}
	msg := marshal(b, r)
	under := []string{"/bench/flat"}
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeRange(msg, under, nil); err != nil {
			b.Fatal(err)
		}
	}
}
