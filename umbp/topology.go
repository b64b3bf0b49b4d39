package umbp

import (
	"fmt"
	"math/bits"
)

// RankTopology places one engine rank in its parallel layout: tensor (TP),
// pipeline (PP), prefill context (PCP) and decode context (DCP) parallelism.
// Each Rank must lie in [0, Size). A zero Size means 1, so the zero
// RankTopology describes a single rank; a negative Size is invalid.
//
// The ranks (not the sizes) are part of every object key made by a
// [KeyCodec], so two ranks never share stored KV.
type RankTopology struct {
	TPRank, TPSize   int
	PPRank, PPSize   int
	PCPRank, PCPSize int
	DCPRank, DCPSize int
}

// Normalized returns t with every zero size replaced by 1. Negative sizes
// are kept, for [RankTopology.Validate] to report.
func (t RankTopology) Normalized() RankTopology {
	for _, s := range []*int{&t.TPSize, &t.PPSize, &t.PCPSize, &t.DCPSize} {
		if *s == 0 {
			*s = 1
		}
	}
	return t
}

// topoDim is one parallel dimension of a topology, for uniform checks.
type topoDim struct {
	name       string // "TP", "PP", ...
	rank, size int
}

// dims returns t's dimensions from outermost to innermost, the order of
// [RankTopology.AllRanks]: PP, PCP, DCP, TP.
func (t RankTopology) dims() [4]topoDim {
	return [4]topoDim{
		{"PP", t.PPRank, t.PPSize},
		{"PCP", t.PCPRank, t.PCPSize},
		{"DCP", t.DCPRank, t.DCPSize},
		{"TP", t.TPRank, t.TPSize},
	}
}

// Validate reports whether t is well formed: no size is negative, each rank
// lies in [0, size) (a zero size counting as 1), and the product of the
// sizes fits in an int. The error names the offending field and value and
// matches [ErrInvalidTopology].
func (t RankTopology) Validate() error { return invalid(t.validate()) }

func (t RankTopology) validate() error {
	world := 1
	for _, d := range t.Normalized().dims() {
		if d.size < 0 {
			return fmt.Errorf("%w: %sSize %d is negative", ErrInvalidTopology, d.name, d.size)
		}
		if d.rank < 0 || d.rank >= d.size {
			return fmt.Errorf("%w: %sRank %d outside [0, %d) (%sSize %d)",
				ErrInvalidTopology, d.name, d.rank, d.size, d.name, d.size)
		}
		hi, lo := bits.Mul64(uint64(world), uint64(d.size))
		if hi != 0 || lo > uint64(maxInt) {
			return fmt.Errorf("%w: world size overflows int at %sSize %d", ErrInvalidTopology, d.name, d.size)
		}
		world = int(lo)
	}
	return nil
}

const maxInt = int(^uint(0) >> 1)

// WorldSize returns the number of ranks in the topology: the product of the
// four sizes, zero sizes counting as 1. It is meaningful only for a topology
// that passes [RankTopology.Validate].
func (t RankTopology) WorldSize() int {
	n := t.Normalized()
	return n.PPSize * n.PCPSize * n.DCPSize * n.TPSize
}

// Index returns t's position in [RankTopology.AllRanks]: the rank's linear
// index with PP outermost and TP innermost. It is meaningful only for a
// topology that passes [RankTopology.Validate].
func (t RankTopology) Index() int {
	i := 0
	for _, d := range t.Normalized().dims() {
		i = i*d.size + d.rank
	}
	return i
}

// AllRanks enumerates every rank of t's topology (t's own ranks are ignored),
// with sizes normalized, PP outermost and TP innermost: the rank at index i
// has Index() == i. A scheduler uses it to build the keys every rank stores
// for one block. It returns nil if t's sizes are invalid (see
// [RankTopology.Validate]); otherwise it allocates WorldSize() elements.
func (t RankTopology) AllRanks() []RankTopology {
	n := t.Normalized()
	n.PPRank, n.PCPRank, n.DCPRank, n.TPRank = 0, 0, 0, 0
	if n.validate() != nil {
		return nil
	}
	out := make([]RankTopology, 0, n.WorldSize())
	for pp := range n.PPSize {
		for pcp := range n.PCPSize {
			for dcp := range n.DCPSize {
				for tp := range n.TPSize {
					r := n
					r.PPRank, r.PCPRank, r.DCPRank, r.TPRank = pp, pcp, dcp, tp
					out = append(out, r)
				}
			}
		}
	}
	return out
}

// String formats t as "tp<rank>/<size> pcp<rank>/<size> dcp<rank>/<size>
// pp<rank>/<size>", sizes normalized.
func (t RankTopology) String() string {
	n := t.Normalized()
	return fmt.Sprintf("tp%d/%d pcp%d/%d dcp%d/%d pp%d/%d",
		n.TPRank, n.TPSize, n.PCPRank, n.PCPSize, n.DCPRank, n.DCPSize, n.PPRank, n.PPSize)
}
