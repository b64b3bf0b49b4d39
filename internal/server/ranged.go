package server

import (
	"slices"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// rangedShape checks the array lengths of a ranged request and returns, for
// each key i, its ranges as [starts[i], starts[i+1]) of the flattened arrays.
// False fails the whole batch: range_counts not one per key or not summing
// to the number of ranges; shm_offsets, region_bases, sizes, object_offsets
// of different lengths; a put without one object_size per key; a get with
// any object_sizes.
func rangedShape(req *umbppb.BatchRangeDataRequest, put bool) ([]int, bool) {
	n := len(req.GetKeys())
	counts := req.GetRangeCounts()
	if len(counts) != n {
		return nil, false
	}
	m := len(req.GetShmOffsets())
	if len(req.GetRegionBases()) != m || len(req.GetSizes()) != m || len(req.GetObjectOffsets()) != m {
		return nil, false
	}
	if put && len(req.GetObjectSizes()) != n || !put && len(req.GetObjectSizes()) != 0 {
		return nil, false
	}
	starts := make([]int, n+1)
	var total uint64
	for i, c := range counts {
		total += uint64(c)
		if total > uint64(m) {
			return nil, false
		}
		starts[i+1] = int(total)
	}
	if total != uint64(m) {
		return nil, false
	}
	return starts, true
}

// tiles reports whether the ranges (object offset, size) cover [0,
// objectSize) exactly once: no gap, no overlap, no repeat, no zero-size
// range, starting at 0 and ending at objectSize. Order does not matter.
func tiles(objOffsets, sizes []uint64, objectSize uint64) bool {
	if len(objOffsets) == 0 || len(objOffsets) != len(sizes) || objectSize == 0 {
		return false
	}
	if slices.Contains(sizes, 0) {
		return false
	}
	var next uint64
	if slices.IsSorted(objOffsets) { // as clients send them: nothing to sort
		for i, off := range objOffsets {
			if off != next || sizes[i] > objectSize-next {
				return false
			}
			next += sizes[i]
		}
		return next == objectSize
	}
	idx := make([]int, len(objOffsets))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmpU64(objOffsets[a], objOffsets[b]) })
	for _, i := range idx {
		if objOffsets[i] != next || sizes[i] > objectSize-next {
			return false
		}
		next += sizes[i]
	}
	return next == objectSize
}

// within reports whether [off, off+size) lies inside an object of objectSize.
func within(off, size, objectSize uint64) bool {
	return size <= objectSize && off <= objectSize-size
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// resolveRanged checks a ranged batch's shape and resolves every range it
// names; a batch that fails either is all-false. On success the caller
// releases the lease.
func (s *Server) resolveRanged(req *umbppb.BatchRangeDataRequest, put bool) (starts []int, locs []loc, l *lease, ok bool) {
	starts, ok = rangedShape(req, put)
	if !ok || len(req.GetKeys()) == 0 {
		return nil, nil, nil, false
	}
	locs = make([]loc, len(req.GetShmOffsets()))
	l, ok = s.regs.resolve(req.GetClientId(), req.GetRegionBases(), req.GetShmOffsets(), req.GetSizes(), true, locs)
	return starts, locs, l, ok
}

// batchPutRanges serves BatchPutRanges (see docs/PROTOCOL.md, "Batch rules").
func (s *Server) batchPutRanges(req *umbppb.BatchRangeDataRequest) []bool {
	keys := req.GetKeys()
	res := make([]bool, len(keys))
	starts, locs, l, ok := s.resolveRanged(req, true)
	if !ok {
		return res
	}
	defer l.release()

	seen := make(map[string]int, len(keys))
	for _, k := range keys {
		seen[k]++
	}
	objOffs, sizes, objSizes := req.GetObjectOffsets(), req.GetSizes(), req.GetObjectSizes()
	pb := s.newPutBatch("ranged put", req.GetClientId(), keys, res, 0, len(sizes))
	defer pb.release()
	for i, key := range keys {
		lo, hi := starts[i], starts[i+1]
		if !tiles(objOffs[lo:hi], sizes[lo:hi], objSizes[i]) {
			continue
		}
		if !s.pool.wants(key, 0) {
			res[i] = true // stored already: the first value stays
			continue
		}
		if seen[key] > 1 {
			continue // the same new key twice: neither is stored
		}
		o, item, ok := pb.reserve(i, objSizes[i])
		if !ok {
			continue
		}
		for j := lo; j < hi; j++ {
			pb.copies.toPool(item, locs[j], o, objOffs[j], sizes[j])
		}
	}
	pb.finish()
	return res
}

// batchGetRanges serves BatchGetRanges (see docs/PROTOCOL.md, "Batch rules").
func (s *Server) batchGetRanges(req *umbppb.BatchRangeDataRequest) []bool {
	keys := req.GetKeys()
	res := make([]bool, len(keys))
	starts, locs, l, ok := s.resolveRanged(req, false)
	if !ok {
		return res
	}
	defer l.release()

	objOffs, sizes := req.GetObjectOffsets(), req.GetSizes()
	gb := s.newGetBatch("ranged get", req.GetClientId(), keys, res, len(sizes))
	for i, key := range keys {
		lo, hi := starts[i], starts[i+1]
		if lo == hi || slices.Contains(sizes[lo:hi], 0) {
			continue
		}
		o := s.pool.acquire(key)
		if o == nil {
			continue
		}
		if !allWithin(objOffs[lo:hi], sizes[lo:hi], o.size) {
			s.pool.release(o)
			continue
		}
		item := gb.add(i, o)
		for j := lo; j < hi; j++ {
			gb.copies.fromPool(item, o, objOffs[j], locs[j], sizes[j])
		}
	}
	gb.finish()
	return res
}

// allWithin reports whether every range [objOffs[j], +sizes[j]) lies inside
// an object of objectSize.
func allWithin(objOffs, sizes []uint64, objectSize uint64) bool {
	for j := range objOffs {
		if !within(objOffs[j], sizes[j], objectSize) {
			return false
		}
	}
	return true
}
