package umbptest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// The conformance tests run against the test double, or against a real
// master when UMBP_MASTER_ADDR names one (with UMBP_MASTER_TTL_SEC, its
// UMBP_HEARTBEAT_TTL_SEC, default 10): the same checks, so that every
// difference between the two shows.

// manualClock is a clock a test moves by hand.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// target is a master under test.
type target struct {
	c   umbppb.UMBPMasterClient
	ttl time.Duration
	// expire makes node expire: it returns once the master has dropped
	// the node's keys (key is one the node holds).
	expire func(t *testing.T, node, key string)
	// ids makes node ids unique to this run (a real master outlives it).
	ids string
	// double is nil for a real master.
	double *umbptest.Master
	clock  *manualClock
}

var runSeq atomic.Int64

func newTarget(t *testing.T) *target {
	t.Helper()
	ids := fmt.Sprintf("%s-%d-%d-", t.Name(), os.Getpid(), runSeq.Add(1))
	if addr := os.Getenv("UMBP_MASTER_ADDR"); addr != "" {
		ttl := 10 * time.Second
		if s := os.Getenv("UMBP_MASTER_TTL_SEC"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			ttl = time.Duration(n) * time.Second
		}
		tg := &target{c: masterClient(t, addr), ttl: ttl, ids: ids}
		tg.expire = func(t *testing.T, node, key string) {
			t.Helper()
			// A real master expires on its own reaper: wait for it.
			ctx := ctxT(t, 20*ttl)
			for {
				r, err := tg.c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{key}})
				if err != nil {
					t.Fatal(err)
				}
				if !r.GetFound()[0] {
					return
				}
				time.Sleep(50 * time.Millisecond) // polling a real process
			}
		}
		return tg
	}
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	m := umbptest.NewMaster(t, umbptest.MasterOptions{
		HeartbeatTTL: time.Second, MaxMissedHeartbeats: 3, ReaperInterval: -1, Now: clk.Now,
	})
	tg := &target{c: masterClient(t, m.Addr()), ttl: time.Second, ids: ids, double: m, clock: clk}
	tg.expire = func(t *testing.T, node, _ string) {
		t.Helper()
		clk.Advance(3*time.Second + time.Millisecond)
		if got := m.Reap(); !slices.Contains(got, node) {
			t.Fatalf("Reap expired %v, want %s among them", got, node)
		}
	}
	return tg
}

func masterClient(t *testing.T, addr string) umbppb.UMBPMasterClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return umbppb.NewUMBPMasterClient(cc)
}

func (tg *target) register(t *testing.T, ctx context.Context, node string) *umbppb.RegisterClientResponse {
	t.Helper()
	r, err := tg.c.RegisterClient(ctx, &umbppb.RegisterClientRequest{
		NodeId: node, NodeAddress: "127.0.0.1:1", PeerAddress: "peer-" + node,
		TierCapacities: []*umbppb.TierCapacity{{Tier: umbppb.TierType_TIER_DRAM, TotalCapacityBytes: 1 << 30, AvailableCapacityBytes: 1 << 30}},
	})
	if err != nil {
		t.Fatalf("RegisterClient(%s): %v", node, err)
	}
	t.Cleanup(func() {
		_, _ = tg.c.UnregisterClient(context.Background(), &umbppb.UnregisterClientRequest{NodeId: node})
	})
	return r
}

func add(key string, tier umbppb.TierType) *umbppb.KvEvent {
	return &umbppb.KvEvent{Kind: umbppb.KvEvent_ADD, Key: key, Tier: tier, Size: 4096}
}

func remove(key string, tier umbppb.TierType) *umbppb.KvEvent {
	return &umbppb.KvEvent{Kind: umbppb.KvEvent_REMOVE, Key: key, Tier: tier}
}

func bundle(seq uint64, evs ...*umbppb.KvEvent) *umbppb.EventBundle {
	return &umbppb.EventBundle{Seq: seq, Events: evs}
}

func (tg *target) heartbeat(t *testing.T, ctx context.Context, node string, bundles ...*umbppb.EventBundle) *umbppb.HeartbeatResponse {
	t.Helper()
	r, err := tg.c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: node, Bundles: bundles})
	if err != nil {
		t.Fatalf("Heartbeat(%s): %v", node, err)
	}
	return r
}

func wantHB(t *testing.T, r *umbppb.HeartbeatResponse, st umbppb.ClientStatus, acked uint64, fullSync bool) {
	t.Helper()
	if r.GetStatus() != st || r.GetAckedSeq() != acked || r.GetRequestFullSync() != fullSync {
		t.Fatalf("heartbeat answered status=%v acked=%d full_sync=%v, want %v %d %v",
			r.GetStatus(), r.GetAckedSeq(), r.GetRequestFullSync(), st, acked, fullSync)
	}
}

func (tg *target) lookup(t *testing.T, ctx context.Context, keys ...string) []bool {
	t.Helper()
	r, err := tg.c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: keys})
	if err != nil {
		t.Fatalf("BatchLookup: %v", err)
	}
	if len(r.GetFound()) != len(keys) {
		t.Fatalf("BatchLookup of %d keys answered %d", len(keys), len(r.GetFound()))
	}
	return r.GetFound()
}

func wantFound(t *testing.T, got []bool, want ...bool) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("found %v, want %v", got, want)
	}
}

func wantCode(t *testing.T, err error, c codes.Code) {
	t.Helper()
	if status.Code(err) != c {
		t.Fatalf("got %v, want code %v", err, c)
	}
}

func TestMasterRegister(t *testing.T) { testMasterRegister(t, newTarget(t)) }

func testMasterRegister(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	r := tg.register(t, ctx, n)
	if r.GetHeartbeatIntervalMs() != uint64(tg.ttl.Milliseconds())/2 || r.GetAckSeq() != 0 {
		t.Fatalf("RegisterClient answered interval %d ms, ack_seq %d; want %d, 0",
			r.GetHeartbeatIntervalMs(), r.GetAckSeq(), tg.ttl.Milliseconds()/2)
	}
	_, err := tg.c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: n})
	wantCode(t, err, codes.AlreadyExists)
	// The first delta bundle is seq 1.
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(1, add(n+"k", umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	wantFound(t, tg.lookup(t, ctx, n+"k"), true)
}

func TestMasterRegisterSeqZeroIsAGap(t *testing.T) { testMasterRegisterSeqZeroIsAGap(t, newTarget(t)) }

func testMasterRegisterSeqZeroIsAGap(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	tg.register(t, ctx, n)
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(0, add(n+"k", umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 0, true)
	wantFound(t, tg.lookup(t, ctx, n+"k"), false)
}

func TestMasterHeartbeatIndex(t *testing.T) { testMasterHeartbeatIndex(t, newTarget(t)) }

func testMasterHeartbeatIndex(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	a, b := tg.ids+"a", tg.ids+"b"
	tg.register(t, ctx, a)
	tg.register(t, ctx, b)
	k := func(s string) string { return tg.ids + s }
	wantHB(t, tg.heartbeat(t, ctx, a, bundle(1, add(k("x"), umbppb.TierType_TIER_DRAM), add(k("y"), umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	wantHB(t, tg.heartbeat(t, ctx, b, bundle(1, add(k("y"), umbppb.TierType_TIER_HBM)), bundle(2, add(k("z"), umbppb.TierType_TIER_SSD))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 2, false)
	wantFound(t, tg.lookup(t, ctx, k("x"), k("y"), k("z"), k("w"), ""), true, true, true, false, false)
	wantFound(t, tg.lookup(t, ctx))

	// A REMOVE on the wrong tier is nothing; one node's REMOVE leaves the
	// other's copy.
	tg.heartbeat(t, ctx, a, bundle(2, remove(k("y"), umbppb.TierType_TIER_HBM)))
	wantFound(t, tg.lookup(t, ctx, k("y")), true)
	tg.heartbeat(t, ctx, b, bundle(3, remove(k("y"), umbppb.TierType_TIER_HBM)))
	wantFound(t, tg.lookup(t, ctx, k("y")), true)
	tg.heartbeat(t, ctx, a, bundle(3, remove(k("y"), umbppb.TierType_TIER_DRAM), remove(k("never"), umbppb.TierType_TIER_DRAM)))
	wantFound(t, tg.lookup(t, ctx, k("x"), k("y")), true, false)

	// The same key on two tiers of one node: removing one leaves it found.
	tg.heartbeat(t, ctx, a, bundle(4, add(k("x"), umbppb.TierType_TIER_SSD), add(k("x"), umbppb.TierType_TIER_DRAM)))
	tg.heartbeat(t, ctx, a, bundle(5, remove(k("x"), umbppb.TierType_TIER_DRAM)))
	wantFound(t, tg.lookup(t, ctx, k("x")), true)
	tg.heartbeat(t, ctx, a, bundle(6, remove(k("x"), umbppb.TierType_TIER_SSD)))
	wantFound(t, tg.lookup(t, ctx, k("x")), false)

	// Unregister drops the node's keys at once; an unknown node is no error.
	if _, err := tg.c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: b}); err != nil {
		t.Fatal(err)
	}
	wantFound(t, tg.lookup(t, ctx, k("z")), false)
	if _, err := tg.c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: tg.ids + "nobody"}); err != nil {
		t.Fatal(err)
	}
	wantHB(t, tg.heartbeat(t, ctx, b, bundle(4, add(k("z"), umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN, 0, false)
	wantFound(t, tg.lookup(t, ctx, k("z")), false)
}

func TestMasterHeartbeatSequence(t *testing.T) { testMasterHeartbeatSequence(t, newTarget(t)) }

func testMasterHeartbeatSequence(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	k := func(s string) string { return tg.ids + s }
	tg.register(t, ctx, n)
	alive := umbppb.ClientStatus_CLIENT_STATUS_ALIVE
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(1, add(k("a"), umbppb.TierType_TIER_DRAM))), alive, 1, false)
	// A gap asks for a full sync and applies nothing.
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(3, add(k("b"), umbppb.TierType_TIER_DRAM))), alive, 1, true)
	// So does a resend of an applied bundle.
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(1, add(k("c"), umbppb.TierType_TIER_DRAM))), alive, 1, true)
	wantFound(t, tg.lookup(t, ctx, k("a"), k("b"), k("c")), true, false, false)
	// Bundles apply in order up to the first gap.
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(2, add(k("d"), umbppb.TierType_TIER_DRAM)), bundle(4, add(k("e"), umbppb.TierType_TIER_DRAM)), bundle(3, add(k("f"), umbppb.TierType_TIER_DRAM))), alive, 2, true)
	wantFound(t, tg.lookup(t, ctx, k("d"), k("e"), k("f")), true, false, false)
	// A keepalive is no gap.
	wantHB(t, tg.heartbeat(t, ctx, n), alive, 2, false)

	// A full sync replaces the node's keys with its ADDs and takes the
	// baseline; its REMOVEs and bundle seqs are ignored.
	r, err := tg.c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: n, IsFullSync: true, DeltaSeqBaseline: 10,
		Bundles: []*umbppb.EventBundle{bundle(99, add(k("g"), umbppb.TierType_TIER_DRAM), remove(k("g"), umbppb.TierType_TIER_DRAM)), bundle(7, add(k("h"), umbppb.TierType_TIER_HBM))}})
	if err != nil {
		t.Fatal(err)
	}
	wantHB(t, r, alive, 10, false)
	wantFound(t, tg.lookup(t, ctx, k("a"), k("d"), k("g"), k("h")), false, false, true, true)
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(10, add(k("i"), umbppb.TierType_TIER_DRAM))), alive, 10, true)
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(11, add(k("i"), umbppb.TierType_TIER_DRAM))), alive, 11, false)
	wantFound(t, tg.lookup(t, ctx, k("i")), true)

	// An unknown node is answered UNKNOWN, without an error.
	wantHB(t, tg.heartbeat(t, ctx, tg.ids+"stranger", bundle(1)), umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN, 0, false)
	r, err = tg.c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: tg.ids + "stranger", IsFullSync: true, DeltaSeqBaseline: 5})
	if err != nil {
		t.Fatal(err)
	}
	wantHB(t, r, umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN, 0, false)
}

func TestMasterExpiry(t *testing.T) { testMasterExpiry(t, newTarget(t)) }

func testMasterExpiry(t *testing.T, tg *target) {
	ctx := ctxT(t, 60*time.Second)
	n, other := tg.ids+"n", tg.ids+"other"
	k := func(s string) string { return tg.ids + s }
	tg.register(t, ctx, n)
	tg.heartbeat(t, ctx, n, bundle(1, add(k("a"), umbppb.TierType_TIER_DRAM)))
	if _, err := tg.c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: n, Hashes: []string{k("h")}, Tier: umbppb.TierType_TIER_HBM}); err != nil {
		t.Fatal(err)
	}
	tg.expire(t, n, k("a"))
	wantFound(t, tg.lookup(t, ctx, k("a")), false)
	if got := tg.match(t, ctx, false, k("h")); len(got) != 0 {
		t.Fatalf("an expired node's external KV matched: %v", got)
	}
	// A report from an expired node is dropped without an error.
	if _, err := tg.c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: n, Hashes: []string{k("h")}, Tier: umbppb.TierType_TIER_HBM}); err != nil {
		t.Fatal(err)
	}
	if got := tg.match(t, ctx, false, k("h")); len(got) != 0 {
		t.Fatalf("an expired node's report was applied: %v", got)
	}
	// The next bundle brings it back alive, with an empty index and no
	// full-sync request.
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(2, add(k("b"), umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 2, false)
	wantFound(t, tg.lookup(t, ctx, k("a"), k("b")), false, true)

	// An expired node may register again (from seq 0).
	tg.register(t, ctx, other)
	tg.heartbeat(t, ctx, other, bundle(1, add(k("c"), umbppb.TierType_TIER_DRAM)))
	tg.expire(t, other, k("c"))
	tg.register(t, ctx, other)
	wantHB(t, tg.heartbeat(t, ctx, other, bundle(1, add(k("d"), umbppb.TierType_TIER_DRAM))), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	// A keepalive of an expired node also revives it without a full sync.
	tg.expire(t, other, k("d"))
	wantHB(t, tg.heartbeat(t, ctx, other), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	wantFound(t, tg.lookup(t, ctx, k("d")), false)
}

// match returns MatchExternalKv's answer keyed by node, tiers ascending
// (the master's node order is unspecified).
func (tg *target) match(t *testing.T, ctx context.Context, hit bool, hashes ...string) map[string]*umbppb.ExternalKvNodeMatch {
	t.Helper()
	r, err := tg.c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: hashes, CountAsHit: hit})
	if err != nil {
		t.Fatalf("MatchExternalKv: %v", err)
	}
	out := make(map[string]*umbppb.ExternalKvNodeMatch)
	for _, m := range r.GetMatches() {
		if _, dup := out[m.GetNodeId()]; dup {
			t.Fatalf("node %s matched twice", m.GetNodeId())
		}
		out[m.GetNodeId()] = m
	}
	return out
}

func tierHashes(tier umbppb.TierType, hs ...string) *umbppb.TierHashes {
	return &umbppb.TierHashes{Tier: tier, Hashes: hs}
}

func wantMatch(t *testing.T, got map[string]*umbppb.ExternalKvNodeMatch, want ...*umbppb.ExternalKvNodeMatch) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("matched %d nodes, want %d: %v", len(got), len(want), got)
	}
	for _, w := range want {
		if g := got[w.GetNodeId()]; !proto.Equal(g, w) {
			t.Fatalf("node %s matched %v, want %v", w.GetNodeId(), g, w)
		}
	}
}

func TestMasterExternalKv(t *testing.T) { testMasterExternalKv(t, newTarget(t)) }

func testMasterExternalKv(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	a, b := tg.ids+"a", tg.ids+"b"
	h := func(s string) string { return tg.ids + s }
	tg.register(t, ctx, a)
	tg.register(t, ctx, b)
	report := func(node string, tier umbppb.TierType, hs ...string) error {
		_, err := tg.c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: node, Hashes: hs, Tier: tier})
		return err
	}
	wantCode(t, report("", umbppb.TierType_TIER_HBM, h("1")), codes.InvalidArgument)
	wantCode(t, report(a, umbppb.TierType_TIER_HBM), codes.InvalidArgument)
	if err := report(h("unregistered"), umbppb.TierType_TIER_HBM, h("1")); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		report(a, umbppb.TierType_TIER_HBM, h("1"), h("2")),
		report(a, umbppb.TierType_TIER_DRAM, h("1")),
		report(a, umbppb.TierType_TIER_DRAM, h("1")), // again: nothing new
		report(b, umbppb.TierType_TIER_SSD, h("2"), h("3")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	hbm, dram, ssd := umbppb.TierType_TIER_HBM, umbppb.TierType_TIER_DRAM, umbppb.TierType_TIER_SSD
	// Each hash on its own (no prefix rule), request order, repeats kept.
	wantMatch(t, tg.match(t, ctx, false, h("1"), h("2"), h("9"), h("1")),
		&umbppb.ExternalKvNodeMatch{NodeId: a, PeerAddress: "peer-" + a, HashesByTier: []*umbppb.TierHashes{tierHashes(hbm, h("1"), h("2"), h("1")), tierHashes(dram, h("1"), h("1"))}},
		&umbppb.ExternalKvNodeMatch{NodeId: b, PeerAddress: "peer-" + b, HashesByTier: []*umbppb.TierHashes{tierHashes(ssd, h("2"))}})
	wantMatch(t, tg.match(t, ctx, false))
	wantMatch(t, tg.match(t, ctx, false, h("9")))

	// The two indexes are apart.
	wantFound(t, tg.lookup(t, ctx, h("1")), false)
	tg.heartbeat(t, ctx, a, bundle(1, add(h("k"), hbm)))
	wantMatch(t, tg.match(t, ctx, false, h("k")))

	hits := func(hs ...string) map[string]uint64 {
		t.Helper()
		r, err := tg.c.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: hs})
		if err != nil {
			t.Fatal(err)
		}
		out := make(map[string]uint64)
		var order []string
		for _, e := range r.GetEntries() {
			if _, dup := out[e.GetHash()]; dup {
				t.Fatalf("hit count of %s answered twice", e.GetHash())
			}
			out[e.GetHash()] = e.GetHitCountTotal()
			order = append(order, e.GetHash())
		}
		var wantOrder []string
		for _, x := range hs {
			if _, ok := out[x]; ok && !slices.Contains(wantOrder, x) {
				wantOrder = append(wantOrder, x)
			}
		}
		if !slices.Equal(order, wantOrder) {
			t.Fatalf("hit counts in order %v, want %v", order, wantOrder)
		}
		return out
	}
	if got := hits(h("1"), h("2"), h("3")); len(got) != 0 {
		t.Fatalf("hits before any count_as_hit: %v", got)
	}
	tg.match(t, ctx, true, h("1"), h("2"), h("1"), h("9"))
	tg.match(t, ctx, true, h("2"))
	if got := hits(h("2"), h("1"), h("2"), h("3"), h("9")); len(got) != 2 || got[h("1")] != 1 || got[h("2")] != 2 {
		t.Fatalf("hits %v, want %s:1 %s:2", got, h("1"), h("2"))
	}
	_, err := tg.c.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: make([]string, 4097)})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := tg.c.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: make([]string, 4096)}); err != nil {
		t.Fatal(err)
	}

	// Revocations.
	_, err = tg.c.RevokeExternalKvBlocks(ctx, &umbppb.RevokeExternalKvBlocksRequest{NodeId: a, Tier: hbm})
	wantCode(t, err, codes.InvalidArgument)
	_, err = tg.c.RevokeExternalKvBlocks(ctx, &umbppb.RevokeExternalKvBlocksRequest{Hashes: []string{h("1")}, Tier: hbm})
	wantCode(t, err, codes.InvalidArgument)
	_, err = tg.c.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.RevokeAllExternalKvBlocksAtTierRequest{Tier: hbm})
	wantCode(t, err, codes.InvalidArgument)
	_, err = tg.c.RevokeAllExternalKvBlocksForNode(ctx, &umbppb.RevokeAllExternalKvBlocksForNodeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	if _, err := tg.c.RevokeExternalKvBlocks(ctx, &umbppb.RevokeExternalKvBlocksRequest{NodeId: a, Hashes: []string{h("1"), h("9")}, Tier: hbm}); err != nil {
		t.Fatal(err)
	}
	wantMatch(t, tg.match(t, ctx, false, h("1"), h("2")),
		&umbppb.ExternalKvNodeMatch{NodeId: a, PeerAddress: "peer-" + a, HashesByTier: []*umbppb.TierHashes{tierHashes(hbm, h("2")), tierHashes(dram, h("1"))}},
		&umbppb.ExternalKvNodeMatch{NodeId: b, PeerAddress: "peer-" + b, HashesByTier: []*umbppb.TierHashes{tierHashes(ssd, h("2"))}})
	if _, err := tg.c.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.RevokeAllExternalKvBlocksAtTierRequest{NodeId: a, Tier: dram}); err != nil {
		t.Fatal(err)
	}
	wantMatch(t, tg.match(t, ctx, false, h("1"), h("2")),
		&umbppb.ExternalKvNodeMatch{NodeId: a, PeerAddress: "peer-" + a, HashesByTier: []*umbppb.TierHashes{tierHashes(hbm, h("2"))}},
		&umbppb.ExternalKvNodeMatch{NodeId: b, PeerAddress: "peer-" + b, HashesByTier: []*umbppb.TierHashes{tierHashes(ssd, h("2"))}})
	if _, err := tg.c.RevokeAllExternalKvBlocksForNode(ctx, &umbppb.RevokeAllExternalKvBlocksForNodeRequest{NodeId: b}); err != nil {
		t.Fatal(err)
	}
	wantMatch(t, tg.match(t, ctx, false, h("1"), h("2"), h("3")),
		&umbppb.ExternalKvNodeMatch{NodeId: a, PeerAddress: "peer-" + a, HashesByTier: []*umbppb.TierHashes{tierHashes(hbm, h("2"))}})
	// Unregistering drops the node's external KV; its hit counts stay.
	if _, err := tg.c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: a}); err != nil {
		t.Fatal(err)
	}
	wantMatch(t, tg.match(t, ctx, false, h("1"), h("2"), h("3")))
	if got := hits(h("1"), h("2")); got[h("2")] != 2 {
		t.Fatalf("hits after unregister %v", got)
	}
}

// The double's own: fault injection and its clock.

func doubleTarget(t *testing.T) *target {
	t.Helper()
	tg := newTarget(t)
	if tg.double == nil {
		t.Skip("fault injection needs the test double")
	}
	return tg
}

func TestMasterStaleReRegister(t *testing.T) {
	tg := doubleTarget(t)
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	tg.register(t, ctx, n)
	tg.heartbeat(t, ctx, n, bundle(1, add(n+"k", umbppb.TierType_TIER_DRAM)))
	tg.clock.Advance(3 * time.Second)
	_, err := tg.c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: n})
	wantCode(t, err, codes.AlreadyExists)
	// Stale (past TTL × missed) but not yet reaped: registering again is
	// allowed, the seq restarts, the keys stay.
	tg.clock.Advance(time.Millisecond)
	tg.register(t, ctx, n)
	wantFound(t, tg.lookup(t, ctx, n+"k"), true)
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(1)), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	if nd, ok := tg.double.Node(n); !ok || nd.Status != umbptest.MasterNodeAlive || nd.Keys != 1 || nd.AppliedSeq != 1 {
		t.Fatalf("Node(%s) = %+v, %v", n, nd, ok)
	}
	if got := tg.double.Reap(); len(got) != 0 {
		t.Fatalf("Reap expired %v right after a heartbeat", got)
	}
}

func TestMasterWaitExpired(t *testing.T) {
	tg := doubleTarget(t)
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	tg.register(t, ctx, n)
	done := make(chan error, 1)
	go func() { done <- tg.double.WaitExpired(ctx, n) }()
	tg.clock.Advance(4 * time.Second)
	// Whether the waiter blocks before this pass or starts after it, it
	// returns: woken by the expiry, or seeing the status.
	if got := tg.double.Reap(); !slices.Equal(got, []string{n}) {
		t.Fatalf("Reap expired %v, want [%s]", got, n)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if nd, _ := tg.double.Node(n); nd.Status != umbptest.MasterNodeExpired {
		t.Fatalf("status %v after WaitExpired", nd.Status)
	}
	tg.register(t, ctx, n+"2")
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := tg.double.WaitExpired(short, n+"2"); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitExpired of an alive node with a cancelled context: %v", err)
	}
}

func TestMasterBackgroundReaper(t *testing.T) {
	m := umbptest.NewMaster(t, umbptest.MasterOptions{HeartbeatTTL: time.Millisecond, MaxMissedHeartbeats: 1, ReaperInterval: time.Millisecond})
	c := masterClient(t, m.Addr())
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"}); err != nil {
		t.Fatal(err)
	}
	if err := m.WaitExpired(ctx, "n"); err != nil {
		t.Fatal(err)
	}
}

func TestMasterStallAndKill(t *testing.T) {
	tg := doubleTarget(t)
	m := tg.double
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	tg.register(t, ctx, n)
	tg.heartbeat(t, ctx, n, bundle(1, add(n+"k", umbppb.TierType_TIER_DRAM)))

	// A stalled method hangs until its deadline; others run.
	m.Stall("BatchLookup")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := tg.c.BatchLookup(short, &umbppb.BatchLookupRequest{Keys: []string{n + "k"}})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)
	tg.heartbeat(t, ctx, n)
	// A stalled call resumes with its answer.
	got := make(chan []bool, 1)
	go func() {
		r, err := tg.c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{n + "k"}})
		if err != nil {
			t.Error(err)
		}
		got <- r.GetFound()
	}()
	if err := m.WaitCalls(ctx, "BatchLookup", 2); err != nil { // the call is held
		t.Fatal(err)
	}
	m.Resume("BatchLookup")
	wantFound(t, <-got, true)

	// Stall of everything (a stopped process), released by Kill.
	m.Stall()
	errc := make(chan error, 1)
	go func() {
		_, err := tg.c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{n + "k"}})
		errc <- err
	}()
	if err := m.WaitCalls(ctx, "BatchLookup", 3); err != nil {
		t.Fatal(err)
	}
	m.Kill()
	wantCode(t, <-errc, codes.Unavailable)
	m.Resume()
	short, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = tg.c.BatchLookup(short, &umbppb.BatchLookupRequest{Keys: []string{n + "k"}})
	cancel()
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("BatchLookup of a killed master: %v", err)
	}

	// Restart: same address, empty state.
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	// The channel reconnects after its backoff: wait for it.
	r, err := tg.c.BatchLookup(ctx, &umbppb.BatchLookupRequest{Keys: []string{n + "k"}}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	wantFound(t, r.GetFound(), false)
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(2)), umbppb.ClientStatus_CLIENT_STATUS_UNKNOWN, 0, false)
	tg.register(t, ctx, n)

	m.FailNext("Heartbeat", 2)
	for range 2 {
		_, err := tg.c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: n})
		wantCode(t, err, codes.Unavailable)
	}
	wantHB(t, tg.heartbeat(t, ctx, n), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 0, false)
	m.FailNext("Heartbeat", 1)
	m.FailNext("Heartbeat", 0)
	wantHB(t, tg.heartbeat(t, ctx, n), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 0, false)

	// The routing calls are not the double's.
	_, err = tg.c.RouteGet(ctx, &umbppb.RouteGetRequest{Key: n + "k"})
	wantCode(t, err, codes.Unimplemented)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Restart(); err == nil {
		t.Fatal("Restart after Close succeeded")
	}
}

func TestMasterEmptyNodeIDAndLargeLookup(t *testing.T) {
	testMasterEmptyNodeIDAndLargeLookup(t, newTarget(t))
}

func testMasterEmptyNodeIDAndLargeLookup(t *testing.T, tg *target) {
	ctx := ctxT(t, 30*time.Second)
	// MORI does not check the node id of RegisterClient.
	if _, err := tg.c.RegisterClient(ctx, &umbppb.RegisterClientRequest{}); err != nil {
		t.Fatalf("RegisterClient with an empty node id: %v", err)
	}
	t.Cleanup(func() { _, _ = tg.c.UnregisterClient(context.Background(), &umbppb.UnregisterClientRequest{}) })
	n := tg.ids + "n"
	tg.register(t, ctx, n)
	// BatchLookup has no limit of its own: 100,000 keys in one call.
	keys := make([]string, 100_000)
	var evs []*umbppb.KvEvent
	for i := range keys {
		keys[i] = fmt.Sprintf("%sk%d", tg.ids, i)
		if i%3 == 0 {
			evs = append(evs, add(keys[i], umbppb.TierType(i%4)))
		}
	}
	wantHB(t, tg.heartbeat(t, ctx, n, bundle(1, evs...)), umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	found := tg.lookup(t, ctx, keys...)
	for i, f := range found {
		if f != (i%3 == 0) {
			t.Fatalf("found[%d] = %v", i, f)
		}
	}
}

func TestMasterUnknownEventKindIsAdd(t *testing.T) { testMasterUnknownEventKindIsAdd(t, newTarget(t)) }

func testMasterUnknownEventKindIsAdd(t *testing.T, tg *target) {
	ctx := ctxT(t, 10*time.Second)
	n := tg.ids + "n"
	k := func(s string) string { return tg.ids + s }
	tg.register(t, ctx, n)
	odd := func(key string) *umbppb.KvEvent {
		return &umbppb.KvEvent{Kind: umbppb.KvEvent_Kind(7), Key: key, Tier: umbppb.TierType_TIER_DRAM}
	}
	tg.heartbeat(t, ctx, n, bundle(1, odd(k("a"))))
	wantFound(t, tg.lookup(t, ctx, k("a")), true)
	r, err := tg.c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: n, IsFullSync: true, DeltaSeqBaseline: 1, Bundles: []*umbppb.EventBundle{bundle(0, odd(k("b")))}})
	if err != nil {
		t.Fatal(err)
	}
	wantHB(t, r, umbppb.ClientStatus_CLIENT_STATUS_ALIVE, 1, false)
	wantFound(t, tg.lookup(t, ctx, k("a"), k("b")), false, true)
}
