// Command router routes prompts across the nodes of a distributed UMBP pool:
// for each prompt it asks MORI's UMBP master, in one bounded call, how many
// of the prompt's leading KV blocks each node holds and on which tier, and
// sends the prompt to the node that holds the most (weighing HBM above DRAM
// above SSD); a prompt no node holds goes round-robin. It prints every
// decision.
//
// With no -master it starts the test master in-process; either way it first
// registers three demo nodes, each holding a different prefix of the demo
// prompts, as a node's standalone server in distributed mode would report
// them (here through the master's own API, since such a server needs RDMA):
//
//	go run ./examples/router
//	go run ./examples/router -master 127.0.0.1:50551   # MORI's umbp_master on loopback
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/umbp-go/umbp-go/proto/umbppb"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

func main() {
	master := flag.String("master", "", "MORI's UMBP master, host:port; empty starts the test master in-process")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(*master, os.Stdout, log); err != nil {
		fmt.Fprintln(os.Stderr, "router:", err)
		os.Exit(1)
	}
}

// The demo: prompts of 256 tokens in blocks of 16 (16 blocks each).
const (
	promptTokens = 256
	blockSize    = 16
)

// demoNode is what one node holds: for each prompt, how many leading
// blocks, and on which tier.
type demoNode struct {
	id     string
	tier   umbppb.TierType
	blocks []int // per prompt
}

var demoNodes = []demoNode{
	{"node-a", umbppb.TierType_TIER_HBM, []int{16, 4, 0, 0}},
	{"node-b", umbppb.TierType_TIER_DRAM, []int{8, 12, 0, 0}},
	{"node-c", umbppb.TierType_TIER_SSD, []int{0, 16, 10, 0}},
}

func run(master string, out io.Writer, log *slog.Logger) error {
	ctx := context.Background()
	if master == "" {
		m, err := umbptest.StartMaster(umbptest.MasterOptions{ReaperInterval: -1})
		if err != nil {
			return err
		}
		defer m.Close()
		master = m.Addr()
	}
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		return err
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "router-demo",
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: blockSize}},
		Hasher:    hasher,
	})
	if err != nil {
		return err
	}
	prompts := make([][]int32, len(demoNodes[0].blocks))
	for p := range prompts {
		prompts[p] = make([]int32, promptTokens)
		for i := range prompts[p] {
			prompts[p][i] = int32(1000*p + i)
		}
	}
	if err := registerDemoNodes(ctx, master, keyer, prompts); err != nil {
		return err
	}
	defer unregisterDemoNodes(master)

	// The router: one scheduler handle on the master. Every call is
	// bounded by LookupTimeout; a stalled master answers "nothing held".
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Master: master, LookupTimeout: 500 * time.Millisecond, Logger: log})
	if err != nil {
		return err
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		return err
	}
	defer h.Close()
	candidates := make([]string, len(demoNodes))
	for i, n := range demoNodes {
		candidates[i] = n.id
	}
	weights := umbp.TierWeights{HBM: 1, DRAM: 0.8, SSD: 0.5}
	next := 0 // round robin for prompts nobody holds
	for p, prompt := range prompts {
		keys, err := keyer.Keys(prompt, vllmhash.ExtraKeys{})
		if err != nil {
			return err
		}
		s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: candidates, Prompt: keys, Weights: weights})
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "prompt %d (%d tokens):", p, len(prompt))
		for _, n := range s.Nodes {
			fmt.Fprintf(out, " %s %d tokens (hbm %d dram %d ssd %d blocks) score %.1f;", n.Node, n.Tokens, n.HBM, n.DRAM, n.SSD, n.Score)
		}
		fmt.Fprintln(out)
		switch {
		case !s.Complete:
			fmt.Fprintf(out, "  -> %s (round robin: the master did not answer in time)\n", candidates[next%len(candidates)])
			next++
		case s.Best < 0:
			fmt.Fprintf(out, "  -> %s (round robin: no node holds its first block)\n", candidates[next%len(candidates)])
			next++
		default:
			b := s.Nodes[s.Best]
			fmt.Fprintf(out, "  -> %s at %s: reuses %d of %d tokens\n", b.Node, b.PeerAddress, b.Tokens, len(prompt))
		}
	}
	return nil
}

// registerDemoNodes joins the demo nodes to the master and reports their
// blocks, as their servers would.
func registerDemoNodes(ctx context.Context, master string, keyer *umbp.TokenKeyer, prompts [][]int32) error {
	cc, err := grpc.NewClient("passthrough:///"+master, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	c := umbppb.NewUMBPMasterClient(cc)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, n := range demoNodes {
		if _, err := c.RegisterClient(ctx, &umbppb.RegisterClientRequest{NodeId: n.id, PeerAddress: n.id + ".local:7000"}, grpc.WaitForReady(true)); err != nil {
			return fmt.Errorf("register %s: %w", n.id, err)
		}
		var hashes []string
		for p, blocks := range n.blocks {
			keys, err := keyer.Keys(prompts[p], vllmhash.ExtraKeys{})
			if err != nil {
				return err
			}
			hashes = append(hashes, keys.Keys[:blocks]...)
		}
		if _, err := c.ReportExternalKvBlocks(ctx, &umbppb.ReportExternalKvBlocksRequest{NodeId: n.id, Hashes: hashes, Tier: n.tier}); err != nil {
			return fmt.Errorf("report %s: %w", n.id, err)
		}
	}
	return nil
}

func unregisterDemoNodes(master string) {
	cc, err := grpc.NewClient("passthrough:///"+master, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer cc.Close()
	c := umbppb.NewUMBPMasterClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range demoNodes {
		_, _ = c.UnregisterClient(ctx, &umbppb.UnregisterClientRequest{NodeId: n.id})
	}
}
