package umbptest_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// clockedMaster is a lone master on a clock of the test's: a 1 s TTL, 3
// missed heartbeats, no reaper of its own.
func clockedMaster(t *testing.T) (*umbptest.Master, *manualClock) {
	t.Helper()
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	m := umbptest.NewMaster(t, umbptest.MasterOptions{HeartbeatTTL: time.Second, MaxMissedHeartbeats: 3, ReaperInterval: -1, Now: clk.Now})
	return m, clk
}

// A node holds its keys in the heartbeat index and its blocks in the
// external KV index, and changes them through the master's wire.
func TestNodeHolds(t *testing.T) {
	m, _ := clockedMaster(t)
	c := masterClient(t, m.Addr())
	ctx := ctxT(t, 10*time.Second)
	hbm, dram, ssd := umbptest.TierHBM, umbptest.TierDRAM, umbptest.TierSSD
	n := umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{
		ID: "a", PeerAddress: "a.local:7000", HeartbeatInterval: time.Hour,
		Keys:       map[umbptest.Tier][]string{hbm: {"k1", "k2"}, ssd: {"k2", "k3"}},
		External:   map[umbptest.Tier][]string{dram: {"h1", "h2"}, hbm: {"h2"}},
		Capacities: map[umbptest.Tier]umbptest.TierCapacity{dram: {Total: 100, Available: 60}},
	})
	if n.ID() != "a" || n.Master() != m.Addr() {
		t.Fatalf("ID %q, Master %q", n.ID(), n.Master())
	}
	wantFound(t, lookupVia(t, ctx, c, "k1", "k2", "k3", "k4"), true, true, true, false)
	nd, ok := m.Node("a")
	if !ok || nd.Status != umbptest.MasterNodeAlive || nd.Keys != 3 || nd.PeerAddress != "a.local:7000" ||
		nd.Capacities[dram] != (umbptest.TierCapacity{Total: 100, Available: 60}) || nd.Status.String() != "alive" {
		t.Fatalf("Node(a) = %+v, %v", nd, ok)
	}
	r, err := c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h1", "h2", "h3"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetMatches()) != 1 {
		t.Fatalf("matches %v", r.GetMatches())
	}
	got := r.GetMatches()[0]
	if got.GetNodeId() != "a" || got.GetPeerAddress() != "a.local:7000" || len(got.GetHashesByTier()) != 2 ||
		!slices.Equal(got.GetHashesByTier()[0].GetHashes(), []string{"h2"}) ||
		!slices.Equal(got.GetHashesByTier()[1].GetHashes(), []string{"h1", "h2"}) {
		t.Fatalf("match %v", got)
	}

	if err := n.Add(ctx, dram, "k4"); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(ctx, hbm, "k1", "k2"); err != nil {
		t.Fatal(err)
	}
	wantFound(t, lookupVia(t, ctx, c, "k1", "k2", "k3", "k4"), false, true, true, true) // k2 stays on SSD
	if err := n.Revoke(ctx, dram, "h1"); err != nil {
		t.Fatal(err)
	}
	if err := n.Report(ctx, ssd, "h3"); err != nil {
		t.Fatal(err)
	}
	r, _ = c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h1", "h3"}})
	if len(r.GetMatches()) != 1 || len(r.GetMatches()[0].GetHashesByTier()) != 1 || r.GetMatches()[0].GetHashesByTier()[0].GetTier() != umbppb.TierType_TIER_SSD {
		t.Fatalf("matches after revoke and report: %v", r.GetMatches())
	}
	// Nothing to send is no call.
	before := m.Calls("Heartbeat") + m.Calls("ReportExternalKvBlocks")
	for _, err := range []error{n.Add(ctx, hbm), n.Remove(ctx, hbm), n.Report(ctx, hbm), n.Revoke(ctx, hbm)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if after := m.Calls("Heartbeat") + m.Calls("ReportExternalKvBlocks"); after != before {
		t.Fatalf("%d calls for nothing", after-before)
	}

	// Close unregisters: its keys and blocks are gone at once.
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	wantFound(t, lookupVia(t, ctx, c, "k2", "k3", "k4"), false, false, false)
	if _, ok := m.Node("a"); ok {
		t.Fatal("a closed node is still registered")
	}
	for _, err := range []error{n.Add(ctx, hbm, "k"), n.Heartbeat(ctx), n.Report(ctx, hbm, "h")} {
		if err == nil || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("a call after Close: %v", err)
		}
	}
}

func TestNodeOptions(t *testing.T) {
	m, _ := clockedMaster(t)
	ctx := ctxT(t, 10*time.Second)
	for _, o := range []umbptest.NodeOptions{
		{},
		{ID: "x", Keys: map[umbptest.Tier][]string{0: {"k"}}},
		{ID: "x", External: map[umbptest.Tier][]string{4: {"h"}}},
		{ID: "x", Capacities: map[umbptest.Tier]umbptest.TierCapacity{7: {}}},
	} {
		if n, err := umbptest.StartNode(ctx, m.Addr(), o); err == nil {
			_ = n.Close()
			t.Fatalf("StartNode(%+v) started", o)
		}
	}
	if _, err := umbptest.StartNode(ctx, "", umbptest.NodeOptions{ID: "x"}); err == nil {
		t.Fatal("a node without a master started")
	}
	if m.Calls("RegisterClient") != 0 {
		t.Fatal("bad options reached the master")
	}
	n := umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "x"})
	if err := n.Add(ctx, 0, "k"); err == nil {
		t.Fatal("Add on tier 0 succeeded")
	}
	if err := n.Report(ctx, 9, "h"); err == nil {
		t.Fatal("Report on tier 9 succeeded")
	}
	// One id alive once.
	_, err := umbptest.StartNode(ctx, m.Addr(), umbptest.NodeOptions{ID: "x"})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("a second node x: %v", err)
	}
	if _, ok := m.Node("x"); !ok {
		t.Fatal("a refused duplicate unregistered the first node")
	}
	for tier, want := range map[umbptest.Tier]string{umbptest.TierHBM: "HBM", umbptest.TierDRAM: "DRAM", umbptest.TierSSD: "SSD", 5: "Tier(5)"} {
		if got := tier.String(); got != want {
			t.Errorf("Tier(%d).String() = %q, want %q", int(tier), got, want)
		}
	}
}

// A node heartbeats on its own, so it does not expire; once silent, it
// does, and comes back with an empty index (MORI's behaviour).
func TestNodeHeartbeats(t *testing.T) {
	m, clk := clockedMaster(t)
	c := masterClient(t, m.Addr())
	ctx := ctxT(t, 10*time.Second)
	n := umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "n", HeartbeatInterval: time.Millisecond, Keys: map[umbptest.Tier][]string{umbptest.TierDRAM: {"k"}}})
	clk.Advance(3*time.Second + time.Millisecond) // past expiry since registration
	// Heartbeats are one at a time: once the second after the advance
	// arrives, the first has been applied.
	if err := m.WaitCalls(ctx, "Heartbeat", m.Calls("Heartbeat")+2); err != nil {
		t.Fatal(err)
	}
	if got := m.Reap(); len(got) != 0 {
		t.Fatalf("Reap expired a heartbeating node: %v", got)
	}
	wantFound(t, lookupVia(t, ctx, c, "k"), true)

	n.StopHeartbeats() // none of its own after it returns
	silent := m.Calls("Heartbeat")
	clk.Advance(3*time.Second + time.Millisecond)
	if got := m.Reap(); !slices.Equal(got, []string{"n"}) {
		t.Fatalf("Reap expired %v, want [n]", got)
	}
	wantFound(t, lookupVia(t, ctx, c, "k"), false)
	if got := m.Calls("Heartbeat"); got != silent {
		t.Fatalf("a silent node sent %d heartbeats", got-silent)
	}
	// Back alive, not asked to resync: its key stays missing.
	n.StartHeartbeats()
	if err := m.WaitCalls(ctx, "Heartbeat", silent+1); err != nil {
		t.Fatal(err)
	}
	if err := n.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if nd, _ := m.Node("n"); nd.Status != umbptest.MasterNodeAlive || nd.Keys != 0 {
		t.Fatalf("after expiry and a heartbeat: %+v", nd)
	}
	wantFound(t, lookupVia(t, ctx, c, "k"), false)
	if err := n.Add(ctx, umbptest.TierDRAM, "k2"); err != nil {
		t.Fatal(err)
	}
	wantFound(t, lookupVia(t, ctx, c, "k", "k2"), false, true)
}

// A master restarted empty answers UNKNOWN: the node registers again and
// sends its keys; its external KV is gone.
func TestNodeMasterRestarted(t *testing.T) {
	m, _ := clockedMaster(t)
	ctx := ctxT(t, 10*time.Second)
	n := umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "n", HeartbeatInterval: time.Hour,
		Keys:     map[umbptest.Tier][]string{umbptest.TierHBM: {"k"}},
		External: map[umbptest.Tier][]string{umbptest.TierHBM: {"h"}},
	})
	if err := n.Add(ctx, umbptest.TierSSD, "k2"); err != nil {
		t.Fatal(err)
	}
	m.Kill()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := n.Heartbeat(short)
	cancel()
	if err == nil {
		t.Fatal("a heartbeat to a killed master succeeded")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := n.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	c := masterClient(t, m.Addr())
	wantFound(t, lookupVia(t, ctx, c, "k", "k2"), true, true)
	r, err := c.MatchExternalKv(ctx, &umbppb.MatchExternalKvRequest{Hashes: []string{"h"}})
	if err != nil || len(r.GetMatches()) != 0 {
		t.Fatalf("external KV after a restart: %v, %v", r, err)
	}
	if nd, _ := m.Node("n"); nd.PeerAddress != "n" {
		t.Fatalf("registered again with peer address %q, want the id", nd.PeerAddress)
	}
}

// A heartbeat bundle the master cannot apply (a gap, or a resend of one
// applied) gets a full sync: the master then holds exactly what the node
// holds.
func TestNodeFullSync(t *testing.T) {
	m, _ := clockedMaster(t)
	c := masterClient(t, m.Addr())
	ctx := ctxT(t, 10*time.Second)
	n := umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "n", HeartbeatInterval: time.Hour})
	if err := n.Add(ctx, umbptest.TierHBM, "a", "b"); err != nil { // seq 1
		t.Fatal(err)
	}
	// Someone else moves the node's seq on: its next bundle is a resend.
	if _, err := c.Heartbeat(ctx, &umbppb.HeartbeatRequest{NodeId: "n", Bundles: []*umbppb.EventBundle{{Seq: 2, Events: []*umbppb.KvEvent{{Key: "stray", Tier: umbppb.TierType_TIER_HBM}}}}}); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(ctx, umbptest.TierHBM, "a"); err != nil { // seq 2 again
		t.Fatal(err)
	}
	wantFound(t, lookupVia(t, ctx, c, "a", "b", "stray"), false, true, false)
	if nd, _ := m.Node("n"); nd.AppliedSeq != 2 || nd.Keys != 1 {
		t.Fatalf("after the full sync: %+v", nd)
	}
	// The next bundle is seq 3.
	if err := n.Add(ctx, umbptest.TierDRAM, "c"); err != nil {
		t.Fatal(err)
	}
	if nd, _ := m.Node("n"); nd.AppliedSeq != 3 || nd.Keys != 2 {
		t.Fatalf("after the next bundle: %+v", nd)
	}
}

// A node knows one replica: while it is killed its heartbeats fail (the
// others still answer for it until it expires); once it is back the node
// goes on where it was, with what it changed meanwhile.
func TestNodeReplicaKilled(t *testing.T) {
	r := umbptest.NewReplicatedMaster(t, 2, umbptest.MasterOptions{ReaperInterval: -1})
	cs := replicaClients(t, r)
	ctx := ctxT(t, 10*time.Second)
	n := umbptest.NewNode(t, r.Replica(0).Addr(), umbptest.NodeOptions{ID: "n", HeartbeatInterval: time.Hour, Keys: map[umbptest.Tier][]string{umbptest.TierHBM: {"k"}}})
	r.Replica(0).Kill()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := n.Add(short, umbptest.TierHBM, "k2")
	cancel()
	if err == nil {
		t.Fatal("Add through a killed replica succeeded")
	}
	wantFound(t, lookupVia(t, ctx, cs[1], "k", "k2"), true, false)
	if err := r.Replica(0).Restart(); err != nil {
		t.Fatal(err)
	}
	if err := n.Heartbeat(ctx); err != nil { // the bundle not acknowledged goes now
		t.Fatal(err)
	}
	wantFound(t, lookupVia(t, ctx, cs[1], "k", "k2"), true, true)
	if nd, _ := r.Node("n"); nd.AppliedSeq != 1 {
		t.Fatalf("applied seq %d, want 1 (no registration again)", nd.AppliedSeq)
	}
}

// Close does not hang on a master that does not answer.
func TestNodeCloseStalledMaster(t *testing.T) {
	m, _ := clockedMaster(t)
	n, err := umbptest.StartNode(ctxT(t, 10*time.Second), m.Addr(), umbptest.NodeOptions{ID: "n", HeartbeatInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Suspend()
	defer m.Resume()
	if err := n.Close(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Close with the master suspended: %v", err)
	}
}
