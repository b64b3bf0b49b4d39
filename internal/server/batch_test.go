package server

import (
	"fmt"
	"log/slog"
	"testing"
)

// A put batch publishes what it holds once it holds an eighth of the pool,
// so that other clients' stores can evict it meanwhile; every key is
// stored in the end.
func TestPutBatchBoundsWhatItHolds(t *testing.T) {
	const capacity, size = 1 << 20, 64 << 10 // an eighth: two objects
	p, err := newPool(capacity, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	s := &Server{pool: p, log: slog.New(slog.DiscardHandler)}
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	res := make([]bool, len(keys))
	pb := s.newPutBatch("test put", "client", keys, res, p.newBatch(), len(keys))
	defer pb.release()
	for i := range keys {
		if _, _, ok := pb.reserve(i, size); !ok {
			t.Fatalf("reserve %d refused", i)
		}
		p.mu.Lock()
		held := p.used - p.stored
		p.mu.Unlock()
		if held > capacity/8 {
			t.Fatalf("after %d reservations the batch holds %d bytes unpublished, more than an eighth of the pool", i+1, held)
		}
	}
	pb.finish()
	for i, ok := range res {
		if !ok {
			t.Errorf("key %d not stored", i)
		}
	}
	if p.stored != uint64(len(keys)*size) {
		t.Errorf("%d bytes stored, want %d", p.stored, len(keys)*size)
	}
}
