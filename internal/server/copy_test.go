package server

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCopyHost: however the queued host copies are sized (many small ones,
// one larger than a unit, both), every byte arrives, serially or spread
// over goroutines.
func TestCopyHost(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sizes := range [][]int{
		{0},
		{5},
		repeat(8192, 2048),            // 16 MiB of small copies: parallel
		{5<<20 + 3},                   // one copy cut into units
		{0, 1<<20 - 1, 1, 0, 3 << 20}, // units ending on copy boundaries
		randomSizes(rng, 300, 64<<10),
		randomSizes(rng, 40, 3<<20),
	} {
		total := 0
		for _, n := range sizes {
			total += n
		}
		src := make([]byte, total)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		dst := make([]byte, total)
		b := copyBatch{}
		off := 0
		for i, n := range sizes {
			b.queueHost(i, dst[off:off+n], src[off:off+n])
			off += n
		}
		if errs := b.copyHost(); errs != nil {
			t.Fatalf("%d copies of %d bytes: errors %v", len(sizes), total, errs)
		}
		if !bytes.Equal(src, dst) {
			t.Fatalf("%d copies of %d bytes: the bytes differ", len(sizes), total)
		}
	}
}

func repeat(n, size int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = size
	}
	return s
}

func randomSizes(rng *rand.Rand, n, most int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = rng.IntN(most + 1)
	}
	return s
}
