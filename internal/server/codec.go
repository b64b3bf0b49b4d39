package server

import (
	"errors"
	"fmt"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// The requests that carry many keys (batches of data, ranged batches,
// lookups) are decoded with one copy of the message for all their keys:
// protobuf's decoder makes a string of each key, which for a batch of 256
// keys was more than half of what a job allocates in this process, and
// for a lookup of 1024 keys nearly all. Each key is a view of that one
// copy, which no one writes. Every other message, and every reply, is
// gRPC's protobuf codec's; what these decode is what it decodes
// (FuzzRequestCodec holds the two to the same answer).

// requestCodec is the server's codec.
type requestCodec struct{ proto encoding.CodecV2 }

func newRequestCodec() requestCodec {
	pc := encoding.GetCodecV2(grpcproto.Name)
	if pc == nil {
		panic(fmt.Sprintf("server: gRPC's %q codec is not registered", grpcproto.Name))
	}
	return requestCodec{proto: pc}
}

func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Name is the protobuf codec's: the content type is unchanged.
func (c requestCodec) Name() string { return c.proto.Name() }

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var fields []field
	switch m := v.(type) {
	case *umbppb.BatchDataRequest:
		*m = umbppb.BatchDataRequest{}
		fields = []field{
			1: {strs: &m.Keys}, 2: {str: &m.ClientId},
			3: {u64: &m.ShmOffsets}, 4: {u64: &m.Sizes}, 5: {u64: &m.RegionBases},
		}
	case *umbppb.BatchRangeDataRequest:
		*m = umbppb.BatchRangeDataRequest{}
		fields = []field{
			1: {strs: &m.Keys}, 2: {str: &m.ClientId}, 3: {u32: &m.RangeCounts},
			4: {u64: &m.ShmOffsets}, 5: {u64: &m.RegionBases}, 6: {u64: &m.Sizes},
			7: {u64: &m.ObjectOffsets}, 8: {u64: &m.ObjectSizes},
		}
	case *umbppb.BatchKeysRequest:
		*m = umbppb.BatchKeysRequest{}
		fields = []field{1: {strs: &m.Keys}}
	default:
		return c.proto.Unmarshal(data, v)
	}
	return decodeFields(data.Materialize(), fields)
}

// field is where one field number of a message goes: a repeated string, a
// string, or a repeated uint32 or uint64 (packed or not).
type field struct {
	strs *[]string
	str  *string
	u32  *[]uint32
	u64  *[]uint64
}

var errTruncated = errors.New("server: request: truncated or malformed field")

// decodeFields decodes the protobuf message b into fields, as protobuf's
// decoder would: a field of another number, or of a wire type its field
// does not take, is skipped (protobuf keeps it as an unknown field, which
// the server never reads); a string that is not UTF-8 is an error, as
// proto3 strings must be. b is the message's own copy: the strings are
// views of it.
func decodeFields(b []byte, fields []field) error {
	// First count each repeated field's elements, so that each slice is
	// made once, at its size.
	counts := make([]int, len(fields))
	if err := walk(b, fields, func(f *field, num int, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case f.strs != nil:
			counts[num]++
		case f.str != nil:
		case typ == protowire.BytesType: // packed numbers
			for len(v) > 0 {
				_, n := protowire.ConsumeVarint(v)
				if n < 0 {
					return errTruncated
				}
				v = v[n:]
				counts[num]++
			}
		case f.u32 != nil || f.u64 != nil:
			counts[num]++
		}
		return nil
	}); err != nil {
		return err
	}
	for num, n := range counts {
		switch f := &fields[num]; {
		case n == 0:
		case f.strs != nil:
			*f.strs = make([]string, 0, n)
		case f.u32 != nil:
			*f.u32 = make([]uint32, 0, n)
		case f.u64 != nil:
			*f.u64 = make([]uint64, 0, n)
		}
	}
	return walk(b, fields, func(f *field, num int, typ protowire.Type, v []byte, x uint64) error {
		switch {
		case f.strs != nil || f.str != nil:
			if !utf8.Valid(v) {
				return fmt.Errorf("server: request: field %d: string is not valid UTF-8", num)
			}
			s := unsafe.String(unsafe.SliceData(v), len(v))
			if f.strs != nil {
				*f.strs = append(*f.strs, s)
			} else {
				*f.str = s
			}
		case typ == protowire.BytesType:
			for len(v) > 0 {
				x, n := protowire.ConsumeVarint(v)
				v = v[n:]
				appendNumber(f, x)
			}
		default:
			appendNumber(f, x)
		}
		return nil
	})
}

func appendNumber(f *field, x uint64) {
	if f.u32 != nil {
		*f.u32 = append(*f.u32, uint32(x))
	} else {
		*f.u64 = append(*f.u64, x)
	}
}

// walk calls each for every field of b that fields takes, with its value:
// v for a length-delimited one (a string, or packed numbers), x for a
// varint. Others are skipped.
func walk(b []byte, fields []field, each func(f *field, num int, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || !num.IsValid() {
			return errTruncated
		}
		b = b[n:]
		var f *field
		if int(num) < len(fields) && fields[num] != (field{}) {
			f = &fields[num]
		}
		switch {
		case f != nil && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errTruncated
			}
			b = b[n:]
			if err := each(f, int(num), typ, v, 0); err != nil {
				return err
			}
			continue
		case f != nil && typ == protowire.VarintType && (f.u32 != nil || f.u64 != nil):
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errTruncated
			}
			b = b[n:]
			if err := each(f, int(num), typ, nil, x); err != nil {
				return err
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
	}
	return nil
}
