package umbp_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

func newHasher(t testing.TB, alg vllmhash.Algorithm) *vllmhash.Hasher {
	t.Helper()
	h, err := vllmhash.NewHasher(alg, "0")
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func promptTokens(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32((i*7919 + 13) % 152064)
	}
	return out
}

func TestTokenKeyerConfig(t *testing.T) {
	h := newHasher(t, vllmhash.SHA256)
	ok := umbp.TokenKeyConfig{Namespace: "ns", Groups: []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}}, Hasher: h}
	for name, c := range map[string]struct {
		edit func(*umbp.TokenKeyConfig)
		also error
	}{
		"no hasher":      {func(c *umbp.TokenKeyConfig) { c.Hasher = nil }, nil},
		"no groups":      {func(c *umbp.TokenKeyConfig) { c.Groups = nil }, nil},
		"bad namespace":  {func(c *umbp.TokenKeyConfig) { c.Namespace = "a:b" }, umbp.ErrInvalidKey},
		"bad topology":   {func(c *umbp.TokenKeyConfig) { c.Topology.TPSize = -1 }, umbp.ErrInvalidTopology},
		"negative group": {func(c *umbp.TokenKeyConfig) { c.Groups = []umbp.KVCacheGroup{{ID: -1, BlockSize: 16}} }, nil},
		"twice": {func(c *umbp.TokenKeyConfig) {
			c.Groups = []umbp.KVCacheGroup{{ID: 1, BlockSize: 16}, {ID: 1, BlockSize: 32}}
		}, nil},
		"zero block":    {func(c *umbp.TokenKeyConfig) { c.Groups = []umbp.KVCacheGroup{{ID: 0}} }, nil},
		"negative hash": {func(c *umbp.TokenKeyConfig) { c.HashBlockSize = -16 }, nil},
		"not a divisor": {func(c *umbp.TokenKeyConfig) { c.HashBlockSize = 12 }, nil},
	} {
		cfg := ok
		c.edit(&cfg)
		_, err := umbp.NewTokenKeyer(cfg)
		if !errors.Is(err, umbp.ErrInvalidTokenKeyConfig) || c.also != nil && !errors.Is(err, c.also) {
			t.Errorf("%s: %v", name, err)
		}
	}
	cfg := ok
	cfg.Groups = []umbp.KVCacheGroup{{ID: 0, BlockSize: 64}, {ID: 2, BlockSize: 48}}
	k, err := umbp.NewTokenKeyer(cfg)
	if err != nil || k.HashBlockSize() != 16 {
		t.Fatalf("HashBlockSize %v, %v; want the GCD 16", k, err)
	}
	ok.Hasher = newHasher(t, vllmhash.SHA256)
	other, err := umbp.NewTokenKeyer(ok)
	if err != nil {
		t.Fatal(err)
	}
	c, err := other.NewChain(vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.ChainKeys(c); !errors.Is(err, umbp.ErrInvalidTokenKeyConfig) {
		t.Errorf("ChainKeys with another keyer's chain: %v", err)
	}
	if _, err := k.Keys(nil, vllmhash.ExtraKeys{PromptEmbeds: true}); !errors.Is(err, vllmhash.ErrPromptEmbeds) {
		t.Errorf("Keys with prompt embeddings: %v", err)
	}
}

// TestTokenKeysOrder checks the keys against the connector's recipe: block
// j of a group of block size B uses hash (j+1)*B/hash_block_size - 1, and a
// block asks every rank, TP fastest, then PCP, DCP and PP.
func TestTokenKeysOrder(t *testing.T) {
	h := newHasher(t, vllmhash.XXHash)
	topo := umbp.RankTopology{TPSize: 2, PCPSize: 2, DCPSize: 2, PPSize: 2}
	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "ns", Topology: topo, Hasher: h,
		Groups: []umbp.KVCacheGroup{{ID: 3, BlockSize: 8}, {ID: 1, BlockSize: 4}},
	})
	if err != nil {
		t.Fatal(err)
	}
	tokens := promptTokens(19)
	hashes, err := h.Hash(4, tokens, vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := k.Keys(tokens, vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for end := 4; end <= 16; end += 4 {
		for _, g := range []struct{ id, bs int }{{3, 8}, {1, 4}} {
			if end%g.bs != 0 {
				continue
			}
			hash := hex.EncodeToString(hashes[end/4-1])
			for pp := range 2 {
				for dcp := range 2 {
					for pcp := range 2 {
						for tp := range 2 {
							want = append(want, fmt.Sprintf("umbp:vllm:v1:ns:tp%d:pcp%d:dcp%d:pp%d:g%d:%s", tp, pcp, dcp, pp, g.id, hash))
						}
					}
				}
			}
		}
	}
	if fmt.Sprint(keys.Keys) != fmt.Sprint(want) {
		t.Fatalf("keys:\n%v\nwant\n%v", keys.Keys, want)
	}
	// 16 ranks; ends 4 (g1), 8 (g3, g1), 12 (g1), 16 (g3, g1).
	for held, tokens := range map[int]int{0: 0, 15: 0, 16: 0, 47: 0, 48: 8, 63: 8, 64: 8, 95: 8, 96: 16} {
		if got := keys.Tokens(held); got != tokens {
			t.Errorf("Tokens(%d) = %d, want %d", held, got, tokens)
		}
	}
}

// connectorEngine stores blocks under the keys a vLLM engine with the UMBP
// connector would, every rank's object from one worker handle.
type connectorEngine struct {
	*engine
}

func (e connectorEngine) store(t *testing.T, keys ...string) {
	t.Helper()
	plans := make([]umbp.BlockTransferPlan, len(keys))
	for i, key := range keys {
		p, err := e.plan.PlanForBlock(key, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		plans[i] = p
	}
	waitJob(t, e.w, e.w.Store(plans))
}

// TestLookupTokens stores a prompt's blocks the connector's way, across
// two groups and four ranks, and checks that LookupTokens counts exactly
// the stored prefix.
func TestLookupTokens(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	rt := newRuntime(t, cfg)
	h := newScheduler(t, rt)
	ctx := context.Background()
	e := connectorEngine{newEngine(t, rt, 1, 1, 64)}

	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "e2e",
		Topology:  umbp.RankTopology{TPSize: 2, PPSize: 2},
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}, {ID: 1, BlockSize: 32}},
		Hasher:    newHasher(t, vllmhash.SHA256),
	})
	if err != nil {
		t.Fatal(err)
	}
	extra := vllmhash.ExtraKeys{LoRAName: "adapter", CacheSalt: "tenant"}
	tokens := promptTokens(200) // 12 full blocks of 16, 6 of 32
	keys, err := k.Keys(tokens, extra)
	if err != nil {
		t.Fatal(err)
	}
	// Per rank and block: ends 16 (g0), 32 (g0, g1), 48 (g0), 64 (g0, g1)...
	const ranks = 4
	if len(keys.Keys) != (12+6)*ranks {
		t.Fatalf("%d keys", len(keys.Keys))
	}
	// tokenKeys is the keyer's keys of tokens, which must be good input.
	tokenKeys := func(k *umbp.TokenKeyer, tokens []int32, extra vllmhash.ExtraKeys) *umbp.TokenKeys {
		t.Helper()
		keys, err := k.Keys(tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	lookup := func(want int) {
		t.Helper()
		if got := h.LookupTokens(ctx, keys); got != want {
			t.Fatalf("LookupTokens = %d; want %d", got, want)
		}
	}
	lookup(0)

	// Everything up to token 64 but the last rank's group 1 block there:
	// group 1 then holds only tokens [0, 32).
	upTo64 := 6 * ranks
	e.store(t, keys.Keys[:upTo64-1]...)
	lookup(32)
	// The missing rank's key completes the prefix.
	e.store(t, keys.Keys[upTo64-1])
	lookup(64)
	// Group 0 alone at tokens 80 and 96 is not enough for 96: group 1's
	// block ending at 96 is missing.
	e.store(t, keys.Keys[upTo64:upTo64+2*ranks]...)
	lookup(64)
	e.store(t, keys.Keys[upTo64+2*ranks:]...)
	lookup(192)

	// The connector never loads the block ending at the last prompt token;
	// the first n-1 tokens give its count.
	if got := h.LookupTokens(ctx, tokenKeys(k, tokens[:192], extra)); got != 192 {
		t.Fatalf("prompt of 192: %d", got)
	}
	if got := h.LookupTokens(ctx, tokenKeys(k, tokens[:191], extra)); got != 160 {
		t.Fatalf("prompt of 192 less its last token: %d", got)
	}
	// Other extra keys, another seed or algorithm: other blocks.
	if got := h.LookupTokens(ctx, tokenKeys(k, tokens, vllmhash.ExtraKeys{CacheSalt: "tenant"})); got != 0 {
		t.Fatalf("without the LoRA: %d", got)
	}
	other, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "e2e",
		Topology:  umbp.RankTopology{TPSize: 2, PPSize: 2},
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}, {ID: 1, BlockSize: 32}},
		Hasher:    newHasher(t, vllmhash.XXHash),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.LookupTokens(ctx, tokenKeys(other, tokens, extra)); got != 0 {
		t.Fatalf("xxhash keyer: %d", got)
	}
	if _, err := k.Keys(tokens, vllmhash.ExtraKeys{PromptEmbeds: true}); !errors.Is(err, vllmhash.ErrPromptEmbeds) {
		t.Fatalf("prompt embeddings: %v", err)
	}
	// A request shorter than a block asks nothing.
	before := srv.Calls("BatchExistsConsecutive")
	if got := h.LookupTokens(ctx, tokenKeys(k, tokens[:15], extra)); got != 0 {
		t.Fatalf("15 tokens: %d", got)
	}
	if srv.Calls("BatchExistsConsecutive") != before {
		t.Fatal("a request without a full block reached the server")
	}
}

// TestLookupTokensStalledServer: a stalled server is a miss within
// LookupTimeout.
func TestLookupTokensStalledServer(t *testing.T) {
	srv := newServer(t, umbptest.Options{})
	cfg := testConfig(t, srv.Endpoint())
	rt := newRuntime(t, cfg)
	h := newScheduler(t, rt)
	e := connectorEngine{newEngine(t, rt, 1, 1, 64)}
	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "stall",
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}},
		Hasher:    newHasher(t, vllmhash.SHA256CBOR),
	})
	if err != nil {
		t.Fatal(err)
	}
	tokens := promptTokens(64)
	keys, err := k.Keys(tokens, vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	e.store(t, keys.Keys...)
	ctx := context.Background()
	if got := h.LookupTokens(ctx, keys); got != 64 {
		t.Fatalf("before the stall: %d", got)
	}
	srv.Stall()
	start := time.Now()
	got := h.LookupTokens(ctx, keys)
	if el := time.Since(start); el > cfg.LookupTimeout+margin {
		t.Fatalf("stalled LookupTokens took %v, bound %v", el, cfg.LookupTimeout)
	}
	if got != 0 {
		t.Fatalf("stalled LookupTokens = %d; want a miss", got)
	}
}
