package umbp_test

import (
	"context"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
)

// soakScheduler drives lookups until stop.
func soakScheduler(s *soakRun, h *umbp.SchedulerHandle, rng *rand.Rand, stop <-chan struct{}) {
	ctx := context.Background()
	for {
		select {
		case <-stop:
			return
		default:
		}
		n := 1 + rng.IntN(16)
		keys := make([]string, n)
		for i := range keys {
			keys[i] = soakKey(rng.IntN(soakKeySpace))
		}
		switch r := rng.IntN(1000); {
		case r < 600:
			start := time.Now()
			got := h.Lookup(ctx, keys)
			s.timed("Lookup", start)
			if len(got) != n {
				s.fail("Lookup of %d keys answered %d", n, len(got))
			}
			hits := 0
			for _, g := range got {
				if g {
					hits++
				}
			}
			s.count("lookup keys/hit", hits)
			s.count("lookup keys/miss", n-hits)
		case r < 997:
			start := time.Now()
			got := h.LookupPrefix(ctx, keys)
			s.timed("LookupPrefix", start)
			if got < 0 || got > n {
				s.fail("LookupPrefix of %d keys answered %d", n, got)
			}
			if got > 0 {
				s.count("prefix/nonzero", 1)
			}
		default:
			start := time.Now()
			ok := h.Clear(ctx) == nil
			s.timed("Clear", start)
			s.count("clear/"+strconv.FormatBool(ok), 1)
		}
		if rng.IntN(4) == 0 {
			start := time.Now()
			_ = h.Stats()
			_ = h.State()
			s.timed("Stats", start)
		}
		time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond)
	}
}

// soakSampler samples goroutines and heap until stop.
type soakSampler struct {
	mu         sync.Mutex
	goroutines []int
	heap       []uint64
}

func (m *soakSampler) run(stop <-chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var ms runtime.MemStats
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		g := runtime.NumGoroutine()
		m.mu.Lock()
		m.goroutines = append(m.goroutines, g)
		m.mu.Unlock()
		if i%5 == 0 {
			runtime.ReadMemStats(&ms)
			m.mu.Lock()
			m.heap = append(m.heap, ms.HeapAlloc)
			m.mu.Unlock()
		}
	}
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("UMBP_SOAK_SECONDS")
	if v == "" {
		return 20 * time.Second
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("UMBP_SOAK_SECONDS=%q: want a positive number of seconds", v)
	}
	return time.Duration(f * float64(time.Second))
}

func soakSeed(t *testing.T) uint64 {
	v := os.Getenv("UMBP_SOAK_SEED")
	if v == "" {
		return rand.Uint64()
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("UMBP_SOAK_SEED=%q: %v", v, err)
	}
	return seed
}
