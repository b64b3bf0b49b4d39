package umbptest_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// A router's view of a pool, without MORI: a test master, nodes placed in
// it over the master's own wire (as MORI's nodes are), and a scheduler
// handle on the master. The nodes heartbeat until they are closed, so
// they never expire under the test.
func ExampleNode() {
	m, err := umbptest.StartMaster(umbptest.MasterOptions{})
	if err != nil {
		panic(err)
	}
	defer m.Close()
	ctx := context.Background()
	a, err := umbptest.StartNode(ctx, m.Addr(), umbptest.NodeOptions{
		ID:          "node-a",
		PeerAddress: "node-a:7000",
		Keys:        map[umbptest.Tier][]string{umbptest.TierDRAM: {"k1", "k2"}},      // BatchLookup
		External:    map[umbptest.Tier][]string{umbptest.TierHBM: {"b1", "b2", "b3"}}, // MatchExternalKv
	})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	b, err := umbptest.StartNode(ctx, m.Addr(), umbptest.NodeOptions{
		ID:       "node-b",
		External: map[umbptest.Tier][]string{umbptest.TierSSD: {"b1", "b2", "b3"}},
	})
	if err != nil {
		panic(err)
	}
	defer b.Close()

	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{m.Addr()}, LookupTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	defer h.Close()
	fmt.Println("lookup:", h.Lookup(ctx, []string{"k1", "k2", "k3"}))
	s, err := h.Score(ctx, umbp.ScoreRequest{BlockHashes: []string{"b1", "b2", "b3"}, Weights: umbp.TierWeights{HBM: 1, DRAM: 0.8, SSD: 0.5}})
	if err != nil {
		panic(err)
	}
	best := s.Nodes[s.Best]
	fmt.Println("best:", best.Node, "at", best.PeerAddress, "holds", best.Prefix, "blocks")

	if err := a.Add(ctx, umbptest.TierSSD, "k3"); err != nil {
		panic(err)
	}
	fmt.Println("lookup:", h.Lookup(ctx, []string{"k1", "k2", "k3"}))
	if err := a.Close(); err != nil { // node-a leaves the pool
		panic(err)
	}
	fmt.Println("lookup:", h.Lookup(ctx, []string{"k1", "k2", "k3"}))
	s, _ = h.Score(ctx, umbp.ScoreRequest{BlockHashes: []string{"b1", "b2", "b3"}, Weights: umbp.TierWeights{HBM: 1, DRAM: 0.8, SSD: 0.5}})
	fmt.Println("best:", s.Nodes[s.Best].Node)
	// Output:
	// lookup: [true true false]
	// best: node-a at node-a:7000 holds 3 blocks
	// lookup: [true true true]
	// lookup: [false false false]
	// best: node-b
}

// MORI's master over Redis: replicas that serve one state. A node placed
// through one replica is found through any other, also while its own
// replica is down; an outage of the store is answered by every replica.
func ExampleReplicatedMaster() {
	r, err := umbptest.StartReplicatedMaster(3, umbptest.MasterOptions{StoreTimeout: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	ctx := context.Background()
	n, err := umbptest.StartNode(ctx, r.Replica(0).Addr(), umbptest.NodeOptions{
		ID:   "node-a",
		Keys: map[umbptest.Tier][]string{umbptest.TierHBM: {"k1"}},
	})
	if err != nil {
		panic(err)
	}
	defer n.Close()

	// A handle on each of replicas 1 and 2.
	var hs []*umbp.SchedulerHandle
	for _, replica := range []int{1, 2} {
		rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{r.Replica(replica).Addr()}, LookupTimeout: time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			panic(err)
		}
		h, err := rt.NewSchedulerHandle(ctx)
		if err != nil {
			panic(err)
		}
		defer h.Close()
		hs = append(hs, h)
	}
	keys := []string{"k1", "k2"}
	fmt.Println("through replicas 1, 2:", hs[0].Lookup(ctx, keys), hs[1].Lookup(ctx, keys))
	r.Replica(0).Kill() // node-a's replica
	fmt.Println("replica 0 killed:", hs[0].Lookup(ctx, keys), hs[1].Lookup(ctx, keys))
	fmt.Println("calls of BatchLookup: replica 1:", r.Replica(1).Calls("BatchLookup"), "all:", r.Calls("BatchLookup"))
	r.FailStore(umbptest.StoreDown) // every replica answers "metadata store unavailable": misses
	fmt.Println("store down:", hs[0].Lookup(ctx, keys), hs[1].Lookup(ctx, keys))
	r.RestoreStore()
	// A handle that heard the store is down answers misses at once until
	// its check of the store is answered: within a few tens of milliseconds.
	deadline := time.Now().Add(5 * time.Second)
	for !(hs[0].Lookup(ctx, keys)[0] && hs[1].Lookup(ctx, keys)[0]) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("store back:", hs[0].Lookup(ctx, keys), hs[1].Lookup(ctx, keys))
	// Output:
	// through replicas 1, 2: [true false] [true false]
	// replica 0 killed: [true false] [true false]
	// calls of BatchLookup: replica 1: 3 all: 6
	// store down: [false false] [false false]
	// store back: [true false] [true false]
}
