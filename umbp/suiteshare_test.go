package umbp_test

import (
	"context"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
)

// BenchmarkSuiteShare measures the handle's own share of the copy rows of
// `umbp bench -suite` against the Go server: each row's job through a
// worker handle (Store or Load, then Wait) and the same bytes moved by one
// request of a bare generated stub, alternated job by job in one process.
// It reports each one's median (handle-ms, stub-ms) and the median of the
// pairwise ratios (handle/stub); the pool is cleared, unmeasured, before
// every store.
func BenchmarkSuiteShare(b *testing.B) {
	const bufBytes = 256 << 20
	const warmRounds = 8
	srv := benchServer(b, 512<<20)
	cfg := testConfig(b, srv.Endpoint())
	cfg.Timeout = time.Minute
	rt := newRuntime(b, cfg)
	ctx := context.Background()

	hb, err := umbp.NewHostBuffer(bufBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hb.Close() })
	w, err := rt.NewWorkerHandle(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	if err := w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": hb.Buffer()}); err != nil {
		b.Fatal(err)
	}
	hbase := hb.Buffer().Ptr

	// The stub: its own memfd, handed over and registered by hand.
	fd, err := unix.MemfdCreate("umbp-bench-stub", unix.MFD_CLOEXEC)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, bufBytes); err != nil {
		b.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, bufBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(mem) })
	sbase := uint64(uintptr(unsafe.Pointer(&mem[0])))
	const stubID = "umbp-go-bench-stub"
	if err := fdpass.Send(ctx, rt.FDSocketPath(), fd, fdpass.Registration{ClientID: stubID, WorkerBase: sbase, Size: bufBytes}, nil); err != nil {
		b.Fatal(err)
	}
	cc, err := grpc.NewClient(srv.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	stub := umbppb.NewUMBPStandaloneClient(cc)
	if r, err := stub.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: stubID, WorkerBase: sbase, Size: bufBytes, Kind: umbppb.MemoryKind_MEMORY_KIND_HOST_SHM}); err != nil || !r.Ok {
		b.Fatalf("stub registration: %v %v", r, err)
	}
	b.Cleanup(func() { stub.DeregisterMemory(context.Background(), &umbppb.DeregisterMemoryRequest{ClientId: stubID}) })

	for _, row := range []struct {
		name        string
		objects     int
		ranges      int
		rangeBytes  uint64
		interleaved bool // range j of object i at slot j*objects+i, as a layer-major cache
		ranged      bool
	}{
		{name: "64KiBx256", objects: 256, ranges: 1, rangeBytes: 64 << 10},
		{name: "4MiBx64", objects: 64, ranges: 1, rangeBytes: 4 << 20},
		{name: "ranges_256x32x2KiB", objects: 256, ranges: 32, rangeBytes: 2 << 10, interleaved: true, ranged: true},
	} {
		objBytes := uint64(row.ranges) * row.rangeBytes
		offset := func(i, j int) uint64 { // of range j of object i in a buffer
			if row.interleaved {
				return uint64(j*row.objects+i) * row.rangeBytes
			}
			return uint64(i)*objBytes + uint64(j)*row.rangeBytes
		}
		keys := make([]string, row.objects)
		plans := make([]umbp.BlockTransferPlan, row.objects)
		for i := range keys {
			keys[i] = fmt.Sprintf("share-%s-%d", row.name, i)
			p := umbp.BlockTransferPlan{Key: keys[i], BlockID: i}
			for j := range row.ranges {
				p.Ranges = append(p.Ranges, umbp.KVRange{BaseAddress: hbase + uintptr(offset(i, j)), Length: row.rangeBytes, ObjectOffset: uint64(j) * row.rangeBytes})
			}
			plans[i] = p
		}
		stubCall := func(put bool) {
			if row.ranged {
				req := &umbppb.BatchRangeDataRequest{ClientId: stubID, Keys: keys}
				for i := range keys {
					req.RangeCounts = append(req.RangeCounts, uint32(row.ranges))
					if put {
						req.ObjectSizes = append(req.ObjectSizes, objBytes)
					}
					for j := range row.ranges {
						req.ShmOffsets = append(req.ShmOffsets, offset(i, j))
						req.RegionBases = append(req.RegionBases, sbase)
						req.Sizes = append(req.Sizes, row.rangeBytes)
						req.ObjectOffsets = append(req.ObjectOffsets, uint64(j)*row.rangeBytes)
					}
				}
				call := stub.BatchGetRanges
				if put {
					call = stub.BatchPutRanges
				}
				if r, err := call(ctx, req); err != nil || len(r.Ok) != len(keys) || !r.Ok[0] {
					b.Fatalf("stub ranged put %v: %v", put, err)
				}
				return
			}
			req := &umbppb.BatchDataRequest{ClientId: stubID, Keys: keys}
			for i := range keys {
				req.ShmOffsets = append(req.ShmOffsets, offset(i, 0))
				req.Sizes = append(req.Sizes, objBytes)
				req.RegionBases = append(req.RegionBases, sbase)
			}
			call := stub.BatchGet
			if put {
				call = stub.BatchPut
			}
			if r, err := call(ctx, req); err != nil || len(r.Ok) != len(keys) || !r.Ok[0] {
				b.Fatalf("stub put %v: %v", put, err)
			}
		}
		handleCall := func(put bool) {
			var job *umbp.TransferJob
			if put {
				job = w.Store(plans)
			} else {
				job = w.Load(plans)
			}
			if err := w.Wait(ctx, job); err != nil {
				b.Fatalf("handle put %v: %v", put, err)
			}
		}
		clear := func() {
			if r, err := stub.Clear(ctx, &umbppb.Empty{}); err != nil || !r.Ok {
				b.Fatalf("clear: %v", err)
			}
		}
		for _, put := range []bool{true, false} {
			what := "get"
			if put {
				what = "put"
			}
			b.Run(what+"_"+row.name, func(b *testing.B) {
				if !put {
					clear()
					handleCall(true) // what both load
				}
				// Untimed rounds first: the first rounds on a fresh pool
				// measure its page faults (512 MiB taken a job at a time),
				// not the clients.
				for range warmRounds {
					if put {
						clear()
					}
					handleCall(put)
					if put {
						clear()
					}
					stubCall(put)
				}
				var before func() // untimed, before each call: a store's clear
				if put {
					before = clear
				}
				alternate(b, time.Millisecond, before, func() { handleCall(put) }, func() { stubCall(put) })
			})
		}
	}
}

// alternate runs handle and stub by turns, once each a round of b.Loop,
// the one first that went second the round before, before (when not nil)
// untimed ahead of each; it reports the medians of each one's time in
// unit (handle-ms or handle-us, stub-…) and of their pairwise ratios
// (handle/stub).
func alternate(b *testing.B, unit time.Duration, before func(), handle, stub func()) {
	var hs, ss, rs []float64
	for i := 0; b.Loop(); i++ {
		var th, ts time.Duration
		for k := range 2 {
			if before != nil {
				b.StopTimer()
				before()
				b.StartTimer()
			}
			t0 := time.Now()
			if (i+k)%2 == 0 {
				handle()
				th = time.Since(t0)
			} else {
				stub()
				ts = time.Since(t0)
			}
		}
		hs = append(hs, float64(th)/float64(unit))
		ss = append(ss, float64(ts)/float64(unit))
		rs = append(rs, float64(th)/float64(ts))
	}
	name := map[time.Duration]string{time.Millisecond: "ms", time.Microsecond: "us"}[unit]
	b.ReportMetric(median(hs), "handle-"+name)
	b.ReportMetric(median(ss), "stub-"+name)
	b.ReportMetric(median(rs), "handle/stub")
}
