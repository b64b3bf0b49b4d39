package server

import (
	"fmt"
	"testing"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// BenchmarkBatchExists1024 measures a 1024-key BatchExists round trip (half
// of the keys stored) through the generated client.
func BenchmarkBatchExists1024(b *testing.B) {
	h := newHarness(b, Options{Capacity: 64 << 20})
	m := newMemfd(b, 1<<20)
	h.register(b, "bench", m)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("model/layer-%04d/block-%08x", i, i*2654435761)
		if i%2 == 0 {
			wantOK(b, "put", h.put(b, "bench", keys[i], m.base, 0, 4096))
		}
	}
	ctx := ctxT(b)
	req := &umbppb.BatchKeysRequest{Keys: keys}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := h.c.BatchExists(ctx, req)
		if err != nil || len(r.Ok) != len(keys) {
			b.Fatalf("BatchExists: %v", err)
		}
	}
}

// BenchmarkPing measures one Ping round trip through the generated client.
func BenchmarkPing(b *testing.B) {
	h := newHarness(b, Options{Capacity: 1 << 20})
	ctx := ctxT(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.c.Ping(ctx, &umbppb.Empty{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBatchPutRanges measures a ranged store of 256 objects of 32
// ranges of 2 KiB, range j of object i at slot j·256+i (a layer-major KV
// cache), through the generated client; the pool is cleared between stores.
func BenchmarkBatchPutRanges(b *testing.B) {
	const objects, layers, rs = 256, 32, 2048
	h := newHarness(b, Options{Capacity: 64 << 20})
	m := newMemfd(b, objects*layers*rs)
	h.register(b, "bench", m)
	req := &umbppb.BatchRangeDataRequest{ClientId: "bench"}
	for i := range objects {
		req.Keys = append(req.Keys, fmt.Sprintf("obj-%d", i))
		req.RangeCounts = append(req.RangeCounts, layers)
		req.ObjectSizes = append(req.ObjectSizes, layers*rs)
		for j := range layers {
			req.ShmOffsets = append(req.ShmOffsets, uint64((j*objects+i)*rs))
			req.RegionBases = append(req.RegionBases, m.base)
			req.Sizes = append(req.Sizes, rs)
			req.ObjectOffsets = append(req.ObjectOffsets, uint64(j*rs))
		}
	}
	ctx := ctxT(b)
	b.SetBytes(objects * layers * rs)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		if _, err := h.c.Clear(ctx, &umbppb.Empty{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		r, err := h.c.BatchPutRanges(ctx, req)
		if err != nil || len(r.Ok) != objects || !r.Ok[0] {
			b.Fatalf("BatchPutRanges: %v", err)
		}
	}
}

// BenchmarkCopyHost measures the copier alone between a memfd (a client
// region) and a prefaulted pool, both ways, with the non-temporal copy
// (cold) and with copy: a request of 256 × 64 KiB and one of 64 × 4 MiB.
func BenchmarkCopyHost(b *testing.B) {
	const total = 256 << 20
	m := newMemfd(b, total)
	fill(m.mem, 1)
	p, err := newPool(total, true, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.close() })
	for _, size := range []int{64 << 10, 4 << 20} {
		for _, dir := range []string{"put", "get"} {
			for _, cold := range []bool{true, false} {
				name := fmt.Sprintf("%s/%dKiB/copy", dir, size>>10)
				if cold {
					name = fmt.Sprintf("%s/%dKiB/cold", dir, size>>10)
				}
				b.Run(name, func(b *testing.B) {
					if cold && !haveNTCopy {
						b.Skip("no non-temporal copy on this CPU")
					}
					defer func(was bool) { haveNTCopy = was }(haveNTCopy)
					haveNTCopy = cold
					n := total / size
					if size == 64<<10 {
						n = 256
					}
					b.SetBytes(int64(n * size))
					for b.Loop() {
						c := copyBatch{}
						for i := range n {
							mem, pool := m.mem[i*size:(i+1)*size], p.arena[i*size:(i+1)*size]
							if dir == "put" {
								c.queueHost(i, pool, mem)
							} else {
								c.queueHost(i, mem, pool)
							}
						}
						if errs := c.copyHost(); errs != nil {
							b.Fatal(errs)
						}
					}
				})
			}
		}
	}
}

// BenchmarkBatchPut and BenchmarkBatchGet measure a plain BatchPut (a
// BatchGet) of n objects of one range each, through the generated client,
// on a prefaulted pool: 256 × 64 KiB and 256 × 4 KiB (small objects, whose
// copies must still use every processor) and 8 × 4 MiB. The pool holds
// eight requests, so that a store is copied in one piece (a request is
// finished in parts at an eighth of the pool); it is cleared between
// stores, and a load's destination is left as the last load wrote it.
func BenchmarkBatchPut(b *testing.B) { benchBatch(b, true) }

func BenchmarkBatchGet(b *testing.B) { benchBatch(b, false) }

func benchBatch(b *testing.B, put bool) {
	for _, c := range []struct {
		n, size int
	}{{256, 64 << 10}, {256, 4 << 10}, {8, 4 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", c.n, c.size>>10), func(b *testing.B) {
			total := c.n * c.size
			h := newHarness(b, Options{Capacity: uint64(8 * total), Prefault: true})
			m := newMemfd(b, 2*total)
			fill(m.mem[:total], 3)
			h.register(b, "bench", m)
			req := &umbppb.BatchDataRequest{ClientId: "bench"}
			for i := range c.n {
				req.Keys = append(req.Keys, fmt.Sprintf("obj-%d", i))
				req.ShmOffsets = append(req.ShmOffsets, uint64(i*c.size))
				req.Sizes = append(req.Sizes, uint64(c.size))
				req.RegionBases = append(req.RegionBases, m.base)
			}
			ctx := ctxT(b)
			call := h.c.BatchPut
			if !put {
				r, err := h.c.BatchPut(ctx, req)
				if err != nil || !allTrue(r.Ok) {
					b.Fatalf("BatchPut: %v %v", r.GetOk(), err)
				}
				for i := range req.ShmOffsets {
					req.ShmOffsets[i] += uint64(total) // load into the second half
				}
				call = h.c.BatchGet
			}
			b.SetBytes(int64(total))
			b.ReportAllocs()
			for b.Loop() {
				if put {
					b.StopTimer()
					if _, err := h.c.Clear(ctx, &umbppb.Empty{}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				r, err := call(ctx, req)
				if err != nil || !allTrue(r.Ok) {
					b.Fatalf("batch: %v %v", r.GetOk(), err)
				}
			}
			if !put {
				wantBytes(b, "loaded", m.mem[total:], m.mem[:total])
			}
		})
	}
}

func allTrue(v []bool) bool {
	for _, ok := range v {
		if !ok {
			return false
		}
	}
	return len(v) > 0
}
