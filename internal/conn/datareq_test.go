package conn

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// A data request is encoded byte for byte as proto.Marshal encodes the
// message it stands for, and decodes to that message.
func TestDataRequestEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []dataRequest{
		{},
		{clientID: "c"},
		{keys: []string{"k"}, segs: []Segment{{}}},
		{clientID: "worker-1", keys: []string{"a", "é", ""}, segs: []Segment{{RegionBase: math.MaxUint64, Offset: 1 << 63, Size: 127}, {Size: 128}, {Offset: 300}}},
	}
	for n := range 50 {
		r := dataRequest{clientID: fmt.Sprintf("client-%d", n)}
		for i := range rng.IntN(300) {
			r.keys = append(r.keys, fmt.Sprintf("key-%d-%d", n, i))
			r.segs = append(r.segs, Segment{RegionBase: rng.Uint64() >> rng.IntN(64), Offset: rng.Uint64() >> rng.IntN(64), Size: rng.Uint64() >> rng.IntN(64)})
		}
		cases = append(cases, r)
	}
	for i, r := range cases {
		checkEncoding(t, fmt.Sprintf("data case %d", i), r, &umbppb.BatchDataRequest{})
	}
}

// A ranged request is encoded byte for byte as proto.Marshal encodes the
// message it stands for, put or get.
func TestRangedRequestEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cases := []rangedRequest{
		{},
		{clientID: "c", put: true},
		{objs: []Object{{Key: "k", Ranges: []Range{{}}}}},
		{objs: []Object{{Key: "k", Size: 0, Ranges: []Range{{}}}}, put: true},
		{objs: []Object{{Key: "", Size: math.MaxUint64}}, put: true}, // no ranges at all
		{clientID: "w", objs: []Object{{Key: "a", Size: 300, Ranges: []Range{{RegionBase: math.MaxUint64, Offset: 1 << 63, Size: 100, ObjectOffset: 200}, {Size: 200}}}, {Key: "é", Size: 1}}, put: true},
	}
	for n := range 50 {
		r := rangedRequest{clientID: fmt.Sprintf("client-%d", n), put: n%2 == 0}
		for i := range rng.IntN(100) {
			o := Object{Key: fmt.Sprintf("key-%d-%d", n, i), Size: rng.Uint64() >> rng.IntN(64)}
			for range rng.IntN(40) {
				o.Ranges = append(o.Ranges, Range{RegionBase: rng.Uint64() >> rng.IntN(64), Offset: rng.Uint64() >> rng.IntN(64), Size: rng.Uint64() >> rng.IntN(64), ObjectOffset: rng.Uint64() >> rng.IntN(64)})
			}
			r.objs = append(r.objs, o)
			r.ranges += len(o.Ranges)
		}
		cases = append(cases, r)
	}
	for i, r := range cases {
		checkEncoding(t, fmt.Sprintf("ranged case %d", i), r, &umbppb.BatchRangeDataRequest{})
	}
}

// checkEncoding checks that r encodes, after what b held, to the bytes
// proto.Marshal makes of r's message, and that they decode (into back) to
// that message.
func checkEncoding(t *testing.T, what string, r transferRequest, back proto.Message) {
	t.Helper()
	got := r.appendTo([]byte("prefix"))
	if !bytes.HasPrefix(got, []byte("prefix")) {
		t.Fatalf("%s: what was there before is lost", what)
	}
	got = got[len("prefix"):]
	m, release := r.message()
	defer release()
	want, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: encoded\n%x\nproto.Marshal encodes\n%x", what, got, want)
	}
	if err := proto.Unmarshal(got, back); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !proto.Equal(back, m) {
		t.Fatalf("%s: decodes to %v, want %v", what, back, m)
	}
}

// BenchmarkDataRequest encodes a 64 KiB job's request (256 keys), by hand
// and through the message and proto.Marshal.
func BenchmarkDataRequest(b *testing.B) {
	r := dataRequest{clientID: "umbp-go-worker-0123456789"}
	for i := range 256 {
		r.keys = append(r.keys, fmt.Sprintf("model/layer-block-%08d", i))
		r.segs = append(r.segs, Segment{RegionBase: 0x7f0000000000, Offset: uint64(i) << 16, Size: 64 << 10})
	}
	benchEncoding(b, r, 64<<10)
}

// BenchmarkRangedRequest encodes a ranged job's request (256 objects of 32
// ranges), by hand and through the message and proto.Marshal.
func BenchmarkRangedRequest(b *testing.B) {
	r := rangedRequest{clientID: "umbp-go-worker-0123456789", put: true}
	for i := range 256 {
		o := Object{Key: fmt.Sprintf("model/layer-block-%08d", i), Size: 64 << 10}
		for j := range 32 {
			o.Ranges = append(o.Ranges, Range{RegionBase: 0x7f0000000000, Offset: uint64(j*256+i) << 11, Size: 2 << 10, ObjectOffset: uint64(j) << 11})
		}
		r.objs = append(r.objs, o)
		r.ranges += len(o.Ranges)
	}
	benchEncoding(b, r, 1<<20)
}

// benchEncoding encodes r into a buffer of size bytes, by hand (appendTo)
// and as its message through proto.Marshal.
func benchEncoding(b *testing.B, r transferRequest, size int) {
	buf := make([]byte, 0, size)
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			buf = r.appendTo(buf[:0])
		}
	})
	b.Run("message", func(b *testing.B) {
		for b.Loop() {
			m, release := r.message()
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], m)
			release()
		}
	})
}
