package server

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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
		repeat(256, 64<<10),           // 256 × 64 KiB: parallel, in 1 MiB units
		repeat(256, 4<<10),            // 256 × 4 KiB: on one goroutine
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

// TestCopyCold: the non-temporal copy moves exactly the bytes asked for,
// whatever the sizes and alignments, and touches nothing around them.
func TestCopyCold(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const guard = 64
	for _, n := range []int{0, 1, 127, 128, 255, 256, 257, 383, 4096, 64<<10 - 1, 64 << 10, 64<<10 + 77, 1<<20 + 13} {
		for _, dOff := range []int{0, 1, 16, 31, 32, 33} {
			for _, sOff := range []int{0, 3} {
				src := make([]byte, sOff+n)
				for i := range src {
					src[i] = byte(rng.Uint32())
				}
				dst := make([]byte, guard+dOff+n+guard)
				for i := range dst {
					dst[i] = 0xa5
				}
				copyCold(dst[guard+dOff:guard+dOff+n], src[sOff:])
				if !bytes.Equal(dst[guard+dOff:guard+dOff+n], src[sOff:]) {
					t.Fatalf("%d bytes, dst offset %d, src offset %d: the bytes differ", n, dOff, sOff)
				}
				for i, c := range append(dst[:guard+dOff:guard+dOff], dst[guard+dOff+n:]...) {
					if c != 0xa5 {
						t.Fatalf("%d bytes, dst offset %d, src offset %d: byte %d around the copy written", n, dOff, sOff, i)
					}
				}
			}
		}
	}
}

// TestCopyColdOverlap: overlapping regions are copied as copy copies them.
func TestCopyColdOverlap(t *testing.T) {
	for _, shift := range []int{-4096, -1, 1, 4096} {
		const n = 256 << 10
		buf := pattern(n+8192, 7)
		want := append([]byte(nil), buf...)
		copy(want[4096+shift:4096+shift+n], want[4096:4096+n])
		copyCold(buf[4096+shift:4096+shift+n], buf[4096:4096+n])
		if !bytes.Equal(buf, want) {
			t.Fatalf("shift %d: overlapping copy differs from copy's", shift)
		}
	}
}

// TestCopyHostFault: large copies (the non-temporal path) from a memfd cut
// short after it was mapped fail their own items, serially and in
// parallel, and every other byte arrives.
func TestCopyHostFault(t *testing.T) {
	for _, n := range []int{1, 6} { // one copy (serial), six (parallel)
		const size = 1 << 20
		m := newMemfd(t, n*size)
		fill(m.mem, 9)
		want := append([]byte(nil), m.mem[:size]...)
		if err := unix.Ftruncate(m.fd, size/2); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, n*size)
		b := copyBatch{}
		for i := range n {
			b.queueHost(i, dst[i*size:(i+1)*size], m.mem[i*size:(i+1)*size])
		}
		errs := b.copyHost()
		if len(errs) != n {
			t.Fatalf("%d copies: %d errors, want %d", n, len(errs), n)
		}
		for i, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "fault") {
				t.Errorf("%d copies: copy %d: error %v, want a fault", n, i, err)
			}
		}
		if !bytes.Equal(dst[:size/2], want[:size/2]) {
			t.Errorf("%d copies: the bytes before the cut differ", n)
		}
	}
}
