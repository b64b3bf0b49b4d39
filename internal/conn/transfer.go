package conn

import (
	"context"
	"errors"
	"fmt"

	"github.com/umbp-go/umbp-go/internal/h2call"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// Transfer is a batch that goes as one lock-step request, made by
// whichever goroutine calls Run, one Run at a time, and which can stop at
// a bound without being lost: Pause makes a Run that may pause return
// early, and a later Run, on any goroutine, goes on with it (h2call.Call).
// It is begun by StartBatch or StartRanges; Result then answers as BatchPut
// (or its sibling) would have for the same batch.
//
// The keys, segments and objects it was begun with must stay unchanged
// until Run has reported its end: a request that could not go lock-step
// after all is sent again through the gRPC channel from them.
type Transfer struct {
	c      *Conn
	op     string
	method string
	n      int
	req    transferRequest
	buf    *[]byte // the encoded request, until the call has ended
	call   *h2call.Call
	ran    bool // Run or Abort was called
	grpc   bool // the lock-step call was not sent: the gRPC channel's turn
	resp   umbppb.BatchBoolResponse
	ended  bool
	err    error // the request's, once ended
}

// StartBatch begins BatchPut (put) or BatchGet of keys at segs as a
// Transfer when the batch is one request and a transfer connection is
// free and idle now; nothing is written yet. It returns nil otherwise, and
// the caller then makes the batch with BatchPut or BatchGet. Entries are
// sent as they are, as those send them.
func (c *Conn) StartBatch(put bool, keys []string, segs []Segment) *Transfer {
	op, method := "BatchGet", umbppb.UMBPStandalone_BatchGet_FullMethodName
	if put {
		op, method = "BatchPut", umbppb.UMBPStandalone_BatchPut_FullMethodName
	}
	if c.transfers == nil || len(keys) == 0 || c.usable(op) != nil {
		return nil
	}
	var one [1]rpc.Span
	if spans, err := dataSpans(op, len(c.clientID), keys, segs, &one); err != nil || len(spans) != 1 {
		return nil
	}
	return c.start(op, method, len(keys), dataRequest{clientID: c.clientID, keys: keys, segs: segs})
}

// StartRanges begins BatchPutRanges (put) or BatchGetRanges of objs as a
// Transfer when the batch is one part (see BatchPutRanges), under
// StartBatch's rules otherwise.
func (c *Conn) StartRanges(put bool, objs []Object) *Transfer {
	op, method := "BatchGetRanges", umbppb.UMBPStandalone_BatchGetRanges_FullMethodName
	if put {
		op, method = "BatchPutRanges", umbppb.UMBPStandalone_BatchPutRanges_FullMethodName
	}
	if c.transfers == nil || len(objs) == 0 || c.usable(op) != nil {
		return nil
	}
	spans, total, err := rangedSpans(op, len(c.clientID), objs, put)
	if err != nil || len(spans) != 1 {
		return nil
	}
	return c.start(op, method, len(objs), rangedRequest{clientID: c.clientID, objs: objs, ranges: total, put: put})
}

func (c *Conn) start(op, method string, n int, req transferRequest) *Transfer {
	t := &Transfer{c: c, op: op, method: method, n: n, req: req, buf: transferBufs.Get().(*[]byte)}
	*t.buf = req.appendTo((*t.buf)[:0])
	t.call = c.transfers.TryStart(method, *t.buf, &t.resp)
	if t.call == nil {
		t.release()
		return nil
	}
	return t
}

// Run makes the request, or goes on with it, and reports whether it has
// ended. With mayPause it returns false, not ended, once Pause has been
// called, and also before the request is sent again (on another
// connection, or through the gRPC channel); without, only at its end.
func (t *Transfer) Run(mayPause bool) bool {
	if t.ended {
		return true
	}
	t.ran = true
	if !t.grpc {
		if !t.call.Run(mayPause) {
			return false
		}
		err := t.call.Err()
		t.release()
		if !errors.Is(err, rpc.ErrNotSent) {
			t.end(err)
			return true
		}
		// Not sent lock-step: through the gRPC channel, as invokeTransfer
		// does, by a Run that need not stop.
		t.grpc = true
		if mayPause {
			return false
		}
	}
	m, release := t.req.message()
	err := t.c.cc.Invoke(context.Background(), t.method, m, &t.resp)
	release()
	t.end(err)
	return true
}

func (t *Transfer) end(err error) {
	if err != nil {
		err = t.c.rpcError(context.Background(), t.op, err)
	}
	t.err, t.ended = err, true
}

func (t *Transfer) release() {
	if cap(*t.buf) <= maxKeptTransferBuf {
		transferBufs.Put(t.buf)
	}
	t.buf = nil
}

// Abort ends a transfer no Run has been made for, having sent nothing
// (its Result fails every entry as not sent), and gives its connection
// back.
func (t *Transfer) Abort() {
	if t.ran {
		return
	}
	t.ran = true
	t.call.Abort()
	t.release()
	t.err, t.ended = fmt.Errorf("%s: %w: aborted before it was sent", t.op, rpc.ErrNotSent), true
}

// Pause makes the Run in progress, if it may pause, return early; see
// h2call.Call.Pause. It may be called from any goroutine.
func (t *Transfer) Pause() { t.call.Pause() }

// Result is the batch's answer once Run has reported its end, as BatchPut,
// BatchGet, BatchPutRanges or BatchGetRanges answer.
func (t *Transfer) Result() (ok []bool, errs []error) {
	err := t.err
	got := t.resp.GetOk()
	if err == nil && len(got) != t.n {
		err = rpc.BadReply(t.op, "%d results for %d keys", len(got), t.n)
	}
	if err != nil {
		return make([]bool, t.n), failAll(t.n, err)
	}
	return got, nil
}
