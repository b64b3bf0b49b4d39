package umbp_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
)

// BenchmarkLookupCost measures what a scheduler handle adds to a lookup: the
// same BatchExists of 1, 64 and 1024 keys (of 100 bytes, as KeyCodec makes
// them), half of them stored, through SchedulerHandle.Lookup and
// through a bare generated stub in the same process, interleaved call by
// call, so that both see the same machine. It reports each one's median
// (handle-ns, stub-ns) and the median of the pairwise differences
// (cost-ns); ns/op is a pair's time.
func BenchmarkLookupCost(b *testing.B) {
	srv := benchServer(b, 256<<20)
	cfg := testConfig(b, srv.Endpoint())
	cfg.LookupTimeout = 10 * time.Second
	rt := newRuntime(b, cfg)
	ctx := context.Background()
	e := newEngine(b, rt, 1, 512, 4096)
	// As long as KeyCodec's keys: its prefix, then a 64-digit hash.
	prefix := "umbp:vllm:v1:bench:tp0:pcp0:dcp0:pp0:g0:" + strings.Repeat("0", 54)
	job := e.w.Store(e.plans(b, prefix, ids(512)...))
	if err := e.w.Wait(ctx, job); err != nil || job.Status() != umbp.JobCompleted {
		b.Fatalf("seed: %v %s", err, job.Err())
	}
	h, err := rt.NewSchedulerHandle(ctx, "bench", umbp.RankTopology{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close() })
	cc, err := grpc.NewClient(srv.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	stub := umbppb.NewUMBPStandaloneClient(cc)

	for _, n := range []int{1, 64, 1024} {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("%s-%d", prefix, i) // ids >= 512 are misses
			if i%2 == 1 {
				keys[i] = fmt.Sprintf("%s-%d", prefix, 512+i)
			}
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			var hs, ss, ds []float64
			for i := 0; b.Loop(); i++ {
				// Alternate which goes first, so that neither always
				// follows the other's wake-ups.
				var th, ts time.Duration
				for k := range 2 {
					if (i+k)%2 == 0 {
						t0 := time.Now()
						if got := h.Lookup(ctx, keys); !got[0] {
							b.Fatal("miss")
						}
						th = time.Since(t0)
					} else {
						t0 := time.Now()
						resp, err := stub.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
						if err != nil || !resp.Ok[0] {
							b.Fatal(err)
						}
						ts = time.Since(t0)
					}
				}
				hs = append(hs, float64(th))
				ss = append(ss, float64(ts))
				ds = append(ds, float64(th-ts))
			}
			b.ReportMetric(medianOf(hs), "handle-ns")
			b.ReportMetric(medianOf(ss), "stub-ns")
			b.ReportMetric(medianOf(ds), "cost-ns")
		})
	}
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
