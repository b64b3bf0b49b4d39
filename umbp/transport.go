package umbp

import (
	"context"
	"errors"
	"sync"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// transport moves a job's items on one connection. The handle chooses one
// by what the server said of itself when the connection attached: ranged
// I/O (one scatter/gather request a part) or plain segments (single-range
// items as they are, multi-range ones through a staging buffer).
type transport interface {
	// move runs kind for items and returns each item's result and the
	// error of the request that carried it (nil where that request was
	// answered), and every such error joined. The results have one entry
	// per item, always.
	move(ctx context.Context, kind jobKind, items []item) (ok []bool, errs []error, err error)
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

// transportFor returns the transport for the connection c.
func (w *WorkerHandle) transportFor(c *conn.Conn) transport {
	if c.Capabilities().RangedIO {
		return rangedTransport{c: c}
	}
	return segmentTransport{c: c, w: w}
}

// rangedTransport moves items on a server with ranged I/O. Items of one
// host range go as plain segments, in one BatchPut or BatchGet (servers copy
// those with less work a range than ranged calls); the others with
// BatchPutRanges and BatchGetRanges, in parts run concurrently (each split
// further by the connection at the message limit). Parts are independent
// requests: a job that names one new key twice may have it stored once.
type rangedTransport struct{ c *conn.Conn }

func (t rangedTransport) ranged() bool     { return true }
func (t rangedTransport) conn() *conn.Conn { return t.c }

// flush returns at once: a server offers ranged I/O only with its SSD tier
// off, so its Flush has nothing to finish and would cost a round trip.
func (t rangedTransport) flush(context.Context) error { return nil }

func (t rangedTransport) move(ctx context.Context, kind jobKind, items []item) ([]bool, []error, error) {
	var plain, other []int
	for k := range items {
		if items[k].plain() {
			plain = append(plain, k)
		} else {
			other = append(other, k)
		}
	}
	if len(other) == 0 {
		results := make([]bool, len(items))
		itemErrs := make([]error, len(items))
		err := plainBatch(ctx, t.c, kind, items, plain, results, itemErrs)
		return results, itemErrs, err
	}
	if len(plain) == 0 {
		return t.rangedBatch(ctx, kind, items)
	}
	// Both kinds: the plain request runs beside the ranged parts.
	results := make([]bool, len(items))
	itemErrs := make([]error, len(items))
	var plainErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		plainErr = plainBatch(ctx, t.c, kind, items, plain, results, itemErrs)
	}()
	sub := make([]item, len(other))
	for i, k := range other {
		sub[i] = items[k]
	}
	got, gotErrs, err := t.rangedBatch(ctx, kind, sub)
	<-done
	for i, k := range other {
		results[k], itemErrs[k] = got[i], gotErrs[i]
	}
	return results, itemErrs, errors.Join(plainErr, err)
}

// rangedBatch moves every item in ranged requests.
func (t rangedTransport) rangedBatch(ctx context.Context, kind jobKind, items []item) ([]bool, []error, error) {
	objs := make([]conn.Object, len(items))
	for k := range items {
		objs[k] = items[k].obj
	}
	call := t.c.BatchGetRanges
	if kind == kindStore {
		call = t.c.BatchPutRanges
	}
	var results []bool
	var err error
	if ps := cutParts(objs); len(ps) == 1 {
		results, err = call(ctx, objs)
	} else {
		results = make([]bool, len(objs))
		errs := make([]error, len(ps))
		slots := make(chan struct{}, partsInFlight)
		var wg sync.WaitGroup
		for i, p := range ps {
			slots <- struct{}{}
			wg.Go(func() {
				defer func() { <-slots }()
				got, err := call(ctx, objs[p.lo:p.hi])
				copy(results[p.lo:p.hi], got)
				errs[i] = err
			})
		}
		wg.Wait()
		err = partsError(ps, errs)
	}
	itemErrs := make([]error, len(items))
	if err != nil {
		for k := range items {
			itemErrs[k] = conn.ErrFor(err, k)
		}
	}
	return results, itemErrs, err
}

// part is the half-open range [lo, hi) of a job's items one request carries.
type part struct{ lo, hi int }

// cutParts cuts objs into consecutive parts of at least one object, each
// closed once it holds partRanges ranges or partBytes bytes.
func cutParts(objs []conn.Object) []part {
	var ps []part
	lo, ranges, bytes := 0, 0, uint64(0)
	for i, o := range objs {
		ranges += len(o.Ranges)
		bytes += o.Size
		if ranges >= partRanges || bytes >= partBytes {
			ps = append(ps, part{lo, i + 1})
			lo, ranges, bytes = i+1, 0, 0
		}
	}
	if lo < len(objs) {
		ps = append(ps, part{lo, len(objs)})
	}
	return ps
}

// partsError combines the errors of a job's parts (errs[i] is part ps[i]'s,
// itself perhaps split) into one whose conn.ErrFor gives each item its own
// part's error; nil when every part was answered.
func partsError(ps []part, errs []error) error {
	var failed []conn.SpanError
	for i, p := range ps {
		if errs[i] == nil {
			continue
		}
		var be *conn.BatchError
		if !errors.As(errs[i], &be) {
			failed = append(failed, conn.SpanError{Start: p.lo, End: p.hi, Err: errs[i]})
			continue
		}
		for _, s := range be.Spans {
			failed = append(failed, conn.SpanError{Start: p.lo + s.Start, End: p.lo + s.End, Err: s.Err})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return &conn.BatchError{Spans: failed}
}

// segmentTransport moves items on a server without ranged I/O: single-range
// items as plain segments (BatchPut, BatchGet), multi-range items through
// the handle's staging buffers.
type segmentTransport struct {
	c *conn.Conn
	w *WorkerHandle
}

func (t segmentTransport) ranged() bool     { return false }
func (t segmentTransport) conn() *conn.Conn { return t.c }
func (t segmentTransport) flush(ctx context.Context) error {
	_, err := t.c.Flush(ctx)
	return err
}

func (t segmentTransport) move(ctx context.Context, kind jobKind, items []item) ([]bool, []error, error) {
	results := make([]bool, len(items))
	itemErrs := make([]error, len(items))
	var single, multi []int
	for k := range items {
		if items[k].single {
			single = append(single, k)
		} else {
			multi = append(multi, k)
		}
	}
	var errs []error
	if err := plainBatch(ctx, t.c, kind, items, single, results, itemErrs); err != nil {
		errs = append(errs, err)
	}
	if len(multi) > 0 {
		if err := t.w.staged(ctx, t.c, kind, items, multi, results, itemErrs); err != nil {
			errs = append(errs, err)
		}
	}
	return results, itemErrs, errors.Join(errs...)
}

// plainBatch moves the single-range items at indexes at in one BatchPut or
// BatchGet (split by the connection at the message limit), recording each
// one's result and the error of the request that carried it.
func plainBatch(ctx context.Context, c *conn.Conn, kind jobKind, items []item, at []int, results []bool, itemErrs []error) error {
	if len(at) == 0 {
		return nil
	}
	keys := make([]string, len(at))
	segs := make([]conn.Segment, len(at))
	for i, k := range at {
		r := items[k].obj.Ranges[0]
		keys[i] = items[k].obj.Key
		segs[i] = conn.Segment{RegionBase: r.RegionBase, Offset: r.Offset, Size: r.Size}
	}
	var got []bool
	var err error
	if kind == kindStore {
		got, err = c.BatchPut(ctx, keys, segs)
	} else {
		got, err = c.BatchGet(ctx, keys, segs)
	}
	for i, k := range at {
		results[k] = i < len(got) && got[i]
		itemErrs[k] = conn.ErrFor(err, i)
	}
	return err
}
