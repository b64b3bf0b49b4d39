package server

import "sort"

// allocAlign is the granularity of pool extents. A cache line keeps small
// objects from wasting much of a small pool, while KV blocks (kilobytes and
// up) stay page-aligned when their sizes are.
const allocAlign = 64

// extent is a byte range [off, off+len) of the arena.
type extent struct {
	off, len uint64
}

// allocator hands out extents of an arena of a fixed size: first fit over a
// free list sorted by offset, splitting on allocation and coalescing with
// both neighbours on free. It is not safe for concurrent use.
type allocator struct {
	size uint64
	free []extent // sorted by off, never adjacent, never empty
}

func newAllocator(size uint64) *allocator {
	a := &allocator{size: size}
	if size > 0 {
		a.free = []extent{{0, size}}
	}
	return a
}

// alignUp rounds n up to allocAlign; ok is false on overflow.
func alignUp(n uint64) (uint64, bool) {
	r := (n + allocAlign - 1) &^ (allocAlign - 1)
	return r, r >= n
}

// alloc returns the offset of n bytes (rounded up to allocAlign), or false
// when no free extent is large enough.
func (a *allocator) alloc(n uint64) (uint64, bool) {
	n, ok := alignUp(n)
	if !ok || n == 0 {
		return 0, false
	}
	for i := range a.free {
		e := &a.free[i]
		if e.len < n {
			continue
		}
		off := e.off
		if e.len == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			e.off += n
			e.len -= n
		}
		return off, true
	}
	return 0, false
}

// release returns the extent [off, off+n) (n as given to alloc).
func (a *allocator) release(off, n uint64) {
	n, _ = alignUp(n)
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	mergePrev := i > 0 && a.free[i-1].off+a.free[i-1].len == off
	mergeNext := i < len(a.free) && off+n == a.free[i].off
	switch {
	case mergePrev && mergeNext:
		a.free[i-1].len += n + a.free[i].len
		a.free = append(a.free[:i], a.free[i+1:]...)
	case mergePrev:
		a.free[i-1].len += n
	case mergeNext:
		a.free[i].off = off
		a.free[i].len += n
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
}

// freeBytes is the total of the free list.
func (a *allocator) freeBytes() uint64 {
	var t uint64
	for _, e := range a.free {
		t += e.len
	}
	return t
}
