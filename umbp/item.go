package umbp

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/umbp-go/umbp-go/internal/conn"
	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/internal/slicepool"
)

// item is one plan of a job, resolved against registered memory.
type item struct {
	idx    int // plan index in the job
	obj    conn.Object
	single bool // one range
	host   bool // in host memory
}

// splitItems returns the indexes of the items is reports true for (yes)
// and false for (no), each in order, in one allocation.
func splitItems(items []item, is func(*item) bool) (yes, no []int) {
	idx := make([]int, len(items))
	y, n := 0, len(items)
	for k := range items {
		if is(&items[k]) {
			idx[y] = k
			y++
		} else {
			n--
			idx[n] = k
		}
	}
	no = idx[y:]
	slices.Reverse(no) // filled from the end: back in order
	return idx[:y:y], no
}

// plain reports whether the item can travel as a plain segment (BatchPut,
// BatchGet): one range of host memory.
func (it *item) plain() bool { return it.single && it.host }

// rangeSlabs holds the ranges of jobs' items: a job's plans are many and
// their ranges few each, and a ranged job's ranges are thousands (a quarter
// MiB for 8192), so they come in one slice, reused once the job's transfer
// no longer reads them (policy.go: maxSlabRanges).
var rangeSlabs = slicepool.New[conn.Range](maxSlabRanges)

// itemSlabs holds jobs' items, as rangeSlabs their ranges (16 KiB for a
// job of 256 plans); keySlabs and segmentSlabs the arrays of a plain
// batch's request, which nothing reads once its call has returned.
var (
	itemSlabs    = slicepool.New[item](maxSlabItems)
	keySlabs     = slicepool.New[string](maxSlabItems)
	segmentSlabs = slicepool.New[conn.Segment](maxSlabItems)
)

// coalesce merges ranges that continue one another both in registered
// memory (same region, next offset) and in the object, so that a block laid
// out contiguously travels as one range however the plan splits it: the
// server makes fewer copies, and a block that becomes one range can move
// with plain BatchPut/BatchGet on a server without ranged I/O. rs is sorted
// by object offset in place; the result shares its array.
func coalesce(rs []conn.Range) []conn.Range {
	if len(rs) < 2 {
		return rs
	}
	byObjectOffset := func(a, b conn.Range) int { return cmp.Compare(a.ObjectOffset, b.ObjectOffset) }
	if !slices.IsSortedFunc(rs, byObjectOffset) {
		slices.SortFunc(rs, byObjectOffset)
	}
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if r.RegionBase == last.RegionBase && r.Offset == last.Offset+last.Size && r.ObjectOffset == last.ObjectOffset+last.Size {
			last.Size += r.Size
			continue
		}
		out = append(out, r)
	}
	return out
}

// results is what a move answered, item by item: whether each one
// succeeded and, where the request that carried it failed, that request's
// error (errs is nil while every request was answered). It is the one
// place an item's outcome from the server is recorded; keyError turns it
// into the key's error.
type results struct {
	ok   []bool
	errs []error
}

func newResults(n int) results { return results{ok: make([]bool, n)} }

// set records item k's answer.
func (r *results) set(k int, ok bool, err error) {
	r.ok[k] = ok
	if err == nil && r.errs == nil {
		return
	}
	if r.errs == nil {
		r.errs = make([]error, len(r.ok))
	}
	r.errs[k] = err
}

// from records a batch's answers for the items at indexes at: entry i is
// item at[i]'s.
func (r *results) from(at []int, ok []bool, errs []error) {
	for i, k := range at {
		var err error
		if errs != nil {
			err = errs[i]
		}
		r.set(k, ok[i], err)
	}
}

// err returns item k's request error.
func (r *results) err(k int) error {
	if r.errs == nil {
		return nil
	}
	return r.errs[k]
}

// failure is the requests' distinct errors, joined; nil when every request
// was answered.
func (r *results) failure() error { return conn.Joined(r.errs) }

// refused reports whether the server answered false for an item.
func (r *results) refused() bool { return slices.Contains(r.ok, false) }

// inDoubt reports whether a request may have reached the server and used
// its memory although no answer says what became of it.
func (r *results) inDoubt() bool {
	for _, err := range r.errs {
		if inDoubt(err) {
			return true
		}
	}
	return false
}

// inDoubt reports whether a request with error err may have reached the
// server and used its memory although no answer says what became of it:
// its transport failed under it, or was cut off. A request refused before
// it was sent, or not attempted (no staging buffer, say), used nothing,
// whatever the reason says. This is the one rule: a job keeps its buffers,
// and a staging buffer is set aside, while it holds.
func inDoubt(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, ErrNotAttempted) && !errors.Is(err, rpc.ErrNotSent)
}

// segments moves keys[i] between the pool and segs[i] (BatchPut or
// BatchGet, cut by the connection at the message limit).
func segments(ctx context.Context, c *conn.Conn, kind jobKind, keys []string, segs []conn.Segment) ([]bool, []error) {
	if kind == kindStore {
		return c.BatchPut(ctx, keys, segs)
	}
	return c.BatchGet(ctx, keys, segs)
}

// plainBatch moves the single-range items at indexes at as plain
// segments, recording each one's answer in r.
func plainBatch(ctx context.Context, c *conn.Conn, kind jobKind, items []item, at []int, r *results) {
	if len(at) == 0 {
		return
	}
	keys, segs := plainArrays(items, at)
	ok, errs := segments(ctx, c, kind, keys, segs)
	keySlabs.Put(keys)
	segmentSlabs.Put(segs)
	r.from(at, ok, errs)
}

// plainArrays returns the keys and segments of the single-range items at
// indexes at (of every item, in order, for a nil at), in arrays taken from
// keySlabs and segmentSlabs.
func plainArrays(items []item, at []int) ([]string, []conn.Segment) {
	n := len(items)
	if at != nil {
		n = len(at)
	}
	keys := keySlabs.Get(n)
	segs := segmentSlabs.Get(n)
	for i := range n {
		k := i
		if at != nil {
			k = at[i]
		}
		rg := items[k].obj.Ranges[0]
		keys[i] = items[k].obj.Key
		segs[i] = conn.Segment{RegionBase: rg.RegionBase, Offset: rg.Offset, Size: rg.Size}
	}
	return keys, segs
}
