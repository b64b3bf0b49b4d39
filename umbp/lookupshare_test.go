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
		standalone := func() bool {
			resp, err := stub.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: keys})
			return err == nil && resp.Ok[0]
		}
		master := func() bool {
			resp, err := raw.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: held})
			return err == nil && len(resp.Found) == n && resp.Found[n-1]
		}
		// lookup is h's Lookup of keys, answered right when keys[hit] is held.
		lookup := func(h *umbp.SchedulerHandle, keys []string, hit int) func() bool {
			return func() bool { return h.Lookup(ctx, keys)[hit] }
		}
		for _, c := range []struct {
			name         string
			handle, bare func() bool
		}{
			{"standalone/handle", lookup(h, keys, 0), standalone},
			{"standalone/handle-grpc", lookup(hg, keys, 0), standalone},
			{"master/handle", lookup(ch, held, n-1), master},
			{"master/handle-grpc", lookup(chg, held, n-1), master},
		} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, c.name), func(b *testing.B) {
				alternate(b, time.Microsecond, nil, func() {
					if !c.handle() {
						b.Fatal("the handle missed")
					}
				}, func() {
					if !c.bare() {
						b.Fatal("the stub missed")
					}
				})
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
