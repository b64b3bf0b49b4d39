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
	// move runs kind for items and returns each item's result and, when
	// a request failed, each item's error: that of the request that carried
	// it (nil where it was answered). The results have one entry per item,
	// always; errs is nil when every request was answered.
	move(ctx context.Context, kind jobKind, items []item) (ok []bool, errs []error)
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

// newTransport returns the transport for the connection c; staging is the
// handle's staging pool, which a server without ranged I/O needs.
func newTransport(c *conn.Conn, staging *stagingPool) transport {
	if c.Capabilities().RangedIO {
		return rangedTransport{c: c}
	}
	return segmentTransport{c: c, staging: staging}
}

// transport returns the transport of c, the handle's current connection,
// made once for it. w.mu is held.
func (w *WorkerHandle) transport(c *conn.Conn) transport {
	if w.tr == nil || w.tr.conn() != c {
		w.tr = newTransport(c, w.staging)
	}
	return w.tr
}

// rangedTransport moves items on a server with ranged I/O. Items of one
// host range go as plain segments, in one BatchPut or BatchGet (servers copy
// those with less work a range than ranged calls); the others with
// BatchPutRanges and BatchGetRanges, which the connection sends in parts.
type rangedTransport struct{ c *conn.Conn }

func (t rangedTransport) ranged() bool     { return true }
func (t rangedTransport) conn() *conn.Conn { return t.c }

// flush returns at once: a server offers ranged I/O only with its SSD tier
// off, so its Flush has nothing to finish and would cost a round trip.
func (t rangedTransport) flush(context.Context) error { return nil }

func (t rangedTransport) move(ctx context.Context, kind jobKind, items []item) ([]bool, []error) {
	plain, other := splitItems(items, (*item).plain)
	results := make([]bool, len(items))
	var itemErrs []error
	if len(other) == 0 {
		plainBatch(ctx, t.c, kind, items, plain, results, &itemErrs)
		return results, itemErrs
	}
	// The plain request, if any, runs beside the ranged parts; it is
	// waited for whatever happens to them (a panic included), so that
	// nothing of the job's is in flight once move returns.
	done := make(chan struct{})
	var plainErrs []error
	if len(plain) > 0 {
		go func() {
			defer close(done)
			plainBatch(ctx, t.c, kind, items, plain, results, &plainErrs)
		}()
	} else {
		close(done)
	}
	defer func() { <-done }()
	objs := make([]conn.Object, len(other))
	for i, k := range other {
		objs[i] = items[k].obj
	}
	call := t.c.BatchGetRanges
	if kind == kindStore {
		call = t.c.BatchPutRanges
	}
	got, gotErrs := call(ctx, objs)
	<-done
	itemErrs = plainErrs
	for i, k := range other {
		results[k] = got[i]
		if gotErrs != nil && gotErrs[i] != nil {
			setErr(&itemErrs, len(items), k, gotErrs[i])
		}
	}
	return results, itemErrs
}

// setErr records item k's error in *errs (of n items), made on first use.
func setErr(errs *[]error, n, k int, err error) {
	if *errs == nil {
		*errs = make([]error, n)
	}
	(*errs)[k] = err
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
func (t segmentTransport) flush(ctx context.Context) error {
	_, err := t.c.Flush(ctx)
	return err
}

func (t segmentTransport) move(ctx context.Context, kind jobKind, items []item) ([]bool, []error) {
	results := make([]bool, len(items))
	var itemErrs []error
	single, multi := splitItems(items, func(it *item) bool { return it.single })
	plainBatch(ctx, t.c, kind, items, single, results, &itemErrs)
	if len(multi) > 0 {
		t.staging.move(ctx, t.c, kind, items, multi, results, &itemErrs)
	}
	return results, itemErrs
}

// plainBatch moves the single-range items at indexes at in one BatchPut or
// BatchGet (cut by the connection at the message limit), recording each
// one's result and, where its request failed, that request's error.
func plainBatch(ctx context.Context, c *conn.Conn, kind jobKind, items []item, at []int, results []bool, itemErrs *[]error) {
	if len(at) == 0 {
		return
	}
	keys := make([]string, len(at))
	segs := make([]conn.Segment, len(at))
	for i, k := range at {
		r := items[k].obj.Ranges[0]
		keys[i] = items[k].obj.Key
		segs[i] = conn.Segment{RegionBase: r.RegionBase, Offset: r.Offset, Size: r.Size}
	}
	var got []bool
	var errs []error
	if kind == kindStore {
		got, errs = c.BatchPut(ctx, keys, segs)
	} else {
		got, errs = c.BatchGet(ctx, keys, segs)
	}
	for i, k := range at {
		results[k] = got[i]
		if errs != nil && errs[i] != nil {
			setErr(itemErrs, len(items), k, errs[i])
		}
	}
}
