package umbp_test

import (
	"fmt"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// How much of this prompt does the pool hold? A scheduler computes the keys
// a vLLM engine with the UMBP connector stores the prompt's blocks under,
// and asks the pool for them: with a SchedulerHandle h,
//
//	n := h.LookupTokens(ctx, keys)
//
// asks in one call. Here, the keys and what a count of held keys means.
func ExampleTokenKeyer() {
	// The engines run with PYTHONHASHSEED=0 and the default hash
	// algorithm, sha256, on two TP ranks with one KV cache group.
	hasher, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		panic(err)
	}
	keyer, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "llama",
		Topology:  umbp.RankTopology{TPSize: 2},
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}},
		Hasher:    hasher,
	})
	if err != nil {
		panic(err)
	}
	prompt := make([]int32, 40) // two full blocks and a partial one
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	keys, err := keyer.Keys(prompt, vllmhash.ExtraKeys{})
	if err != nil {
		panic(err)
	}
	for _, k := range keys.Keys {
		fmt.Println(k)
	}
	// The pool holding the first three keys holds block 0 on both ranks
	// but block 1 on rank 0 only.
	fmt.Println("3 keys held:", keys.Tokens(3), "tokens")
	fmt.Println("4 keys held:", keys.Tokens(4), "tokens")
	// Output:
	// umbp:vllm:v1:llama:tp0:pcp0:dcp0:pp0:g0:bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325
	// umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp0:g0:bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325
	// umbp:vllm:v1:llama:tp0:pcp0:dcp0:pp0:g0:2744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31
	// umbp:vllm:v1:llama:tp1:pcp0:dcp0:pp0:g0:2744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31
	// 3 keys held: 16 tokens
	// 4 keys held: 32 tokens
}
