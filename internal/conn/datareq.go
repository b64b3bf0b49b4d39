package conn

import (
	"encoding/binary"
	"slices"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// A transfer's request is encoded on its transfer goroutine, for a
// lock-step call, or handed to the gRPC channel as a message.

// transferRequest is one request of a transfer.
type transferRequest interface {
	// appendTo appends the request, encoded, to b.
	appendTo(b []byte) []byte
	// message is the request as a message, for the gRPC channel, and
	// what to call once the call has returned.
	message() (m proto.Message, release func())
}

// dataRequest is a BatchPut's or BatchGet's request: keys[i] at segs[i].
// It is encoded as proto.Marshal encodes the BatchDataRequest it stands
// for (fields in the order of their numbers, the uint64s packed), in one
// pass and without building that message: for 256 keys, half the time of
// building the message and encoding it with proto.Marshal, and none of its
// four allocations (BenchmarkDataRequest). Like proto.Marshal it sends
// the entries as they are, but it never refuses one: the caller checked
// them (BatchPut: keys not empty and UTF-8).
type dataRequest struct {
	clientID string
	keys     []string
	segs     []Segment
}

// BatchDataRequest's fields.
const (
	dataKeys        protowire.Number = 1
	dataClientID    protowire.Number = 2
	dataShmOffsets  protowire.Number = 3
	dataSizes       protowire.Number = 4
	dataRegionBases protowire.Number = 5
)

func (r dataRequest) appendTo(b []byte) []byte {
	for _, k := range r.keys {
		b = protowire.AppendTag(b, dataKeys, protowire.BytesType)
		b = protowire.AppendString(b, k)
	}
	if r.clientID != "" {
		b = protowire.AppendTag(b, dataClientID, protowire.BytesType)
		b = protowire.AppendString(b, r.clientID)
	}
	if len(r.segs) == 0 { // proto3's empty repeated fields: not sent
		return b
	}
	// The varints, a thousand for 256 keys, are most of the time: the
	// standard library's append inlines, protowire's does not.
	var offsets, sizes, bases int
	for i := range r.segs {
		s := &r.segs[i]
		offsets += protowire.SizeVarint(s.Offset)
		sizes += protowire.SizeVarint(s.Size)
		bases += protowire.SizeVarint(s.RegionBase)
	}
	b = packedHeader(b, dataShmOffsets, offsets)
	for i := range r.segs {
		b = binary.AppendUvarint(b, r.segs[i].Offset)
	}
	b = packedHeader(b, dataSizes, sizes)
	for i := range r.segs {
		b = binary.AppendUvarint(b, r.segs[i].Size)
	}
	b = packedHeader(b, dataRegionBases, bases)
	for i := range r.segs {
		b = binary.AppendUvarint(b, r.segs[i].RegionBase)
	}
	return b
}

// packedHeader appends the tag and length of a packed field of n bytes.
func packedHeader(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

func (r dataRequest) message() (proto.Message, func()) {
	req := &umbppb.BatchDataRequest{
		Keys:        r.keys,
		ClientId:    r.clientID,
		ShmOffsets:  make([]uint64, len(r.segs)),
		Sizes:       make([]uint64, len(r.segs)),
		RegionBases: make([]uint64, len(r.segs)),
	}
	for j, seg := range r.segs {
		req.ShmOffsets[j] = seg.Offset
		req.Sizes[j] = seg.Size
		req.RegionBases[j] = seg.RegionBase
	}
	return req, func() {}
}

// rangedRequest is a BatchPutRanges' or BatchGetRanges' request of objs,
// whose ranges number ranges, their sizes sent on a put. It is encoded as
// proto.Marshal encodes the BatchRangeDataRequest it stands for, without
// building that message: for 256 objects of 32 ranges, 0.6 of the time of
// building it and encoding it with proto.Marshal (BenchmarkRangedRequest).
// It refuses no entry either (BatchPutRanges: the caller checked them).
type rangedRequest struct {
	clientID string
	objs     []Object
	ranges   int
	put      bool
}

// BatchRangeDataRequest's fields.
const (
	rangedKeys          protowire.Number = 1
	rangedClientID      protowire.Number = 2
	rangedRangeCounts   protowire.Number = 3
	rangedShmOffsets    protowire.Number = 4
	rangedRegionBases   protowire.Number = 5
	rangedSizes         protowire.Number = 6
	rangedObjectOffsets protowire.Number = 7
	rangedObjectSizes   protowire.Number = 8
)

func (r rangedRequest) appendTo(b []byte) []byte {
	for i := range r.objs {
		b = protowire.AppendTag(b, rangedKeys, protowire.BytesType)
		b = protowire.AppendString(b, r.objs[i].Key)
	}
	if r.clientID != "" {
		b = protowire.AppendTag(b, rangedClientID, protowire.BytesType)
		b = protowire.AppendString(b, r.clientID)
	}
	if len(r.objs) == 0 {
		return b
	}
	n := 0
	for i := range r.objs {
		n += protowire.SizeVarint(uint64(len(r.objs[i].Ranges)))
	}
	b = packedHeader(b, rangedRangeCounts, n)
	for i := range r.objs {
		b = binary.AppendUvarint(b, uint64(len(r.objs[i].Ranges)))
	}
	b = r.appendRanges(b)
	if r.put {
		n := 0
		for i := range r.objs {
			n += protowire.SizeVarint(r.objs[i].Size)
		}
		b = packedHeader(b, rangedObjectSizes, n)
		for i := range r.objs {
			b = binary.AppendUvarint(b, r.objs[i].Size)
		}
	}
	return b
}

// appendRanges appends the four fields of one value a range (4 to 7),
// packed; nothing when there are no ranges. The sizes are counted in one
// pass, each field written in one of its own.
func (r rangedRequest) appendRanges(b []byte) []byte {
	var n [4]int // bytes of shm_offsets, region_bases, sizes, object_offsets
	count := 0
	for i := range r.objs {
		rs := r.objs[i].Ranges
		count += len(rs)
		for k := range rs {
			n[0] += protowire.SizeVarint(rs[k].Offset)
			n[1] += protowire.SizeVarint(rs[k].RegionBase)
			n[2] += protowire.SizeVarint(rs[k].Size)
			n[3] += protowire.SizeVarint(rs[k].ObjectOffset)
		}
	}
	if count == 0 {
		return b
	}
	b = packedHeader(b, rangedShmOffsets, n[0])
	for i := range r.objs {
		for _, rg := range r.objs[i].Ranges {
			b = binary.AppendUvarint(b, rg.Offset)
		}
	}
	b = packedHeader(b, rangedRegionBases, n[1])
	for i := range r.objs {
		for _, rg := range r.objs[i].Ranges {
			b = binary.AppendUvarint(b, rg.RegionBase)
		}
	}
	b = packedHeader(b, rangedSizes, n[2])
	for i := range r.objs {
		for _, rg := range r.objs[i].Ranges {
			b = binary.AppendUvarint(b, rg.Size)
		}
	}
	b = packedHeader(b, rangedObjectOffsets, n[3])
	for i := range r.objs {
		for _, rg := range r.objs[i].Ranges {
			b = binary.AppendUvarint(b, rg.ObjectOffset)
		}
	}
	return b
}

// message builds the request in one from rangedRequests, given back by
// release.
func (r rangedRequest) message() (proto.Message, func()) {
	req := rangedRequests.Get().(*umbppb.BatchRangeDataRequest)
	req.ClientId = r.clientID
	req.Keys = slices.Grow(req.Keys[:0], len(r.objs))
	req.RangeCounts = slices.Grow(req.RangeCounts[:0], len(r.objs))
	req.ShmOffsets = slices.Grow(req.ShmOffsets[:0], r.ranges)
	req.RegionBases = slices.Grow(req.RegionBases[:0], r.ranges)
	req.Sizes = slices.Grow(req.Sizes[:0], r.ranges)
	req.ObjectOffsets = slices.Grow(req.ObjectOffsets[:0], r.ranges)
	req.ObjectSizes = req.ObjectSizes[:0] // sent only when not empty: a put's
	if r.put {
		req.ObjectSizes = slices.Grow(req.ObjectSizes, len(r.objs))
	}
	for _, o := range r.objs {
		req.Keys = append(req.Keys, o.Key)
		req.RangeCounts = append(req.RangeCounts, uint32(len(o.Ranges)))
		if r.put {
			req.ObjectSizes = append(req.ObjectSizes, o.Size)
		}
		for _, rg := range o.Ranges {
			req.ShmOffsets = append(req.ShmOffsets, rg.Offset)
			req.RegionBases = append(req.RegionBases, rg.RegionBase)
			req.Sizes = append(req.Sizes, rg.Size)
			req.ObjectOffsets = append(req.ObjectOffsets, rg.ObjectOffset)
		}
	}
	return req, func() { recycleRanged(req) }
}

// rangedRequests recycles ranged requests, whose arrays are a ranged job's
// largest allocation (half a MiB for 8192 ranges): nothing holds a request
// once its call has returned, gRPC having encoded it (a stats handler that
// is passed it must copy it to keep it).
var rangedRequests = sync.Pool{New: func() any { return new(umbppb.BatchRangeDataRequest) }}

// recycleRanged returns req to rangedRequests, its keys dropped, unless its
// arrays grew too large to keep.
func recycleRanged(req *umbppb.BatchRangeDataRequest) {
	if cap(req.ShmOffsets) > maxRecycledRanges {
		return
	}
	clear(req.Keys[:cap(req.Keys)])
	req.Keys = req.Keys[:0]
	rangedRequests.Put(req)
}
