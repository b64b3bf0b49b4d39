package umbp

import (
	"context"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// transport moves a job's items on one connection. The handle chooses one
// by what the server said of itself when the connection attached: ranged
// I/O (one scatter/gather request a part) or plain segments (single-range
// items as they are, multi-range ones through a staging buffer).
type transport interface {
	// move runs kind for items: each item's result and, where the request
	// that carried it failed, that request's error.
	move(ctx context.Context, kind jobKind, items []item) results
	// flush asks the server to finish what its tiers have pending (copies
	// on to its SSD tier, which can hold up eviction); a refused store's
	// retry comes after one. Where there is no lower tier it returns nil at
	// once. What the server answered does not matter to a retry: only a
	// transport failure does.
	flush(ctx context.Context) error
	// ranged reports whether multi-range items move as they are.
	ranged() bool
	// conn is the connection the transport uses.
	conn() *conn.Conn
}

// starter is a transport that can begin the move of items as one
// lock-step request (conn.Transfer) when they go as one and a transfer
// connection is idle now, for a Wait to run on its own goroutine
// (waited.go); start returns nil otherwise, and move moves them. Both of
// the handle's transports are.
type starter interface {
	start(kind jobKind, items []item) *oneRequest
}

// newTransport returns the transport for the connection c; staging is the
// handle's staging pool, which a server without ranged I/O needs.
func newTransport(c *conn.Conn, staging *stagingPool) transport {
	if c.Capabilities().RangedIO {
		return rangedTransport{c: c}
	}
	return segmentTransport{c: c, staging: staging}
}

// rangedTransport moves items on a server with ranged I/O. Items of one
// host range go as plain segments, in one BatchPut or BatchGet (servers copy
// those with less work a range than ranged calls); the others with
// BatchPutRanges and BatchGetRanges, which the connection sends in parts.
type rangedTransport struct{ c *conn.Conn }

func (t rangedTransport) ranged() bool     { return true }
func (t rangedTransport) conn() *conn.Conn { return t.c }

// start: every item plain, as one BatchPut or BatchGet; or none plain, as
// one part of BatchPutRanges or BatchGetRanges.
func (t rangedTransport) start(kind jobKind, items []item) *oneRequest {
	plain := 0
	for k := range items {
		if items[k].plain() {
			plain++
		}
	}
	switch plain {
	case len(items):
		return startSegments(t.c, kind, items)
	case 0:
		objs := make([]conn.Object, len(items))
		for k := range items {
			objs[k] = items[k].obj
		}
		if tr := t.c.StartRanges(kind == kindStore, objs); tr != nil {
			return &oneRequest{Transfer: tr}
		}
	}
	return nil
}

// flush returns at once: a server offers ranged I/O only with its SSD tier
// off, so its Flush has nothing to finish and would cost a round trip.
func (t rangedTransport) flush(context.Context) error { return nil }

func (t rangedTransport) move(ctx context.Context, kind jobKind, items []item) results {
	plain, other := splitItems(items, (*item).plain)
	r := newResults(len(items))
	if len(other) == 0 {
		plainBatch(ctx, t.c, kind, items, plain, &r)
		return r
	}
	// The plain request, if any, runs beside the ranged parts, into its
	// own results; it is waited for whatever happens to them (a panic
	// included), so that nothing of the job's is in flight once move
	// returns.
	done := make(chan struct{})
	pr := newResults(len(items))
	if len(plain) > 0 {
		go func() {
			defer close(done)
			plainBatch(ctx, t.c, kind, items, plain, &pr)
		}()
	} else {
		close(done)
	}
	defer func() { <-done }()
	objs := make([]conn.Object, len(other))
	for i, k := range other {
		objs[i] = items[k].obj
	}
	send := t.c.BatchGetRanges
	if kind == kindStore {
		send = t.c.BatchPutRanges
	}
	ok, errs := send(ctx, objs)
	r.from(other, ok, errs)
	<-done
	for _, k := range plain {
		r.set(k, pr.ok[k], pr.err(k))
	}
	return r
}

// segmentTransport moves items on a server without ranged I/O: single-range
// items as plain segments (BatchPut, BatchGet), multi-range items through
// its staging buffers.
type segmentTransport struct {
	c       *conn.Conn
	staging *stagingPool
}

func (t segmentTransport) ranged() bool     { return false }
func (t segmentTransport) conn() *conn.Conn { return t.c }

// start: every item of one range, as one BatchPut or BatchGet (a staged
// item never goes so).
func (t segmentTransport) start(kind jobKind, items []item) *oneRequest {
	for k := range items {
		if !items[k].single {
			return nil
		}
	}
	return startSegments(t.c, kind, items)
}
func (t segmentTransport) flush(ctx context.Context) error {
	_, err := t.c.Flush(ctx)
	return err
}

func (t segmentTransport) move(ctx context.Context, kind jobKind, items []item) results {
	r := newResults(len(items))
	single, multi := splitItems(items, func(it *item) bool { return it.single })
	plainBatch(ctx, t.c, kind, items, single, &r)
	if len(multi) > 0 {
		t.staging.move(ctx, t.c, kind, items, multi, &r)
	}
	return r
}

// oneRequest is the move of a job's items as one lock-step request, item
// k its entry k, with the arrays it was begun from (the request is sent
// again from them if it cannot go lock-step after all).
type oneRequest struct {
	*conn.Transfer
	keys []string
	segs []conn.Segment
}

// startSegments begins the move of single-range items as one BatchPut or
// BatchGet.
func startSegments(c *conn.Conn, kind jobKind, items []item) *oneRequest {
	keys, segs := plainArrays(items, nil)
	tr := c.StartBatch(kind == kindStore, keys, segs)
	if tr == nil {
		keySlabs.Put(keys)
		segmentSlabs.Put(segs)
		return nil
	}
	return &oneRequest{Transfer: tr, keys: keys, segs: segs}
}

// results is the ended request's answer, item by item.
func (m *oneRequest) results() results {
	ok, errs := m.Result()
	m.release()
	return results{ok: ok, errs: errs}
}

// abort ends a request no Run was made for, having sent nothing.
func (m *oneRequest) abort() {
	m.Abort()
	m.release()
}

// release gives back the arrays the request was begun from, once it has
// ended.
func (m *oneRequest) release() {
	if m.keys != nil {
		keySlabs.Put(m.keys)
		segmentSlabs.Put(m.segs)
		m.keys, m.segs = nil, nil
	}
}
