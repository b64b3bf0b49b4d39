package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// runTransfer runs t to its end: first as a Run that may pause, then, if
// that one stopped, one that may not.
func runTransfer(t *testing.T, tr *Transfer) ([]bool, error) {
	t.Helper()
	if !tr.Run(true) && !tr.Run(false) {
		t.Fatal("Run(false) did not end the transfer")
	}
	return joined(tr.Result())
}

// A Transfer moves what BatchPut, BatchGet, BatchPutRanges and
// BatchGetRanges move, with the same answers, on a transfer connection
// that is idle.
func TestTransferMoves(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	r := hostRegion(t, c, 1<<20)
	const n, size = 8, 4096
	keys := make([]string, n)
	segs := make([]Segment, n)
	back := make([]Segment, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("t%02d", i)
		copy(r.mem[i*size:], pattern(i, size))
		segs[i] = r.seg(i*size, size)
		back[i] = r.seg(500_000+i*size, size)
	}
	if c.StartBatch(true, keys, segs) != nil {
		t.Fatal("StartBatch with no transfer connection yet: a transfer (it would dial)")
	}
	got, err := joined(c.BatchPut(context.Background(), keys[:1], segs[:1])) // dials one
	wantBools(t, "BatchPut", got, err, true)

	tr := c.StartBatch(true, keys, segs)
	if tr == nil {
		t.Fatal("StartBatch with a connection idle: nil")
	}
	got, err = runTransfer(t, tr)
	wantBools(t, "the put", got, err, trues(n)...)
	tr = c.StartBatch(false, append(keys, "missing"), append(back, r.seg(900_000, size)))
	got, err = runTransfer(t, tr)
	wantBools(t, "the get", got, err, append(trues(n), false)...)
	for i := range keys {
		if !bytes.Equal(r.mem[500_000+i*size:500_000+(i+1)*size], pattern(i, size)) {
			t.Fatalf("key %d: bytes differ", i)
		}
	}

	// Ranged: object i from two ranges, its halves swapped in memory.
	objs := make([]Object, n)
	into := make([]Object, n)
	for i := range objs {
		base := 200_000 + i*size
		copy(r.mem[base:], pattern(100+i, size/2))
		copy(r.mem[base+size/2:], pattern(200+i, size/2))
		objs[i] = Object{Key: fmt.Sprintf("r%02d", i), Size: size, Ranges: []Range{r.rng(base+size/2, size/2, size/2), r.rng(base, size/2, 0)}}
		into[i] = Object{Key: objs[i].Key, Ranges: []Range{r.rng(600_000+i*size, size, 0)}}
	}
	got, err = runTransfer(t, c.StartRanges(true, objs))
	wantBools(t, "the ranged put", got, err, trues(n)...)
	got, err = runTransfer(t, c.StartRanges(false, into))
	wantBools(t, "the ranged get", got, err, trues(n)...)
	for i := range into {
		want := append(pattern(100+i, size/2), pattern(200+i, size/2)...)
		if !bytes.Equal(r.mem[600_000+i*size:600_000+(i+1)*size], want) {
			t.Fatalf("object %d: bytes differ", i)
		}
	}

	// Paused before it ran: it stops at once, and a Run that may not
	// pause makes it.
	tr = c.StartBatch(false, keys[:2], back[:2])
	tr.Pause()
	if tr.Run(true) {
		t.Fatal("Run(true) after Pause ended the transfer")
	}
	if !tr.Run(false) {
		t.Fatal("Run(false) did not end the transfer")
	}
	got, err = joined(tr.Result())
	wantBools(t, "the paused get", got, err, true, true)

	// Aborted before it ran: nothing sent, every key failed as not sent,
	// the connection given back for the next.
	tr = c.StartBatch(true, []string{"aborted"}, segs[:1])
	tr.Abort()
	tr.Abort()
	if !tr.Run(true) {
		t.Fatal("an aborted transfer has not ended")
	}
	if got, err := joined(tr.Result()); !errors.Is(err, rpc.ErrNotSent) || got[0] {
		t.Fatalf("the aborted transfer: %v, %v", got, err)
	}
	if tr = c.StartBatch(false, keys[:1], back[:1]); tr == nil {
		t.Fatal("StartBatch after an abort: nil (the connection was not given back)")
	}
	got, err = runTransfer(t, tr)
	wantBools(t, "the get after an abort", got, err, true)
	if got, _ := joined(c.BatchExists(context.Background(), []string{"aborted"})); got[0] {
		t.Fatal("the aborted store reached the server")
	}
}

// StartBatch and StartRanges begin nothing for what BatchPut and its
// siblings would send as several requests, or refuse, and without
// lock-step transfers.
func TestTransferNotStarted(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	r := hostRegion(t, c, 1<<20)
	wantBools(t, "BatchPut", must(c.BatchPut(context.Background(), []string{"k"}, []Segment{r.seg(0, 10)})), nil, true)
	if c.StartBatch(true, nil, nil) != nil || c.StartRanges(true, nil) != nil {
		t.Error("an empty batch: a transfer")
	}
	if c.StartBatch(true, []string{"a", "b"}, []Segment{r.seg(0, 10)}) != nil {
		t.Error("2 keys and 1 segment: a transfer")
	}
	many := make([]Object, 2)
	for i := range many {
		many[i] = Object{Key: fmt.Sprint(i), Size: uint64(partRanges), Ranges: make([]Range, partRanges)}
		for j := range many[i].Ranges {
			many[i].Ranges[j] = r.rng(j, 1, j)
		}
	}
	if c.StartRanges(true, many) != nil {
		t.Error("two parts' worth of ranges: a transfer")
	}
	func() {
		setLimit(t, 200)
		keys := keysN(40)
		segs := make([]Segment, len(keys))
		for i := range segs {
			segs[i] = r.seg(i, 1)
		}
		if c.StartBatch(true, keys, segs) != nil {
			t.Error("a batch over the message limit: a transfer")
		}
	}()
	viaGRPC := dial(t, srv.Endpoint(), func(o *Options) { o.GRPCTransfers = true })
	hostRegion(t, viaGRPC, 4096)
	if viaGRPC.StartBatch(true, []string{"k"}, []Segment{r.seg(0, 10)}) != nil {
		t.Error("GRPCTransfers: a transfer")
	}
	_ = c.Close()
	if c.StartBatch(true, []string{"k"}, []Segment{r.seg(0, 10)}) != nil {
		t.Error("a closed connection: a transfer")
	}
}

func must(ok []bool, errs []error) []bool {
	if Joined(errs) != nil {
		return nil
	}
	return ok
}

// A reply of the wrong length fails every key of the transfer, as it
// fails BatchPut's.
func TestTransferWrongLength(t *testing.T) {
	f := startFake(t)
	c := dial(t, f.endpoint)
	segs := []Segment{{RegionBase: 1, Size: 1}, {RegionBase: 1, Offset: 1, Size: 1}}
	if _, err := joined(c.BatchPut(context.Background(), []string{"a", "b"}, segs)); err != nil {
		t.Fatal(err)
	}
	f.setHandler(func(context.Context, string, proto.Message) (proto.Message, error) {
		return &umbppb.BatchBoolResponse{Ok: []bool{true}}, nil
	})
	tr := c.StartBatch(true, []string{"a", "b"}, segs)
	if tr == nil {
		t.Fatal("StartBatch: nil")
	}
	got, err := runTransfer(t, tr)
	if !errors.Is(err, rpc.ErrBadReply) || len(got) != 2 {
		t.Fatalf("1 result for 2 keys: %v, %v", got, err)
	}
}
