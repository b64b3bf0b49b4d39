package umbp

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// KVRange is one contiguous piece of a block's object: Length bytes that
// live at BaseAddress in this process (host or GPU memory) and occupy
// [ObjectOffset, ObjectOffset+Length) of the stored object.
type KVRange struct {
	// LayerName and GroupID name the region the bytes belong to.
	LayerName string
	GroupID   int
	// BlockID is the physical block index within the region, so that
	// BaseAddress = region base + BlockID*Stride. It equals the plan's
	// logical BlockID unless the region has sub-blocks (see [KVRegion]).
	BlockID int
	// BaseAddress is the address of the range's first byte in this process.
	BaseAddress uintptr
	// Stride is the region's distance between physical blocks. It is
	// informational: the range itself is the Length bytes at BaseAddress.
	Stride uint64
	// Length is the number of bytes in the range.
	Length uint64
	// ObjectOffset is where the range's bytes go in the stored object.
	ObjectOffset uint64
}

// BlockTransferPlan is the unit of a store or load: one block of one KV cache
// group, stored as one object under Key, gathered from (or scattered to) the
// listed ranges of this process's memory.
type BlockTransferPlan struct {
	// Key is the object key, usually made by a [KeyCodec].
	Key string
	// BlockID is the logical block ID in the group's block table.
	BlockID int
	// GroupID is the KV cache group.
	GroupID int
	// Ranges are the pieces of the object. Sorted by ObjectOffset they must
	// tile [0, ObjectSize()) exactly; see [BlockTransferPlan.Validate].
	Ranges []KVRange
}

// ObjectSize returns the size of the stored object: the sum of the ranges'
// lengths. For a plan that passes [BlockTransferPlan.Validate] this sum does
// not overflow.
func (p BlockTransferPlan) ObjectSize() uint64 {
	var n uint64
	for _, r := range p.Ranges {
		n += r.Length
	}
	return n
}

// Validate reports whether the plan is well formed: a non-empty, valid UTF-8
// Key; non-negative BlockID and GroupID; at least one range; every range
// with a non-zero BaseAddress and Length and an end that fits in its type;
// and ranges that, sorted by ObjectOffset, tile [0, ObjectSize()) exactly,
// with no gap and no overlap. It does not check that the ranges lie in
// registered memory. It does not modify or reorder p.Ranges and, when the
// ranges are already in object order, does not allocate except for an
// error.
//
// Errors match [ErrInvalidPlan] and name the key and the offending range by
// its index in p.Ranges.
func (p BlockTransferPlan) Validate() error { return invalid(p.validate()) }

// validate is Validate for an error that becomes part of another (a key's,
// in a job's error).
func (p BlockTransferPlan) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: key %s: %s", ErrInvalidPlan, quoteKey(p.Key), fmt.Sprintf(format, args...))
	}
	switch {
	case p.Key == "":
		return bad("key is empty")
	case len(p.Key) > MaxKeyBytes:
		return bad("key is %d bytes, over MaxKeyBytes (%d)", len(p.Key), MaxKeyBytes)
	case !utf8.ValidString(p.Key):
		return bad("key is not valid UTF-8")
	case p.BlockID < 0:
		return bad("BlockID %d is negative", p.BlockID)
	case p.GroupID < 0:
		return bad("GroupID %d is negative", p.GroupID)
	case len(p.Ranges) == 0:
		return bad("no ranges")
	}
	describe := func(i int) string {
		r := p.Ranges[i]
		return fmt.Sprintf("range %d (layer %q, object offset %d, length %d)", i, r.LayerName, r.ObjectOffset, r.Length)
	}
	sorted := true
	for i, r := range p.Ranges {
		switch {
		case r.Length == 0:
			return bad("%s: Length is 0", describe(i))
		case r.BaseAddress == 0:
			return bad("%s: BaseAddress is 0", describe(i))
		}
		if _, carry := bits.Add64(r.ObjectOffset, r.Length, 0); carry != 0 {
			return bad("%s: object offset + length overflows", describe(i))
		}
		if end, carry := bits.Add64(uint64(r.BaseAddress), r.Length, 0); carry != 0 || end > uint64(^uintptr(0)) {
			return bad("%s: BaseAddress %#x + length passes the end of the address space", describe(i), r.BaseAddress)
		}
		if i > 0 && r.ObjectOffset < p.Ranges[i-1].ObjectOffset {
			sorted = false
		}
	}
	at := func(k int) int { return k }
	if !sorted {
		order := make([]int, len(p.Ranges))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int {
			return cmp.Compare(p.Ranges[a].ObjectOffset, p.Ranges[b].ObjectOffset)
		})
		at = func(k int) int { return order[k] }
	}
	var next uint64 // end of the ranges seen so far, in object order
	prev := -1
	for k := range p.Ranges {
		i := at(k)
		r := p.Ranges[i]
		switch {
		case r.ObjectOffset > next && prev < 0:
			return bad("%s: object bytes [0, %d) are not covered", describe(i), r.ObjectOffset)
		case r.ObjectOffset > next:
			return bad("%s: gap: object bytes [%d, %d) after range %d are not covered", describe(i), next, r.ObjectOffset, prev)
		case r.ObjectOffset < next:
			return bad("%s: overlaps range %d, which ends at object offset %d", describe(i), prev, next)
		}
		next = r.ObjectOffset + r.Length
		prev = i
	}
	return nil
}

// LayoutPlanner turns (key, group, block) into a [BlockTransferPlan] for a
// fixed [KVLayoutDescriptor]. The object of block b of group g is block b of
// every region of g, concatenated in layout order: region k's bytes start at
// the sum of BlockBytes of the group's earlier regions. A region with
// sub-blocks contributes its chunks one after another (see [KVRegion]).
//
// A LayoutPlanner is immutable and safe for concurrent use. Planning one
// block allocates only the plan's Ranges slice.
type LayoutPlanner struct {
	layout *KVLayoutDescriptor
	groups []int              // ascending
	dense  []*groupPlan       // indexed by group ID when the IDs are small
	sparse map[int]*groupPlan // otherwise
}

// groupPlan is what the planner precomputes for one group.
type groupPlan struct {
	regions    []regionPlan
	objectSize uint64
	numRanges  int    // ranges per block: the sum of the regions' sub-blocks
	numBlocks  int    // the smallest NumBlocks among the regions
	limiting   string // LayerName of a region with numBlocks blocks
}

// regionPlan is one region as the planner uses it.
type regionPlan struct {
	layer  string
	group  int
	base   uintptr
	stride uint64
	chunk  uint64 // bytes per physical block
	n      int    // physical blocks per logical block
	offset uint64 // object offset of the region's first byte
}

// denseGroupLimit bounds the group IDs the planner indexes with a slice.
const denseGroupLimit = 1024

// NewLayoutPlanner validates layout (see [KVLayoutDescriptor.Validate]) and
// precomputes each group's plan shape. It keeps a copy of the layout, so
// later changes to layout do not affect the planner.
func NewLayoutPlanner(layout *KVLayoutDescriptor) (*LayoutPlanner, error) {
	p, err := newLayoutPlanner(layout)
	return p, invalid(err)
}

func newLayoutPlanner(layout *KVLayoutDescriptor) (*LayoutPlanner, error) {
	if err := layout.validate(); err != nil {
		return nil, err
	}
	p := &LayoutPlanner{layout: layout.clone(), groups: layout.Groups()}
	if p.groups[len(p.groups)-1] < denseGroupLimit {
		p.dense = make([]*groupPlan, p.groups[len(p.groups)-1]+1)
	} else {
		p.sparse = make(map[int]*groupPlan, len(p.groups))
	}
	for _, g := range p.groups {
		gp := &groupPlan{numBlocks: maxInt}
		for _, r := range p.layout.regionsOf(g) {
			gp.regions = append(gp.regions, regionPlan{
				layer: r.LayerName, group: r.GroupID, base: r.BaseAddress, stride: r.Stride,
				chunk: r.chunkBytes(), n: r.subBlocks(), offset: gp.objectSize,
			})
			gp.objectSize += r.BlockBytes
			gp.numRanges += r.subBlocks()
			if r.NumBlocks < gp.numBlocks {
				gp.numBlocks, gp.limiting = r.NumBlocks, r.LayerName
			}
		}
		if p.dense != nil {
			p.dense[g] = gp
		} else {
			p.sparse[g] = gp
		}
	}
	return p, nil
}

func (p *LayoutPlanner) group(g int) *groupPlan {
	if p.dense != nil {
		if g >= 0 && g < len(p.dense) {
			return p.dense[g]
		}
		return nil
	}
	return p.sparse[g]
}

// objectSize returns the object size of the group, or 0 for a group the
// layout does not have.
func (p *LayoutPlanner) objectSize(group int) uint64 {
	if gp := p.group(group); gp != nil {
		return gp.objectSize
	}
	return 0
}

// NumBlocks returns the number of blocks a plan of the group may address
// (the smallest NumBlocks among the group's regions), or 0 for a group the
// layout does not have.
func (p *LayoutPlanner) NumBlocks(group int) int {
	if gp := p.group(group); gp != nil {
		return gp.numBlocks
	}
	return 0
}

// rangesPerBlock returns the number of ranges in each plan of the group, or
// 0 for a group the layout does not have.
func (p *LayoutPlanner) rangesPerBlock(group int) int {
	if gp := p.group(group); gp != nil {
		return gp.numRanges
	}
	return 0
}

// PlanForBlock returns the plan that stores or loads logical block blockID
// of the group under key. The plan's ranges are in object order (one per
// region, or one per sub-block) and the plan passes
// [BlockTransferPlan.Validate]. An empty key, a group the layout does not
// have, and a block outside [0, NumBlocks(group)) are errors matching
// [ErrInvalidPlan].
func (p *LayoutPlanner) PlanForBlock(key string, group, blockID int) (BlockTransferPlan, error) {
	bp, err := p.planForBlock(key, group, blockID)
	return bp, invalid(err)
}

// planForBlock is PlanForBlock for an error that becomes a key's.
func (p *LayoutPlanner) planForBlock(key string, group, blockID int) (BlockTransferPlan, error) {
	gp, err := p.check(key, group, blockID)
	if err != nil {
		return BlockTransferPlan{}, err
	}
	ranges := gp.fill(make([]KVRange, gp.numRanges), blockID)
	return BlockTransferPlan{Key: key, BlockID: blockID, GroupID: group, Ranges: ranges}, nil
}

// check returns the group's plan shape, or the error for a request the
// planner cannot serve.
func (p *LayoutPlanner) check(key string, group, blockID int) (*groupPlan, error) {
	if key == "" {
		return nil, fmt.Errorf("%w: empty key for group %d block %d", ErrInvalidPlan, group, blockID)
	}
	if len(key) > MaxKeyBytes {
		return nil, fmt.Errorf("%w: key %s: key is %d bytes, over MaxKeyBytes (%d)", ErrInvalidPlan, quoteKey(key), len(key), MaxKeyBytes)
	}
	if !utf8.ValidString(key) {
		return nil, fmt.Errorf("%w: key %q: key is not valid UTF-8", ErrInvalidPlan, key)
	}
	gp := p.group(group)
	if gp == nil {
		return nil, fmt.Errorf("%w: key %q: group %d is not in the layout (groups %v)", ErrInvalidPlan, key, group, p.groups)
	}
	if blockID < 0 || blockID >= gp.numBlocks {
		return nil, fmt.Errorf("%w: key %q: block %d of group %d outside [0, %d) (NumBlocks of region %q)",
			ErrInvalidPlan, key, blockID, group, gp.numBlocks, gp.limiting)
	}
	return gp, nil
}

// fill writes the ranges of logical block b into dst, which has exactly
// numRanges elements, and returns it.
func (gp *groupPlan) fill(dst []KVRange, b int) []KVRange {
	k := 0
	for i := range gp.regions {
		r := &gp.regions[i]
		phys := b * r.n
		addr := r.base + uintptr(uint64(phys)*r.stride)
		off := r.offset
		for range r.n {
			dst[k] = KVRange{
				LayerName:    r.layer,
				GroupID:      r.group,
				BlockID:      phys,
				BaseAddress:  addr,
				Stride:       r.stride,
				Length:       r.chunk,
				ObjectOffset: off,
			}
			phys++
			addr += uintptr(r.stride)
			off += r.chunk
			k++
		}
	}
	return dst
}

// Block names one block of a KV cache group for the block-wise transfers
// ([WorkerHandle.StoreBlocks], [WorkerHandle.LoadBlocks]): the worker's
// layout supplies its ranges, as [LayoutPlanner.PlanForBlock] makes them.
type Block struct {
	// Key is the object key, usually made by a [KeyCodec].
	Key string
	// GroupID is the KV cache group; BlockID the logical block in the
	// group's block table.
	GroupID, BlockID int
}

// planBlocks plans every block, in order. A block the planner cannot plan
// gets a plan without ranges and its error in bad (nil when every block
// planned). The planned blocks' ranges share one allocation; each plan's
// Ranges has its own capacity, so appending to one never overwrites
// another.
func (p *LayoutPlanner) planBlocks(blocks []Block) (plans []BlockTransferPlan, bad []error) {
	total := 0
	for i, b := range blocks {
		gp, err := p.check(b.Key, b.GroupID, b.BlockID)
		if err != nil {
			if bad == nil {
				bad = make([]error, len(blocks))
			}
			bad[i] = err
			continue
		}
		total += gp.numRanges
	}
	slab := make([]KVRange, total)
	plans = make([]BlockTransferPlan, len(blocks))
	for i, b := range blocks {
		plans[i] = BlockTransferPlan{Key: b.Key, BlockID: b.BlockID, GroupID: b.GroupID}
		if bad != nil && bad[i] != nil {
			continue
		}
		gp := p.group(b.GroupID)
		n := gp.numRanges
		plans[i].Ranges = gp.fill(slab[:n:n], b.BlockID)
		slab = slab[n:]
	}
	return plans, bad
}

// quoteKey quotes a key for an error, its first 64 bytes and its length
// when it is longer.
func quoteKey(key string) string {
	const show = 64
	if len(key) <= show {
		return strconv.Quote(key)
	}
	return fmt.Sprintf("%q… (%d bytes)", key[:show], len(key))
}
