// Command router routes prompts across the nodes of a distributed UMBP pool:
// for each prompt it asks MORI's UMBP master, in one bounded call, how many
// of the prompt's leading KV blocks each node holds and on which tier, and
// sends the prompt to the node that holds the most (weighing HBM above DRAM
// above SSD); a prompt no node holds goes round-robin. It prints every
// decision.
//
// With no -master it starts the test master in-process; either way it first
// places three demo nodes in the master, each holding a different prefix of
// the demo prompts, as a node's standalone server in distributed mode would
// report them (here with umbptest.Node, which speaks the master's own API as
// MORI's nodes do, since such a server needs RDMA). The nodes heartbeat until
// the program ends, so the master never expires them, and leave it then:
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
	tier   umbptest.Tier
	blocks []int // per prompt
}

var demoNodes = []demoNode{
	{"node-a", umbptest.TierHBM, []int{16, 4, 0, 0}},
	{"node-b", umbptest.TierDRAM, []int{8, 12, 0, 0}},
	{"node-c", umbptest.TierSSD, []int{0, 16, 10, 0}},
}

func run(master string, out io.Writer, log *slog.Logger) error {
	ctx := context.Background()
	if master == "" {
		m, err := umbptest.StartMaster(umbptest.MasterOptions{})
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
	nodes, err := startDemoNodes(ctx, master, keyer, prompts)
	if err != nil {
		return err
	}
	defer func() {
		for _, n := range nodes {
			_ = n.Close() // leaves the pool
		}
	}()

	// The router: one scheduler handle on the master. Every call is
	// bounded by LookupTimeout; a stalled master answers "nothing held".
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{master}, LookupTimeout: 500 * time.Millisecond, Logger: log})
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

// startDemoNodes places the demo nodes in the master, each reporting its
// blocks as its server would.
func startDemoNodes(ctx context.Context, master string, keyer *umbp.TokenKeyer, prompts [][]int32) (nodes []*umbptest.Node, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	defer func() {
		if err != nil {
			for _, n := range nodes {
				_ = n.Close()
			}
		}
	}()
	for _, d := range demoNodes {
		var hashes []string
		for p, blocks := range d.blocks {
			keys, err := keyer.Keys(prompts[p], vllmhash.ExtraKeys{})
			if err != nil {
				return nodes, err
			}
			hashes = append(hashes, keys.Keys[:blocks]...)
		}
		n, err := umbptest.StartNode(ctx, master, umbptest.NodeOptions{
			ID:          d.id,
			PeerAddress: d.id + ".local:7000",
			External:    map[umbptest.Tier][]string{d.tier: hashes},
		})
		if err != nil {
			return nodes, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}
