package etcdv3

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"

	"github.com/kelseyhightower/memkv"

	"github.com/keysync/confd/backends/internal/keypath"
)

// A read's responses are decoded here, straight from the wire into the
// pairs a render needs, instead of by the generated code: that would give
// every key a message of its own (a struct of about 100 bytes and a
// pointer to it) and every key and value a slice of its own, only to drop
// them once the pairs are made: a read of 100k keys made 302,000
// allocations (35 MB); decoded here, 1,900 (17 MB)
// (BenchmarkGetValuesPrefix, TestGetPairsAllocatesPerRequestNotPerKey). A
// one-shot render's peak RSS drops by about 1 MB at 100k short values and
// about 6 MB at 20k values of 2 kB (make bench). Only the fields a read uses
// are looked at; every other field is skipped as protobuf skips unknown
// ones. What is accepted, and what comes out, is pinned against the
// generated decoder by FuzzDecodeRange and FuzzDecodeTxn.

// rangeReply is what one range answered.
type rangeReply struct {
	more  bool
	count int64  // keys in the whole range, beyond the limit
	kvs   int    // keys returned, before the path filter
	bytes int    // their keys' and values' bytes
	last  string // the last key returned, where the next page starts
}

// reply is one response: its revision, its ranges in request order, and
// the list of pairs read so far with the pairs it returned appended: those
// on or below the key each range was requested for, in etcd's order.
type reply struct {
	rev    int64 // 0: the response had no header revision
	ranges []rangeReply
	pairs  []memkv.KVPair
}

// pairsCodec decodes one call's response into out: a Range response into
// one range, a Txn response into one range per operation (each one a
// range, or the decode fails), their pairs appended to pairs. under holds,
// per range, the requested key whose path rule filters what it returns. A
// retried call decodes again and replaces out, appending to pairs as it
// was, so an attempt whose reply was decoded but whose call then failed
// leaves nothing behind.
type pairsCodec struct {
	under []string
	pairs []memkv.KVPair
	out   reply
}

// requestCodec encodes requests: they are the generated messages.
var requestCodec = encoding.GetCodecV2(proto.Name)

// Name is the content subtype the server sees: plain protobuf.
func (*pairsCodec) Name() string { return proto.Name }

func (*pairsCodec) Marshal(v any) (mem.BufferSlice, error) { return requestCodec.Marshal(v) }

func (c *pairsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	// A response that came in one buffer is read where it lies. A larger
	// one, in many frames, is copied into memory of its own rather than
	// into a buffer from gRPC's pool: pooled buffers of the 1 MiB tier,
	// one per processor, stayed alive in the pool beside everything the
	// read made, all through the render that follows (2 MB of a one-shot's
	// 9 MB live heap at 100k keys), and the collector sizes the heap to
	// twice what is alive. Copied, each is garbage as soon as it is
	// decoded.
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	var (
		r   reply
		err error
	)
	switch v.(type) {
	case *pb.RangeResponse:
		r, err = decodeRange(b, c.under, c.pairs)
	case *pb.TxnResponse:
		r, err = decodeTxn(b, c.under, c.pairs)
	default:
		err = fmt.Errorf("no decoder for %T", v)
	}
	if err != nil {
		return err
	}
	c.out = r
	return nil
}

// decodeRange decodes a RangeResponse.
func decodeRange(b []byte, under []string, pairs []memkv.KVPair) (reply, error) {
	op := opRange{msgs: [][]byte{b}}
	if err := op.scan(b); err != nil {
		return reply{}, err
	}
	return replyOf(op.rev, []opRange{op}, under, pairs)
}

// decodeTxn decodes a TxnResponse whose operations must all be ranges.
func decodeTxn(b []byte, under []string, pairs []memkv.KVPair) (reply, error) {
	rev, ops, err := parseTxn(b)
	if err != nil {
		return reply{}, err
	}
	return replyOf(rev, ops, under, pairs)
}

// opRange is a ResponseOp's range: its messages (several when the field
// repeats: protobuf merges them), scanned into its state; no messages when
// the operation is not a range.
type opRange struct {
	msgs [][]byte
	rangeState
}

// parseTxn returns a TxnResponse's revision and its operations' ranges.
func parseTxn(b []byte) (rev int64, ops []opRange, err error) {
	err = fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if typ != protowire.BytesType || (num != 1 && num != 3) {
			return skip, nil
		}
		v, n := consumeBytes(b)
		if n < 0 {
			return n, nil
		}
		if num == 1 {
			return n, header(v, &rev)
		}
		op, err := responseOp(v)
		ops = append(ops, op)
		return n, err
	})
	return rev, ops, err
}

// responseOp returns the range of a ResponseOp. A oneof keeps its last
// member, so another member after a range empties it; every member is
// checked as protobuf would decode it.
func responseOp(b []byte) (opRange, error) {
	var op opRange
	err := fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num < 1 || num > 4 || typ != protowire.BytesType {
			return skip, nil
		}
		v, n := consumeBytes(b)
		if n < 0 {
			return n, nil
		}
		var other protov2.Message
		switch num {
		case 1:
			op.msgs = append(op.msgs, v)
			return n, op.scan(v)
		case 2:
			other = &pb.PutResponse{}
		case 3:
			other = &pb.DeleteRangeResponse{}
		default:
			other = &pb.TxnResponse{}
		}
		op = opRange{}
		return n, protov2.Unmarshal(v, other)
	})
	return op, err
}

// header reads the revision of a ResponseHeader into rev, if it has one.
func header(b []byte, rev *int64) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == 3 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			*rev = int64(v)
			return n, nil
		}
		return skip, nil
	})
}

// skip, returned by a fields callback, has the field skipped as unknown;
// protowire's error codes are small negative numbers.
const skip = math.MinInt

// fields walks a message, handing each field's tag and the bytes after it
// to fn, which returns how much of them the field's value took (negative:
// a protowire error code), or skip.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return err
		}
		b = b[n:]
		n, err = fn(num, typ, b)
		if err != nil {
			return err
		}
		if n == skip {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// rangeState is one range's reply as its messages are scanned.
type rangeState struct {
	rev   int64
	more  bool
	count int64
}

// scan checks one RangeResponse message and takes its scalar fields; the
// key/value pairs are taken by replyOf once every message has passed.
func (st *rangeState) scan(b []byte) error {
	return rangeFields(b, st, func(key, value []byte) {})
}

// maxHint bounds the list made for etcd's count of a read's keys (32
// bytes a pair: 32 MiB): the count is the server's word, and a count
// beyond what the read will hold (a broken or hostile answer) must not
// make the allocation; a larger read grows the list as it comes.
const maxHint = 1 << 20

// replyOf is the reply of ops, scanned before: one range each, and
// the pairs on or below the key under gives it appended to pairs, their
// keys and values copied into one allocation for the whole response, not
// two slices per key. A list not yet allocated is made as large as etcd
// counts the ranges to be, beyond the limit (up to maxHint), so that it
// is not grown (each growth holds the old and the new array at once).
func replyOf(rev int64, ops []opRange, under []string, pairs []memkv.KVPair) (reply, error) {
	if len(ops) != len(under) {
		return reply{}, fmt.Errorf("answered %d of %d reads", len(ops), len(under))
	}
	r := reply{rev: rev, ranges: make([]rangeReply, len(ops))}
	each := func(op opRange, fn func(key, value []byte)) {
		for _, m := range op.msgs {
			// Scanned before: no error can come.
			_ = rangeFields(m, &rangeState{}, fn)
		}
	}
	keep, size := 0, 0
	var hint int64
	for i, op := range ops {
		if op.msgs == nil {
			return reply{}, fmt.Errorf("the read of %q was answered with no range", under[i])
		}
		rr := &r.ranges[i]
		rr.more, rr.count = op.more, op.count
		hint += op.count
		var last []byte
		each(op, func(key, value []byte) {
			rr.kvs++
			rr.bytes += len(key) + len(value)
			last = key
			if keypath.Under(unsafeString(key), under[i]) {
				keep++
				size += len(key) + len(value)
			}
		})
		rr.last = string(last)
	}
	if pairs == nil {
		pairs = make([]memkv.KVPair, 0, max(min(hint, maxHint), int64(keep)))
	}
	block := make([]byte, 0, size)
	for i, op := range ops {
		each(op, func(key, value []byte) {
			if !keypath.Under(unsafeString(key), under[i]) {
				return
			}
			at := len(block)
			block = append(append(block, key...), value...)
			kv := block[at:]
			pairs = append(pairs, memkv.KVPair{Key: unsafeString(kv[:len(key)]), Value: unsafeString(kv[len(key):])})
		})
	}
	r.pairs = pairs
	return r, nil
}

// rangeFields walks a RangeResponse, calling kv for every key/value pair
// in order and taking the other fields into st. Repeated scalars keep
// their last value and repeated headers merge, as protobuf decodes them.
func rangeFields(b []byte, st *rangeState, kv func(key, value []byte)) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := consumeBytes(b)
			if n < 0 {
				return n, nil
			}
			return n, header(v, &st.rev)
		case num == 2 && typ == protowire.BytesType:
			v, n := consumeBytes(b)
			if n < 0 {
				return n, nil
			}
			key, value, err := keyValue(v)
			if err != nil {
				return 0, err
			}
			kv(key, value)
			return n, nil
		case (num == 3 || num == 4) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if num == 3 {
				st.more = v != 0
			} else {
				st.count = int64(v)
			}
			return n, nil
		}
		return skip, nil
	})
}

// consumeTag reads a field's tag and returns its length: the tags of
// one byte, which every field of etcd's messages has, in place, others
// through protowire. protowire takes numbers up to MaxInt32; protobuf
// refuses those beyond MaxValidNumber, and so does this.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	if len(b) > 0 && b[0] < 0x80 && b[0]>>3 != 0 {
		return protowire.Number(b[0] >> 3), protowire.Type(b[0] & 7), 1, nil
	}
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, 0, protowire.ParseError(n)
	}
	if num > protowire.MaxValidNumber {
		return 0, 0, 0, errors.New("invalid field number")
	}
	return num, typ, n, nil
}

// consumeBytes is protowire.ConsumeBytes with lengths of one byte, which
// every key/value pair of a small value has, read in place.
func consumeBytes(b []byte) ([]byte, int) {
	if len(b) > 0 && b[0] < 0x80 && int(b[0]) < len(b) {
		return b[1 : 1+b[0]], 1 + int(b[0])
	}
	return protowire.ConsumeBytes(b)
}

// keyValue returns the key and value of a KeyValue message: fields
// written out, without a callback per field, for the message every key of
// a read passes through (three times: scan, count, copy). With consumeTag
// and consumeBytes, a page of 10,000 keys decodes in a quarter to 40 %
// less time than through fields and protowire alone (BenchmarkDecodeRange,
// interleaved runs).
func keyValue(b []byte) (key, value []byte, err error) {
	for len(b) > 0 {
		num, typ, n, err := consumeTag(b)
		if err != nil {
			return nil, nil, err
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 5) && typ == protowire.BytesType:
			var v []byte
			v, n = consumeBytes(b)
			if num == 1 {
				key = v
			} else {
				value = v
			}
		case typ == protowire.VarintType:
			_, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, nil, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return key, value, nil
}

// unsafeString is b as a string without a copy, for bytes nothing writes
// to afterwards.
func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// errNoRevision is a response without the revision it was read at.
var errNoRevision = errors.New("response carries no revision")
