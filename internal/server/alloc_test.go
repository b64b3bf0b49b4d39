package server

import (
	"math/rand/v2"
	"testing"
)

func TestAllocatorFirstFitAndCoalesce(t *testing.T) {
	a := newAllocator(1024)
	off := func(n uint64) uint64 {
		t.Helper()
		o, ok := a.alloc(n)
		if !ok {
			t.Fatalf("alloc(%d) failed; free %v", n, a.free)
		}
		return o
	}
	x, y, z := off(100), off(128), off(64)
	if x != 0 || y != 128 || z != 256 {
		t.Fatalf("offsets %d %d %d", x, y, z)
	}
	if _, ok := a.alloc(1024); ok {
		t.Fatal("over-allocation")
	}
	a.release(y, 128)
	if o := off(64); o != 128 {
		t.Fatalf("first fit gave %d, want 128", o)
	}
	a.release(128, 64)
	a.release(x, 100)
	a.release(z, 64)
	if len(a.free) != 1 || a.free[0] != (extent{0, 1024}) {
		t.Fatalf("not coalesced: %v", a.free)
	}
	if _, ok := a.alloc(0); ok {
		t.Fatal("alloc(0) succeeded")
	}
	if _, ok := a.alloc(1<<64 - 1); ok {
		t.Fatal("alloc overflow succeeded")
	}
}

func TestAllocatorRandom(t *testing.T) {
	const size = 1 << 16
	a := newAllocator(size)
	r := rand.New(rand.NewPCG(1, 2))
	type ext struct{ off, n uint64 }
	var live []ext
	owner := make([]int, size/allocAlign)
	for i := range 20000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			j := r.IntN(len(live))
			e := live[j]
			live = append(live[:j], live[j+1:]...)
			a.release(e.off, e.n)
			n, _ := alignUp(e.n)
			for k := e.off / allocAlign; k < (e.off+n)/allocAlign; k++ {
				owner[k] = 0
			}
			continue
		}
		n := uint64(r.IntN(3000) + 1)
		o, ok := a.alloc(n)
		if !ok {
			continue
		}
		rn, _ := alignUp(n)
		if o%allocAlign != 0 || o+rn > size {
			t.Fatalf("bad extent %d+%d", o, rn)
		}
		for k := o / allocAlign; k < (o+rn)/allocAlign; k++ {
			if owner[k] != 0 {
				t.Fatalf("step %d: extent %d+%d overlaps a live one", i, o, rn)
			}
			owner[k] = i + 1
		}
		live = append(live, ext{o, n})
	}
	for _, e := range live {
		a.release(e.off, e.n)
	}
	if len(a.free) != 1 || a.freeBytes() != size {
		t.Fatalf("free list after releasing everything: %v", a.free)
	}
}
