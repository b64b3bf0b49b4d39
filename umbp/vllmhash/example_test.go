package vllmhash_test

import (
	"errors"
	"fmt"

	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

// A scheduler extends a request's chain as its tokens arrive; each full
// block gets the hash vLLM gives it (request.block_hashes).
func ExampleChain() {
	h, err := vllmhash.NewHasher(vllmhash.XXHashCBOR, "42") // PYTHONHASHSEED=42
	if err != nil {
		panic(err)
	}
	c, err := h.NewChain(4, vllmhash.ExtraKeys{LoRAName: "sql-adapter"})
	if err != nil {
		panic(err)
	}
	c.Append([]int32{101, 102, 103})
	fmt.Println(c.Len(), "blocks of", c.Tokens(), "tokens")
	c.Append([]int32{104, 105, 106, 107, 108, 109})
	for i := range c.Len() {
		fmt.Printf("block %d: %x\n", i, c.Hash(i))
	}

	// Without PYTHONHASHSEED every vLLM process has its own random root.
	_, err = vllmhash.NewHasher(vllmhash.SHA256, "")
	fmt.Println(errors.Is(err, vllmhash.ErrEmptySeed))
	// Output:
	// 0 blocks of 3 tokens
	// block 0: 31f70b4b47c927a1333016d2094b4cf5
	// block 1: d3fd22effb22f3ed033b61dfc5d4e1a9
	// true
}
