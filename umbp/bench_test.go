package umbp_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
)

// benchServer starts the Go server with its pool mapped up front, as a
// production server's is.
func benchServer(b *testing.B, capacity uint64) *server.Server {
	b.Helper()
	dir, err := os.MkdirTemp("", "umbpb")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := server.New(server.Options{
		Endpoint: filepath.Join(dir, "b.grpc.sock"),
		Capacity: capacity,
		Prefault: true,
		Logger:   testLogger(b),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		srv.Close()
		os.RemoveAll(dir)
	})
	return srv
}

// lookupBench starts the Go server with 512 objects stored under
// "<prefix>-<id>", and returns two scheduler handles on it, lookups
// lock-step (h) and through grpc-go (hg, Config.GRPCLookups), a bare
// generated stub, and the n keys a lookup asks: ids 0, 513, 2, 515, …, half
// of them stored.
func lookupBench(b *testing.B, prefix string) (h, hg *umbp.SchedulerHandle, stub umbppb.UMBPStandaloneClient, keysOf func(n int) []string) {
	srv := benchServer(b, 256<<20)
	cfg := testConfig(b, srv.Endpoint())
	cfg.LookupTimeout = 10 * time.Second
	cfg.GRPCLookups = false
	rt := newRuntime(b, cfg)
	cfg.GRPCLookups = true
	grt := newRuntime(b, cfg)
	ctx := context.Background()
	e := newEngine(b, rt, 1, 512, 4096)
	job := e.w.Store(e.plans(b, prefix, ids(512)...))
	if err := e.w.Wait(ctx, job); err != nil || job.Status() != umbp.JobCompleted {
		b.Fatalf("seed: %v %s", err, job.Err())
	}
	for _, p := range []struct {
		rt *umbp.StandaloneRuntime
		h  **umbp.SchedulerHandle
	}{{rt, &h}, {grt, &hg}} {
		s, err := p.rt.NewSchedulerHandle(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		*p.h = s
	}
	cc, err := grpc.NewClient(srv.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	keysOf = func(n int) []string {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s-%d", prefix, i) // ids >= 512 are misses
			if i%2 == 1 {
				keys[i] = fmt.Sprintf("%s-%d", prefix, 512+i)
			}
		}
		return keys
	}
	return h, hg, umbppb.NewUMBPStandaloneClient(cc), keysOf
}

// BenchmarkLookup compares SchedulerHandle.Lookup, lock-step (handle) and
// through grpc-go (handle-grpc), with the same BatchExists made directly on
// the generated stub, for 1, 64 and 1024 keys, half of them stored.
func BenchmarkLookup(b *testing.B) {
	h, hg, stub, keysOf := lookupBench(b, "lookup")
	ctx := context.Background()
	for _, n := range []int{1, 64, 1024} {
		keys := keysOf(n)
		for _, c := range []struct {
			name string
			h    *umbp.SchedulerHandle
		}{{"handle", h}, {"handle-grpc", hg}} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, c.name), func(b *testing.B) {
				for b.Loop() {
					if got := c.h.Lookup(ctx, keys); !got[0] {
						b.Fatal("miss")
					}
				}
			})
		}
		b.Run(fmt.Sprintf("keys=%d/stub", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := stub.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
				if err != nil || !resp.Ok[0] {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTransfer measures Store and Load through a worker handle against
// a plain in-process copy of the same ranges, in GB/s (MB/s as printed by
// the testing package): 256 objects of 64 KiB in 32 ranges of 2 KiB, and 64
// objects of 4 MiB in 32 ranges of 128 KiB.
func BenchmarkTransfer(b *testing.B) {
	for _, c := range []struct {
		name          string
		objects       int
		ranges        int
		rangeBytes    uint64
		serverRangeIO bool
	}{
		{"256x64KiB", 256, 32, 2 << 10, true},
		{"64x4MiB", 64, 32, 128 << 10, true},
	} {
		total := uint64(c.objects*c.ranges) * c.rangeBytes
		srv := benchServer(b, 2*total+64<<20)
		cfg := testConfig(b, srv.Endpoint())
		cfg.Timeout = time.Minute
		rt := newRuntime(b, cfg)
		// c.ranges layers of c.objects blocks: each object one range per layer.
		src := newEngine(b, rt, c.ranges, c.objects, c.rangeBytes)
		dst := newEngine(b, rt, c.ranges, c.objects, c.rangeBytes)
		plans := src.plans(b, c.name, ids(c.objects)...)
		src.fill(plans, 7)
		clear(dst.buf.Bytes())
		sched, err := rt.NewSchedulerHandle(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		// One untimed round trip first: the first touch of fresh memory
		// (client pages through the server's mappings, the pool) is not
		// what these measure.
		warm := src.w.Store(plans)
		if err := src.w.Wait(ctx, warm); err != nil || warm.Status() != umbp.JobCompleted {
			b.Fatalf("warm-up store: %v %s", err, warm.Err())
		}
		warm = dst.w.Load(plans2(b, dst, plans))
		if err := dst.w.Wait(ctx, warm); err != nil || warm.Status() != umbp.JobCompleted {
			b.Fatalf("warm-up load: %v %s", err, warm.Err())
		}

		b.Run(c.name+"/store", func(b *testing.B) {
			b.SetBytes(int64(total))
			for b.Loop() {
				b.StopTimer()
				sched.Clear(ctx)
				b.StartTimer()
				job := src.w.Store(plans)
				if err := src.w.Wait(ctx, job); err != nil || job.Status() != umbp.JobCompleted {
					b.Fatalf("store: %v %s", err, job.Err())
				}
			}
		})
		job := src.w.Store(plans)
		if err := src.w.Wait(ctx, job); err != nil || job.Status() != umbp.JobCompleted {
			b.Fatalf("store: %v %s", err, job.Err())
		}
		b.Run(c.name+"/load", func(b *testing.B) {
			b.SetBytes(int64(total))
			loads := plans2(b, dst, plans)
			for b.Loop() {
				job := dst.w.Load(loads)
				if err := dst.w.Wait(ctx, job); err != nil || job.Status() != umbp.JobCompleted {
					b.Fatalf("load: %v %s", err, job.Err())
				}
			}
			dst.check(b, loads, 7, ids(c.objects))
		})
		// The same bytes copied range by range in this process, from one
		// engine's memory to the other's: what a transfer cannot beat.
		b.Run(c.name+"/memcpy", func(b *testing.B) {
			b.SetBytes(int64(total))
			sm, dm := src.buf.Bytes(), dst.buf.Bytes()
			for b.Loop() {
				for _, p := range plans {
					for _, r := range p.Ranges {
						off := int(r.BaseAddress - src.buf.Buffer().Ptr)
						copy(dm[off:off+int(r.Length)], sm[off:off+int(r.Length)])
					}
				}
			}
		})
		sched.Close()
	}
}

// plans2 returns dst's plans for the keys of plans, block for block.
func plans2(b *testing.B, dst *engine, plans []umbp.BlockTransferPlan) []umbp.BlockTransferPlan {
	out := make([]umbp.BlockTransferPlan, len(plans))
	for i, p := range plans {
		q, err := dst.plan.PlanForBlock(p.Key, 0, p.BlockID)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = q
	}
	return out
}

// BenchmarkJobOverhead measures what a job costs beyond the server's copy:
// 256 objects of 64 bytes, one range each, stored (the keys are already
// held, so the server copies nothing) and loaded, Store or Load and Wait.
func BenchmarkJobOverhead(b *testing.B) {
	srv := benchServer(b, 64<<20)
	cfg := testConfig(b, srv.Endpoint())
	cfg.Timeout = time.Minute
	rt := newRuntime(b, cfg)
	e := newEngine(b, rt, 1, 256, 64)
	plans := e.plans(b, "overhead", ids(256)...)
	ctx := context.Background()
	for _, what := range []string{"store", "load"} {
		b.Run(what, func(b *testing.B) {
			if err := e.w.Wait(ctx, e.w.Store(plans)); err != nil {
				b.Fatal(err) // what is loaded, and stored again
			}
			for b.Loop() {
				var job *umbp.TransferJob
				if what == "store" {
					job = e.w.Store(plans)
				} else {
					job = e.w.Load(plans)
				}
				if err := e.w.Wait(ctx, job); err != nil {
					b.Fatalf("%s: %v", what, err)
				}
			}
		})
	}
}

// BenchmarkClusterLookup compares a cluster handle's Lookup, lock-step
// (handle) and through grpc-go (handle-grpc), with the same BatchLookup made
// directly on the generated stub, against one in-process master over TCP
// loopback, for 1, 64 and 1024 keys, all of them held.
func BenchmarkClusterLookup(b *testing.B) {
	h, hg, raw, keys := clusterLookupBench(b)
	ctx := context.Background()
	for _, n := range []int{1, 64, 1024} {
		keys := keys[:n]
		for _, c := range []struct {
			name string
			h    *umbp.SchedulerHandle
		}{{"handle", h}, {"handle-grpc", hg}} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, c.name), func(b *testing.B) {
				for b.Loop() {
					if got := c.h.Lookup(ctx, keys); !got[n-1] {
						b.Fatal("miss")
					}
				}
			})
		}
		b.Run(fmt.Sprintf("keys=%d/stub", n), func(b *testing.B) {
			for b.Loop() {
				resp, err := raw.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: keys})
				if err != nil || len(resp.Found) != n || !resp.Found[n-1] {
					b.Fatal(err)
				}
			}
		})
	}
}
