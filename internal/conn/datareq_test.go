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
		got, err := r.appendTo([]byte("prefix"))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("case %d: what was there before is lost", i)
		}
		got = got[len("prefix"):]
		want, err := proto.Marshal(r.message())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: encoded\n%x\nproto.Marshal encodes\n%x", i, got, want)
		}
		var back umbppb.BatchDataRequest
		if err := proto.Unmarshal(got, &back); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !proto.Equal(&back, r.message()) {
			t.Fatalf("case %d: decodes to %v, want %v", i, &back, r.message())
		}
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
	buf := make([]byte, 0, 64<<10)
	b.Run("hand", func(b *testing.B) {
		for b.Loop() {
			buf, _ = r.appendTo(buf[:0])
		}
	})
	b.Run("message", func(b *testing.B) {
		for b.Loop() {
			buf, _ = messageRequest{r.message()}.appendTo(buf[:0])
		}
	})
}
