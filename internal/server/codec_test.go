package server

import (
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// FuzzRequestCodec: for any bytes, the server's codec decodes each request
// it takes over exactly as protobuf does (unknown fields aside, which the
// server never reads), or fails where protobuf fails.
func FuzzRequestCodec(f *testing.F) {
	seeds := []proto.Message{
		&umbppb.BatchDataRequest{Keys: []string{"a", "bb", ""}, ClientId: "c", ShmOffsets: []uint64{1, 1 << 40}, Sizes: []uint64{7}, RegionBases: []uint64{0, 9}},
		&umbppb.BatchRangeDataRequest{Keys: []string{"k"}, ClientId: "c", RangeCounts: []uint32{2}, ShmOffsets: []uint64{0, 8}, RegionBases: []uint64{1, 1}, Sizes: []uint64{8, 8}, ObjectOffsets: []uint64{0, 8}, ObjectSizes: []uint64{16}},
		&umbppb.BatchKeysRequest{Keys: []string{"x", "y"}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})       // a key that is not UTF-8
	f.Add([]byte{0x18, 0x05, 0x18, 0x06})       // unpacked numbers
	f.Add([]byte{0x08, 0x01, 0x0a, 0x01, 0x61}) // a key sent as a varint, then one
	f.Add([]byte{0x1a, 0x03, 0x01, 0x80})       // a packed field cut short
	c := newRequestCodec()
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, fresh := range []func() proto.Message{
			func() proto.Message { return &umbppb.BatchDataRequest{} },
			func() proto.Message { return &umbppb.BatchRangeDataRequest{} },
			func() proto.Message { return &umbppb.BatchKeysRequest{} },
		} {
			want, got := fresh(), fresh()
			werr := proto.Unmarshal(b, want)
			gerr := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), b...))}, got)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("%T of %x: protobuf says %v, the codec %v", want, b, werr, gerr)
			}
			if werr != nil {
				continue
			}
			want.ProtoReflect().SetUnknown(nil)
			if !proto.Equal(want, got) {
				t.Fatalf("%T of %x: protobuf decodes\n\t%v\nthe codec\n\t%v", want, b, want, got)
			}
		}
	})
}

// The codec's keys are views of the request's one copy: a request of many
// keys costs a few allocations, not one a key.
func TestRequestCodecAllocations(t *testing.T) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:0123456789abcdef0123456789abcdef"
	}
	b, err := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	c := newRequestCodec()
	var m umbppb.BatchKeysRequest
	n := testing.AllocsPerRun(20, func() {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &m); err != nil {
			t.Fatal(err)
		}
	})
	if len(m.Keys) != 1024 || m.Keys[1023] != keys[1023] {
		t.Fatalf("decoded %d keys", len(m.Keys))
	}
	if n > 8 { // protobuf's decoder: 1025
		t.Errorf("%v allocations to decode 1024 keys, want at most 8", n)
	}
}
