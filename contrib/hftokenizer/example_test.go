package hftokenizer_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/umbp-go/umbp-go/contrib/hftokenizer"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// A router's path from an OpenAI-style request to a node: the body becomes
// the tokens the engines compute for it, the tokens the pool's keys, and
// the master says which node holds the most of them.
func Example() {
	// The engines' tokenizer: the same tokenizer.json and
	// tokenizer_config.json they load.
	tok, err := hftokenizer.LoadDir("testdata/qwen3")
	if err != nil {
		panic(err)
	}
	// How the engines key their KV blocks (their UMBP connector's
	// namespace, block size, hash algorithm and PYTHONHASHSEED).
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		panic(err)
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "demo",
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}},
		Hasher:    hasher,
	})
	if err != nil {
		panic(err)
	}

	// A pool with two nodes: node-b served the first turn of a
	// conversation and holds its blocks; node-a holds nothing.
	master, err := umbptest.StartMaster(umbptest.MasterOptions{})
	if err != nil {
		panic(err)
	}
	defer master.Close()
	system := `{"role": "system", "content": "You are a travel agent. Answer in one short paragraph, with prices in euros and times in 24-hour form."}`
	first := []byte(`{"model": "qwen3", "messages": [` + system + `,
		{"role": "user", "content": "Which trains go from Paris to Lyon on Sunday morning?"}]}`)
	served, err := tok.RequestKeys(keyer, first, nil)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for id, keys := range map[string][]string{"node-a": nil, "node-b": served[0].Keys} {
		n, err := umbptest.StartNode(ctx, master.Addr(), umbptest.NodeOptions{
			ID: id, PeerAddress: id + ":8000",
			External: map[umbptest.Tier][]string{umbptest.TierHBM: keys},
		})
		if err != nil {
			panic(err)
		}
		defer n.Close()
	}

	// The router: the conversation's second turn goes where its prefix is.
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{
		Masters: []string{master.Addr()}, LookupTimeout: 2 * time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		panic(err)
	}
	defer h.Close()
	second := []byte(`{"model": "qwen3", "messages": [` + system + `,
		{"role": "user", "content": "Which trains go from Paris to Lyon on Sunday morning?"},
		{"role": "assistant", "content": "The 07:00 and 09:00 TGVs, from 29 euros."},
		{"role": "user", "content": "And back on Monday evening?"}]}`)
	keys, err := tok.RequestKeys(keyer, second, nil)
	if err != nil {
		panic(err)
	}
	s, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{"node-a", "node-b"}, Prompt: keys[0]})
	if err != nil {
		panic(err)
	}
	best := s.Nodes[s.Best]
	fmt.Printf("%s at %s holds %d of the prompt's tokens\n", best.Node, best.PeerAddress, best.Tokens)
	// Output:
	// node-b at node-b:8000 holds 48 of the prompt's tokens
}
