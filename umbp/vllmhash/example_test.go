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

// After the prompt, the engine's generated tokens complete blocks too;
// AppendGenerated hashes them as vLLM's scheduler does, one token at a
// time.
func ExampleChain_AppendGenerated() {
	h, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		panic(err)
	}
	c, err := h.NewChain(4, vllmhash.ExtraKeys{
		Multimodal: []vllmhash.MultimodalItem{{Identifier: "img-1", Offset: 5, Length: 1}, {Identifier: "img-2", Offset: 6, Length: 1}},
	})
	if err != nil {
		panic(err)
	}
	c.Append([]int32{11, 12, 13, 14, 15, 16, 17}) // the prompt: one block
	for _, tok := range []int32{901, 902} {
		if n := c.AppendGenerated(tok); n > 0 {
			// Block 1 lists img-2 only, as vLLM's request block hasher
			// gives it.
			fmt.Printf("block %d: %x\n", c.Len()-1, c.Hash(c.Len()-1))
		}
	}
	// Output:
	// block 1: c396f7b3c32113b4f31a97b0c63823ba0fe7909424e6735d4580eeb58d40f662
}
