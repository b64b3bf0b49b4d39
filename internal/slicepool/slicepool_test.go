package slicepool

import (
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestGetPut(t *testing.T) {
	p := New[*int](8)
	s := p.Get(4)
	if len(s) != 4 {
		t.Fatalf("Get(4) has length %d", len(s))
	}
	x := 1
	for i := range s {
		s[i] = &x
	}
	p.Put(s)
	// Whatever comes back, recycled or new, is zero.
	for range 3 {
		got := p.Get(3)
		if len(got) != 3 {
			t.Fatalf("Get(3) has length %d", len(got))
		}
		for i, v := range got {
			if v != nil {
				t.Fatalf("element %d of a recycled slice is not zero", i)
			}
		}
		p.Put(got)
	}
	if got := p.Get(100); len(got) != 100 {
		t.Fatalf("Get(100) has length %d", len(got))
	}
	p.Put(make([]*int, 100)) // over the bound: dropped, not kept
}

// The pool is safe for concurrent use; run with -race.
func TestConcurrent(t *testing.T) {
	p := New[int](1 << 10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				s := p.Get(i%64 + 1)
				for j := range s {
					if s[j] != 0 {
						t.Errorf("goroutine %d: a slice came back dirty", g)
						return
					}
					s[j] = g + 1
				}
				p.Put(s)
			}
		})
	}
	wg.Wait()
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
