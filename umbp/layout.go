package umbp

import (
	"fmt"
	"math/bits"
	"slices"
)

// KVRegion is one registered KV cache tensor as the layout sees it: an array
// of NumBlocks equally spaced blocks in this process's memory (host or GPU).
//
// With SubBlocks 0 or 1, logical block b is one contiguous chunk of
// BlockBytes bytes at
//
//	BaseAddress + b*Stride
//
// With SubBlocks n > 1, the region's memory holds n*NumBlocks physical
// blocks, Stride apart, and logical block b is the n consecutive physical
// blocks b*n … b*n+n-1: n chunks of BlockBytes/n bytes each, chunk i at
//
//	BaseAddress + (b*n+i)*Stride
//
// stored one after another in the object. This is the shape of a cache whose
// attention kernel uses smaller blocks than the block manager. BlockBytes
// must then be a multiple of n.
//
// In both cases a physical chunk (BlockBytes/n bytes, n counting 0 as 1)
// must fit in Stride, and the region spans BaseAddress up to the end of its
// last physical chunk, (NumBlocks*n-1)*Stride + BlockBytes/n bytes further.
type KVRegion struct {
	// LayerName names the tensor; it is the name the tensor is registered
	// under, and (LayerName, GroupID) is unique within a layout.
	LayerName string
	// GroupID is the KV cache group the layer belongs to; each group has its
	// own block table and its own objects.
	GroupID int
	// BaseAddress is the address of physical block 0 in this process.
	BaseAddress uintptr
	// NumBlocks is the number of logical blocks.
	NumBlocks int
	// BlockBytes is the number of bytes one logical block holds in this
	// region.
	BlockBytes uint64
	// Stride is the distance in bytes between consecutive physical blocks.
	Stride uint64
	// SubBlocks is the number of physical blocks per logical block; 0 means 1.
	SubBlocks int
}

// subBlocks returns r.SubBlocks with 0 read as 1.
func (r KVRegion) subBlocks() int {
	if r.SubBlocks == 0 {
		return 1
	}
	return r.SubBlocks
}

// chunkBytes returns the length of one physical chunk: BlockBytes divided by
// the number of sub-blocks (0 counting as 1).
func (r KVRegion) chunkBytes() uint64 {
	if r.SubBlocks <= 1 {
		return r.BlockBytes
	}
	return r.BlockBytes / uint64(r.SubBlocks)
}

// extent returns the number of bytes from BaseAddress to the end of the last
// physical block: (NumBlocks*n-1)*Stride + chunkBytes(), n being the number
// of sub-blocks. It is meaningful only for a region that passes
// [KVRegion.Validate].
func (r KVRegion) extent() uint64 {
	phys := uint64(r.NumBlocks) * uint64(r.subBlocks())
	return (phys-1)*r.Stride + r.chunkBytes()
}

// validate reports whether r is well formed: a non-empty LayerName, a
// non-negative GroupID, a non-zero BaseAddress, positive NumBlocks,
// BlockBytes and Stride, SubBlocks not negative and dividing BlockBytes, a
// chunk no longer than Stride, and a span that does not wrap past the end of
// the address space. Errors match [ErrInvalidLayout] and name the field and
// value.
func (r KVRegion) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("region %q group %d: %s", r.LayerName, r.GroupID, fmt.Sprintf(format, args...))
	}
	switch {
	case r.LayerName == "":
		return bad("LayerName is empty")
	case r.GroupID < 0:
		return bad("GroupID %d is negative", r.GroupID)
	case r.BaseAddress == 0:
		return bad("BaseAddress is 0")
	case r.NumBlocks <= 0:
		return bad("NumBlocks %d is not positive", r.NumBlocks)
	case r.BlockBytes == 0:
		return bad("BlockBytes is 0")
	case r.Stride == 0:
		return bad("Stride is 0")
	case r.SubBlocks < 0:
		return bad("SubBlocks %d is negative", r.SubBlocks)
	case r.BlockBytes%uint64(r.subBlocks()) != 0:
		return bad("BlockBytes %d is not a multiple of SubBlocks %d", r.BlockBytes, r.SubBlocks)
	case r.chunkBytes() > r.Stride:
		if r.SubBlocks > 1 {
			return bad("BlockBytes %d / SubBlocks %d = %d exceeds Stride %d",
				r.BlockBytes, r.SubBlocks, r.chunkBytes(), r.Stride)
		}
		return bad("BlockBytes %d exceeds Stride %d", r.BlockBytes, r.Stride)
	}
	if _, ok := r.end(); !ok {
		return bad("NumBlocks %d × SubBlocks %d × Stride %d from BaseAddress %#x passes the end of the address space",
			r.NumBlocks, r.subBlocks(), r.Stride, r.BaseAddress)
	}
	return nil
}

// end returns BaseAddress+extent() and whether it was computed without
// overflow and fits in a uintptr. It assumes the other checks of Validate
// passed.
func (r KVRegion) end() (uint64, bool) {
	hi, phys := bits.Mul64(uint64(r.NumBlocks), uint64(r.subBlocks()))
	if hi != 0 {
		return 0, false
	}
	hi, span := bits.Mul64(phys-1, r.Stride)
	if hi != 0 {
		return 0, false
	}
	span, carry := bits.Add64(span, r.chunkBytes(), 0)
	if carry != 0 {
		return 0, false
	}
	end, carry := bits.Add64(uint64(r.BaseAddress), span, 0)
	if carry != 0 || end > uint64(^uintptr(0)) {
		return 0, false
	}
	return end, true
}

// KVLayoutDescriptor describes every KV region one worker transfers. The
// regions of one group together make that group's objects: the object of
// block b of group g is the concatenation, in region order, of block b of
// every region of group g (see [LayoutPlanner]).
type KVLayoutDescriptor struct {
	Regions []KVRegion
}

// Validate reports whether the layout is well formed: at least one region;
// every region with a non-empty LayerName, a non-negative GroupID, a
// non-zero BaseAddress, positive NumBlocks, BlockBytes and Stride,
// SubBlocks not negative and dividing BlockBytes, a chunk no longer than
// Stride, and a span that does not wrap past the end of the address space;
// no two regions with the same (LayerName, GroupID); and each group's
// object size fitting in a uint64. Errors match [ErrInvalidLayout] and name
// the region, field and value. A nil descriptor is invalid.
func (l *KVLayoutDescriptor) Validate() error { return invalid(l.validate()) }

func (l *KVLayoutDescriptor) validate() error {
	if l == nil || len(l.Regions) == 0 {
		return fmt.Errorf("%w: layout has no regions", ErrInvalidLayout)
	}
	type regionID struct {
		layer string
		group int
	}
	seen := make(map[regionID]int, len(l.Regions))
	sizes := make(map[int]uint64)
	for i, r := range l.Regions {
		if err := r.validate(); err != nil {
			return fmt.Errorf("%w: region %d: %w", ErrInvalidLayout, i, err)
		}
		id := regionID{r.LayerName, r.GroupID}
		if j, dup := seen[id]; dup {
			return fmt.Errorf("%w: regions %d and %d both have LayerName %q and GroupID %d",
				ErrInvalidLayout, j, i, r.LayerName, r.GroupID)
		}
		seen[id] = i
		sum, carry := bits.Add64(sizes[r.GroupID], r.BlockBytes, 0)
		if carry != 0 {
			return fmt.Errorf("%w: object size of group %d overflows at region %d (LayerName %q)",
				ErrInvalidLayout, r.GroupID, i, r.LayerName)
		}
		sizes[r.GroupID] = sum
	}
	return nil
}

// ObjectSize returns the size in bytes of one stored object of the given
// group: the sum of BlockBytes over the group's regions; 0 for a group the
// layout does not have.
func (l *KVLayoutDescriptor) ObjectSize(group int) uint64 {
	if l == nil {
		return 0
	}
	var n uint64
	for _, r := range l.Regions {
		if r.GroupID == group {
			n += r.BlockBytes
		}
	}
	return n
}

// Groups returns the distinct group IDs of the layout's regions, ascending.
func (l *KVLayoutDescriptor) Groups() []int {
	if l == nil {
		return nil
	}
	var gs []int
	for _, r := range l.Regions {
		gs = append(gs, r.GroupID)
	}
	slices.Sort(gs)
	return slices.Compact(gs)
}

// regionsOf returns the regions of the given group, in layout order. The
// result is a new slice.
func (l *KVLayoutDescriptor) regionsOf(group int) []KVRegion {
	if l == nil {
		return nil
	}
	var rs []KVRegion
	for _, r := range l.Regions {
		if r.GroupID == group {
			rs = append(rs, r)
		}
	}
	return rs
}

// clone returns a deep copy of l (nil for nil).
func (l *KVLayoutDescriptor) clone() *KVLayoutDescriptor {
	if l == nil {
		return nil
	}
	return &KVLayoutDescriptor{Regions: slices.Clone(l.Regions)}
}
