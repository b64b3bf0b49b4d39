package vllmhash

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkChain32k hashes a 32k-token prompt, 2048 blocks of 16 tokens,
// on a reused chain, as a scheduler does per request. scripts/
// vllmhash-vectors.py --bench runs it beside Python doing the same.
func BenchmarkChain32k(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, 32768)
	for i := range tokens {
		tokens[i] = int32(r.IntN(152064))
	}
	for _, a := range allAlgorithms {
		b.Run(a.String(), func(b *testing.B) {
			h, err := NewHasher(a, "0")
			if err != nil {
				b.Fatal(err)
			}
			c, err := h.NewChain(16, ExtraKeys{})
			if err != nil {
				b.Fatal(err)
			}
			c.Append(tokens) // grow the buffers
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				_ = c.Reset(16, ExtraKeys{})
				c.Append(tokens)
			}
			b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// BenchmarkAppendGenerated is decoding: a 1024-token prompt with a LoRA
// adapter and an image, then 1024 tokens generated one at a time (64 of
// the 128 blocks of 16 completed by generated tokens), on a reused chain,
// per request. The as-prompt runs hash the same 2048 tokens in one Append,
// for comparison.
func BenchmarkAppendGenerated(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	tokens := make([]int32, 2048)
	for i := range tokens {
		tokens[i] = int32(r.IntN(152064))
	}
	extra := ExtraKeys{LoRAName: "adapter", Multimodal: []MultimodalItem{{Identifier: "img", Offset: 100, Length: 576}}}
	for _, a := range allAlgorithms {
		for _, generated := range []bool{true, false} {
			name := a.String() + "/as-prompt"
			if generated {
				name = a.String() + "/generated"
			}
			b.Run(name, func(b *testing.B) {
				h, err := NewHasher(a, "0")
				if err != nil {
					b.Fatal(err)
				}
				c, err := h.NewChain(16, extra)
				if err != nil {
					b.Fatal(err)
				}
				c.Append(tokens) // grow the buffers
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					_ = c.Reset(16, extra)
					if !generated {
						c.Append(tokens)
						continue
					}
					c.Append(tokens[:1024])
					for _, t := range tokens[1024:] {
						c.AppendGenerated(t)
					}
				}
				b.ReportMetric(float64(len(tokens))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
