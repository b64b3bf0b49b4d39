package conn

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"

	"github.com/umbp-go/umbp-go/internal/rpc"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Segment names memory of a registered region: Size bytes at Offset from
// RegionBase, the worker_base the region was registered with.
type Segment struct {
	RegionBase uint64
	Offset     uint64
	Size       uint64
}

// Range is one piece of a ranged (scatter/gather) transfer: Size bytes at
// Offset from the registered region RegionBase, which are the bytes at
// ObjectOffset of the stored object.
type Range struct {
	RegionBase   uint64
	Offset       uint64
	Size         uint64
	ObjectOffset uint64
}

// Object is one key of a ranged batch with its ranges, in order. Size is the
// whole object's size, sent on a put only.
type Object struct {
	Key    string
	Ranges []Range
	Size   uint64
}

// BatchPut stores keys[i] from segs[i]. The result has one entry per key,
// always: true where the server stored the key or already held it. errs is
// nil when every request was answered; otherwise each key's entry is the
// error of the request that carried it (nil for keys answered). A batch
// beyond the message limit is several requests, so the server's
// all-or-nothing rule applies per request, and a key repeated across two of
// them keeps the first value rather than the later one.
//
// Entries are sent as they are: the caller checked them (umbp's plans, and
// the segments it makes itself): keys not empty and UTF-8, segments of a
// registered region, not empty and within the address space.
func (c *Conn) BatchPut(ctx context.Context, keys []string, segs []Segment) (ok []bool, errs []error) {
	return c.batchData(ctx, "BatchPut", keys, segs, umbppb.UMBPStandalone_BatchPut_FullMethodName)
}

// BatchGet loads keys[i] into segs[i], under the same rules as BatchPut.
func (c *Conn) BatchGet(ctx context.Context, keys []string, segs []Segment) (ok []bool, errs []error) {
	return c.batchData(ctx, "BatchGet", keys, segs, umbppb.UMBPStandalone_BatchGet_FullMethodName)
}

func (c *Conn) batchData(ctx context.Context, op string, keys []string, segs []Segment, method string) ([]bool, []error) {
	n := len(keys)
	if err := c.usable(op); err != nil {
		return make([]bool, n), failAll(n, err)
	}
	if n == 0 && len(segs) == 0 {
		return []bool{}, nil
	}
	var one [1]rpc.Span
	spans, err := dataSpans(op, len(c.clientID), keys, segs, &one)
	if err != nil {
		return make([]bool, n), failAll(n, err)
	}
	return c.run(ctx, op, n, spans, 1, func(ctx context.Context, s rpc.Span) ([]bool, error) {
		req := dataRequest{clientID: c.clientID, keys: keys[s.Start:s.End], segs: segs[s.Start:s.End]}
		resp := new(umbppb.BatchBoolResponse)
		if err := c.invokeTransfer(ctx, method, req, resp); err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		return resp.GetOk(), nil
	})
}

// dataSpans cuts a BatchPut's or BatchGet's keys (at segs) into requests;
// a batch far below the message limit is one, one[0], without sizing each
// entry. It fails for mismatched lengths, and for an entry that cannot fit
// a request.
func dataSpans(op string, clientID int, keys []string, segs []Segment, one *[1]rpc.Span) ([]rpc.Span, error) {
	n := len(keys)
	if len(segs) != n {
		return nil, rpc.Invalid(op, "%d keys but %d segments", n, len(segs))
	}
	fixed := fixedCost(clientID, 3)
	bound := fixed // a request far below the limit is one span
	for _, k := range keys {
		bound += rpc.BytesField(len(k)) + 3*binary.MaxVarintLen64
	}
	if bound <= maxRequestBytes {
		one[0] = rpc.Span{Start: 0, End: n}
		return one[:], nil
	}
	return rpc.Cutter{Op: op, Fixed: fixed, Limit: maxRequestBytes}.Cut(n, func(i int) rpc.Cost {
		s := segs[i]
		return rpc.Cost{Wire: rpc.BytesField(len(keys[i])) + varint(s.Offset) + varint(s.Size) + varint(s.RegionBase)}
	})
}

// BatchPutRanges stores each object from its ranges (v2), which must tile
// [0, Size) of the object: the server answers false for an object whose
// ranges do not. Results and errors are as for BatchPut. The batch goes in
// parts of about partRanges ranges or partBytes bytes (and within the
// message limit), up to partsInFlight at a time, so that the server copies
// one part while the next is encoded, sent and prepared; parts are
// independent requests, so a batch that names one new key twice may have it
// stored once. A v1 server answers with an error wrapping ErrUnimplemented.
// Objects are sent as they are, checked by the caller as BatchPut's
// entries are: each with at least one range, none empty or overflowing.
func (c *Conn) BatchPutRanges(ctx context.Context, objs []Object) (ok []bool, errs []error) {
	return c.batchRanges(ctx, "BatchPutRanges", objs, true)
}

// BatchGetRanges loads the given ranges of each object (v2): any subset of
// its bytes. Object.Size is not sent, but counts towards a part's bytes.
// Results, errors and parts are as for BatchPutRanges.
func (c *Conn) BatchGetRanges(ctx context.Context, objs []Object) (ok []bool, errs []error) {
	return c.batchRanges(ctx, "BatchGetRanges", objs, false)
}

func (c *Conn) batchRanges(ctx context.Context, op string, objs []Object, put bool) ([]bool, []error) {
	n := len(objs)
	if err := c.usable(op); err != nil {
		return make([]bool, n), failAll(n, err)
	}
	if n == 0 {
		return []bool{}, nil
	}
	spans, total, err := rangedSpans(op, len(c.clientID), objs, put)
	if err != nil {
		return make([]bool, n), failAll(n, err)
	}
	return c.run(ctx, op, n, spans, partsInFlight, c.rangedCall(op, objs, total, put))
}

// rangedSpans cuts a ranged batch into parts (see BatchPutRanges), and
// counts its ranges.
func rangedSpans(op string, clientID int, objs []Object, put bool) (spans []rpc.Span, total int, err error) {
	for _, o := range objs {
		total += len(o.Ranges)
	}
	packed := 5 // range_counts, shm_offsets, region_bases, sizes, object_offsets
	if put {
		packed++ // object_sizes
	}
	fixed := fixedCost(clientID, packed)
	// A request far below the message limit need not size every range's
	// varints: parts are cut by ranges and bytes alone.
	bound := fixed + total*4*binary.MaxVarintLen64
	for _, o := range objs {
		bound += rpc.BytesField(len(o.Key)) + 2*binary.MaxVarintLen64
	}
	exact := bound > maxRequestBytes
	spans, err = rpc.Cutter{Op: op, Fixed: fixed, Limit: maxRequestBytes, PartRanges: partRanges, PartBytes: partBytes}.Cut(len(objs), func(i int) rpc.Cost {
		o := &objs[i]
		ec := rpc.Cost{Ranges: len(o.Ranges), Bytes: o.Size}
		if exact {
			ec.Wire = rpc.BytesField(len(o.Key)) + varint(uint64(len(o.Ranges)))
			if put {
				ec.Wire += varint(o.Size)
			}
			for _, r := range o.Ranges {
				ec.Wire += varint(r.Offset) + varint(r.RegionBase) + varint(r.Size) + varint(r.ObjectOffset)
			}
		}
		return ec
	})
	return spans, total, err
}

// rangedCall returns the call that sends the span s of objs (total ranges
// in all) as one ranged request.
func (c *Conn) rangedCall(op string, objs []Object, total int, put bool) func(context.Context, rpc.Span) ([]bool, error) {
	n := len(objs)
	method := umbppb.UMBPStandalone_BatchGetRanges_FullMethodName
	if put {
		method = umbppb.UMBPStandalone_BatchPutRanges_FullMethodName
	}
	return func(ctx context.Context, s rpc.Span) ([]bool, error) {
		chunk := objs[s.Start:s.End]
		ranges := total
		if s.Len() != n {
			ranges = 0
			for _, o := range chunk {
				ranges += len(o.Ranges)
			}
		}
		req := rangedRequest{clientID: c.clientID, objs: chunk, ranges: ranges, put: put}
		resp := new(umbppb.BatchBoolResponse)
		if err := c.invokeTransfer(ctx, method, req, resp); err != nil {
			return nil, c.rpcError(ctx, op, err)
		}
		return resp.GetOk(), nil
	}
}

// invokeTransfer sends a transfer's request: lock-step on a transfer
// connection that is free, else (every one busy, Options.GRPCTransfers, or
// a lock-step call that could not go out: rpc.ErrNotSent) through the
// gRPC channel. Either way the request is made once.
func (c *Conn) invokeTransfer(ctx context.Context, method string, req transferRequest, resp proto.Message) error {
	if c.transfers != nil {
		buf := transferBufs.Get().(*[]byte)
		b := req.appendTo((*buf)[:0])
		sent, err := c.transfers.TryInvoke(ctx, method, b, resp)
		if cap(b) <= maxKeptTransferBuf {
			*buf = b
			transferBufs.Put(buf)
		}
		if sent && !errors.Is(err, rpc.ErrNotSent) {
			return err
		}
	}
	m, release := req.message()
	defer release()
	return c.cc.Invoke(ctx, method, m, resp)
}

// transferBufs recycles the encoded requests of lock-step transfers (h2call
// reads a request only until its call returns); one larger than
// maxKeptTransferBuf is left to the collector.
var transferBufs = sync.Pool{New: func() any { return new([]byte) }}

const maxKeptTransferBuf = 1 << 20

// boolReply turns a BoolResponse into (ok, nil), (false, nil) for a plain
// false, or (false, *RefusedError) when the server gave a reason.
func boolReply(op string, resp *umbppb.BoolResponse) (bool, error) {
	if resp.GetOk() {
		return true, nil
	}
	if r := resp.GetError(); r != "" {
		return false, refused(op, r)
	}
	return false, nil
}
