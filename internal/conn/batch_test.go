package conn

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestCutParts(t *testing.T) {
	obj := func(ranges int, size uint64) Object {
		return Object{Size: size, Ranges: make([]Range, ranges)}
	}
	var objs []Object
	q := partRanges * 300 / 1024 // 3 of these fall short of a part, 4 make one
	for range 10 {
		objs = append(objs, obj(q, 1<<20))
	}
	for range 3 {
		objs = append(objs, obj(1, 16<<20))
	}
	objs = append(objs, obj(2*partRanges, 1))
	// Objects 8-11 close on bytes (2 MiB, then 16 more twice); 12 and 13 on
	// ranges; the last part is what is left.
	cutParts := func(objs []Object) []rpc.Span {
		k := rpc.Cutter{Op: "test", Limit: maxRequestBytes, PartRanges: partRanges, PartBytes: partBytes}
		spans, err := k.Cut(len(objs), func(i int) rpc.Cost {
			return rpc.Cost{Wire: 1, Ranges: len(objs[i].Ranges), Bytes: objs[i].Size}
		})
		if err != nil {
			t.Fatal(err)
		}
		return spans
	}
	want := []rpc.Span{{Start: 0, End: 4}, {Start: 4, End: 8}, {Start: 8, End: 12}, {Start: 12, End: 14}}
	if got := cutParts(objs); !slices.Equal(got, want) {
		t.Fatalf("cut = %v, want %v", got, want)
	}
	if got := cutParts(objs[:1]); !slices.Equal(got, []rpc.Span{{Start: 0, End: 1}}) {
		t.Fatalf("one object: %v", got)
	}
}

// TestRangedPartsErrors: a ranged batch of several parts, sent
// concurrently, gives each object the answer of its own part: the failed
// part's error for its objects, nil and the server's results for the rest;
// and Joined says the failure once.
func TestRangedPartsErrors(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	objs := make([]Object, 3)
	for i := range objs {
		rs := make([]Range, partRanges) // each object closes a part
		for j := range rs {
			rs[j] = Range{RegionBase: 1 << 20, Offset: uint64(j) * 8, Size: 8, ObjectOffset: uint64(j) * 8}
		}
		objs[i] = Object{Key: string(rune('a' + i)), Ranges: rs, Size: 8 * partRanges}
	}
	f.setHandler(func(_ context.Context, _ string, req proto.Message) (proto.Message, error) {
		r := req.(*umbppb.BatchRangeDataRequest)
		if r.Keys[0] == "b" {
			return nil, status.Error(codes.Internal, "part b failed")
		}
		return &umbppb.BatchBoolResponse{Ok: []bool{true}}, nil
	})
	f.take() // the dial's Ping
	for _, put := range []bool{true, false} {
		call := c.BatchGetRanges
		if put {
			call = c.BatchPutRanges
		}
		got, errs := call(context.Background(), objs)
		if calls := f.take(); len(calls) != 3 {
			t.Fatalf("put %v: %d requests, want 3 parts", put, len(calls))
		}
		if !slices.Equal(got, []bool{true, false, true}) || len(errs) != 3 {
			t.Fatalf("put %v: results %v, errors %v", put, got, errs)
		}
		if errs[0] != nil || errs[2] != nil || status.Code(errs[1]) != codes.Internal {
			t.Fatalf("put %v: errors %v, want part b's alone", put, errs)
		}
		if err := Joined(errs); err != errs[1] {
			t.Fatalf("Joined = %v, want part b's error", err)
		}
	}
	if Joined(nil) != nil || Joined(make([]error, 3)) != nil {
		t.Fatal("Joined of no failure is not nil")
	}
	e1, e2 := errors.New("one"), errors.New("two")
	if err := Joined([]error{e1, nil, e1, e2, e1}); !errors.Is(err, e1) || !errors.Is(err, e2) || err.Error() != "one\ntwo" {
		t.Fatalf("Joined = %q", err)
	}
}

// joined is a batch's answer with its entries' errors joined, as most
// tests read it.
func joined(ok []bool, errs []error) ([]bool, error) { return ok, Joined(errs) }
