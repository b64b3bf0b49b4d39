// Package slicepool recycles large slices that a hot path would otherwise
// allocate once a request: a ranged request's thousands of ranges, its copy
// list.
package slicepool

import "sync"

// Pool hands out slices of T. The zero Pool is not usable: use New.
type Pool[T any] struct {
	p   sync.Pool // of *[]T, every element zero
	max int
}

// New returns a pool that keeps slices of up to maxCap elements; larger
// ones are left to the garbage collector.
func New[T any](maxCap int) *Pool[T] { return &Pool[T]{max: maxCap} }

// Get returns a slice of n zero elements.
func (p *Pool[T]) Get(n int) []T {
	if s, ok := p.p.Get().(*[]T); ok {
		if cap(*s) >= n {
			return (*s)[:n]
		}
		p.p.Put(s) // too small for this one; kept for a smaller one
	}
	return make([]T, n)
}

// Put gives s back, its elements zeroed (so the pool holds no references).
// s must come back at the length it was last written to: what lies past it
// is not cleared (clearing a large slice's whole capacity on every Put
// would cost the small requests that reuse it). The caller must not use s
// afterwards.
func (p *Pool[T]) Put(s []T) {
	if cap(s) == 0 || cap(s) > p.max {
		return
	}
	clear(s)
	s = s[:0]
	p.p.Put(&s)
}
