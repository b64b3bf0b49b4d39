package umbp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// BenchmarkLookupCost measures what a scheduler handle adds to a lookup,
// and what the lock-step call saves: the same BatchExists of 1, 64 and 1024
// keys (of 100 bytes, as KeyCodec makes them), half of them stored,
// through SchedulerHandle.Lookup lock-step (the default), through
// SchedulerHandle.Lookup on grpc-go's call path (Config.GRPCLookups), and
// through a bare generated stub in the same process, interleaved call by
// call, the first of the three in turn, so that all see the same machine.
// It reports each one's median (handle-ns, grpc-handle-ns, stub-ns), the
// median of the pairwise differences grpc-handle − stub (cost-ns: what the
// handle adds on the same call path) and the median of the pairwise ratios
// handle ÷ stub (handle/stub); ns/op is a triple's time.
func BenchmarkLookupCost(b *testing.B) {
	// As long as KeyCodec's keys: its prefix, then a 64-digit hash.
	h, hg, stub, keysOf := lookupBench(b, "umbp:vllm:v1:bench:tp0:pcp0:dcp0:pp0:g0:"+strings.Repeat("0", 54))
	ctx := context.Background()
	for _, n := range []int{1, 64, 1024} {
		keys := keysOf(n)
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			var hs, gs, ss, ds, rs []float64
			timed := func(f func()) time.Duration {
				t0 := time.Now()
				f()
				return time.Since(t0)
			}
			calls := [3]func(){
				func() {
					if got := h.Lookup(ctx, keys); !got[0] {
						b.Fatal("miss")
					}
				},
				func() {
					if got := hg.Lookup(ctx, keys); !got[0] {
						b.Fatal("miss")
					}
				},
				func() {
					resp, err := stub.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
					if err != nil || !resp.Ok[0] {
						b.Fatal(err)
					}
				},
			}
			for i := 0; b.Loop(); i++ {
				var t [3]time.Duration
				for k := range 3 {
					j := (i + k) % 3
					t[j] = timed(calls[j])
				}
				hs = append(hs, float64(t[0]))
				gs = append(gs, float64(t[1]))
				ss = append(ss, float64(t[2]))
				ds = append(ds, float64(t[1]-t[2]))
				rs = append(rs, float64(t[0])/float64(t[2]))
			}
			b.ReportMetric(median(hs), "handle-ns")
			b.ReportMetric(median(gs), "grpc-handle-ns")
			b.ReportMetric(median(ss), "stub-ns")
			b.ReportMetric(median(ds), "cost-ns")
			b.ReportMetric(median(rs), "handle/stub")
		})
	}
}
