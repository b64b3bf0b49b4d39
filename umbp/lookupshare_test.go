package umbp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// BenchmarkLookupShare measures a scheduler handle's own share of a lookup:
// Lookup (lock-step, and through grpc-go) and the same request on the bare
// generated stub, alternated call by call in one process, on a standalone
// server and on one master, for 1, 64 and 1024 keys. It reports the
// medians of each (handle-us, stub-us) and of the pairwise ratios
// (handle/stub): a host's noise moves both alike, so the ratio compares
// two builds where their own times cannot.
func BenchmarkLookupShare(b *testing.B) {
	ctx := context.Background()
	h, hg, stub, keysOf := lookupBench(b, "share")
	ch, chg, raw, ckeys := clusterLookupBench(b)
	for _, n := range []int{1, 64, 1024} {
		keys, held := keysOf(n), ckeys[:n]
		for _, c := range []struct {
			name string
			h    *umbp.SchedulerHandle
			call func() bool // the handle's lookup, answered right
			bare func() bool // the stub's
		}{
			{"standalone/handle", h, nil, nil},
			{"standalone/handle-grpc", hg, nil, nil},
			{"master/handle", ch, nil, nil},
			{"master/handle-grpc", chg, nil, nil},
		} {
			if c.h == h || c.h == hg {
				c.call = func() bool { return c.h.Lookup(ctx, keys)[0] }
				c.bare = func() bool {
					resp, err := stub.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
					return err == nil && resp.Ok[0]
				}
			} else {
				c.call = func() bool { return c.h.Lookup(ctx, held)[n-1] }
				c.bare = func() bool {
					resp, err := raw.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: held})
					return err == nil && len(resp.Found) == n && resp.Found[n-1]
				}
			}
			b.Run(fmt.Sprintf("keys=%d/%s", n, c.name), func(b *testing.B) {
				var hs, ss, rs []float64
				for i := 0; b.Loop(); i++ {
					var th, ts time.Duration
					for k := range 2 {
						t0 := time.Now()
						if (i+k)%2 == 0 {
							if !c.call() {
								b.Fatal("the handle missed")
							}
							th = time.Since(t0)
						} else {
							if !c.bare() {
								b.Fatal("the stub missed")
							}
							ts = time.Since(t0)
						}
					}
					hs = append(hs, float64(th)/1e3)
					ss = append(ss, float64(ts)/1e3)
					rs = append(rs, float64(th)/float64(ts))
				}
				b.ReportMetric(median(hs), "handle-us")
				b.ReportMetric(median(ss), "stub-us")
				b.ReportMetric(median(rs), "handle/stub")
			})
		}
	}
}

// clusterLookupBench is one in-process master over TCP loopback holding
// 1024 keys of one node, two handles on it (lock-step lookups, and lookups
// through grpc-go) and the bare generated client.
func clusterLookupBench(b *testing.B) (h, hg *umbp.SchedulerHandle, raw umbppb.UMBPMasterClient, keys []string) {
	m := umbptest.NewMaster(b, umbptest.MasterOptions{ReaperInterval: -1})
	raw = dialMaster(b, m.Addr())
	keys = make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("cluster-bench-%04d", i)
	}
	newFakeNode(b, raw, "n1", keys)
	cfg := clusterConfig(b, m.Addr())
	cfg.LookupTimeout = time.Second
	cfg.GRPCLookups = false
	h = newClusterHandle(b, cfg)
	cfg.GRPCLookups = true
	hg = newClusterHandle(b, cfg)
	return h, hg, raw, keys
}
