package umbp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// BenchmarkLookupCost measures what a scheduler handle adds to a lookup: the
// same BatchExists of 1, 64 and 1024 keys (of 100 bytes, as KeyCodec makes
// them), half of them stored, through SchedulerHandle.Lookup and
// through a bare generated stub in the same process, interleaved call by
// call, so that both see the same machine. It reports each one's median
// (handle-ns, stub-ns) and the median of the pairwise differences
// (cost-ns); ns/op is a pair's time.
func BenchmarkLookupCost(b *testing.B) {
	// As long as KeyCodec's keys: its prefix, then a 64-digit hash.
	h, stub, keysOf := lookupBench(b, "umbp:vllm:v1:bench:tp0:pcp0:dcp0:pp0:g0:"+strings.Repeat("0", 54))
	ctx := context.Background()
	for _, n := range []int{1, 64, 1024} {
		keys := keysOf(n)
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
			b.ReportMetric(median(hs), "handle-ns")
			b.ReportMetric(median(ss), "stub-ns")
			b.ReportMetric(median(ds), "cost-ns")
		})
	}
}
