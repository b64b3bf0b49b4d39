package umbp

import (
	"cmp"
	"slices"

	"github.com/umbp-go/umbp-go/internal/conn"
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
