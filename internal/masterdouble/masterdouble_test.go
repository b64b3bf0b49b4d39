package masterdouble

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func caps(avail uint64) []*umbppb.TierCapacity {
	return []*umbppb.TierCapacity{{Tier: umbppb.TierType_TIER_DRAM, TotalCapacityBytes: 100, AvailableCapacityBytes: avail}}
}

// Capacities are taken with an applied bundle or a full sync, never with
// a keepalive or a bundle refused for its seq.
func TestCapacitiesOnlyWhenApplied(t *testing.T) {
	s := New(Options{})
	ctx := context.Background()
	if _, err := s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n", TierCapacities: caps(90)}); err != nil {
		t.Fatal(err)
	}
	avail := func() uint64 {
		n, _ := s.Node("n")
		return n.Capacities[umbppb.TierType_TIER_DRAM].Available
	}
	hb := func(req *umbppb.HeartbeatRequest) {
		req.NodeId = "n"
		if _, err := s.Heartbeat(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	hb(&umbppb.HeartbeatRequest{TierCapacities: caps(80)})
	hb(&umbppb.HeartbeatRequest{TierCapacities: caps(70), Bundles: []*umbppb.EventBundle{{Seq: 5}}})
	if got := avail(); got != 90 {
		t.Fatalf("available %d after a keepalive and a gap, want 90", got)
	}
	hb(&umbppb.HeartbeatRequest{TierCapacities: caps(60), Bundles: []*umbppb.EventBundle{{Seq: 1}}})
	if got := avail(); got != 60 {
		t.Fatalf("available %d after an applied bundle, want 60", got)
	}
	hb(&umbppb.HeartbeatRequest{TierCapacities: caps(50), IsFullSync: true})
	if got := avail(); got != 50 {
		t.Fatalf("available %d after a full sync, want 50", got)
	}
}

// A second ADD of a key a node holds on that tier keeps the first size; a
// full sync takes the last.
func TestDuplicateAdd(t *testing.T) {
	s := New(Options{})
	ctx := context.Background()
	_, _ = s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"})
	ev := func(size uint64) *umbppb.KvEvent {
		return &umbppb.KvEvent{Key: "k", Tier: umbppb.TierType_TIER_HBM, Size: size}
	}
	_, _ = s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n", Bundles: []*umbppb.EventBundle{{Seq: 1, Events: []*umbppb.KvEvent{ev(1), ev(2)}}}})
	if l := s.blocks["k"]; len(l) != 1 || l[0].size != 1 {
		t.Fatalf("locations %+v, want one of size 1", l)
	}
	_, _ = s.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n", IsFullSync: true, Bundles: []*umbppb.EventBundle{{Events: []*umbppb.KvEvent{ev(3), ev(4)}}}})
	if l := s.blocks["k"]; len(l) != 1 || l[0].size != 4 {
		t.Fatalf("locations %+v after a full sync, want one of size 4", l)
	}
	if n, _ := s.Node("n"); n.Keys != 1 {
		t.Fatalf("node holds %d keys, want 1", n.Keys)
	}
}

// Reap drops hit counts older than HitIndexTTL and keeps younger ones.
func TestReapDropsOldHits(t *testing.T) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	s := New(Options{HitIndexTTL: time.Minute, HeartbeatTTL: time.Hour, Now: c.Now})
	ctx := context.Background()
	_, _ = s.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: "n"})
	_, _ = s.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: "n", Hashes: []string{"old", "young"}, Tier: umbppb.TierType_TIER_DRAM})
	_, _ = s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"old"}, CountAsHit: true})
	c.Add(50 * time.Second)
	_, _ = s.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"young"}, CountAsHit: true})
	c.Add(11 * time.Second)
	if dead := s.Reap(); len(dead) != 0 {
		t.Fatalf("Reap expired %v", dead)
	}
	r, err := s.GetExternalKvHitCounts(ctx, &umbppb.GetExternalKvHitCountsRequest{Hashes: []string{"old", "young"}})
	if err != nil {
		t.Fatal(err)
	}
	if e := r.GetEntries(); len(e) != 1 || e[0].GetHash() != "young" || e[0].GetHitCountTotal() != 1 {
		t.Fatalf("hit counts %v, want young:1 only", e)
	}
}
