package vllmhash

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

var allAlgorithms = []Algorithm{SHA256, SHA256CBOR, XXHash, XXHashCBOR}

func TestAlgorithm(t *testing.T) {
	for _, a := range allAlgorithms {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
		if want := map[bool]int{true: 32, false: 16}[a == SHA256 || a == SHA256CBOR]; a.Size() != want {
			t.Errorf("%v.Size() = %d, want %d", a, a.Size(), want)
		}
	}
	if _, err := ParseAlgorithm("builtin"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseAlgorithm(builtin) = %v, want ErrInvalid", err)
	}
	if s := Algorithm(9).String(); s != "Algorithm(9)" || Algorithm(9).Size() != 0 {
		t.Errorf("Algorithm(9): %q, size %d", s, Algorithm(9).Size())
	}
	if _, err := NewHasher(Algorithm(-1), "0"); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewHasher(-1) = %v, want ErrInvalid", err)
	}
}

func TestEmptySeedRefused(t *testing.T) {
	for _, a := range allAlgorithms {
		_, err := NewHasher(a, "")
		if !errors.Is(err, ErrEmptySeed) {
			t.Fatalf("%v: NewHasher with an empty seed = %v", a, err)
		}
		for _, want := range []string{"random root per process", "no two engines", "PYTHONHASHSEED"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
	if _, err := NewHasher(SHA256, "\xff"); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewHasher with a non-UTF-8 seed = %v", err)
	}
}

func TestBadExtraKeys(t *testing.T) {
	h, err := NewHasher(SHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		bs    int
		extra ExtraKeys
		want  error
	}{
		"zero block":     {0, ExtraKeys{}, ErrInvalid},
		"prompt embeds":  {16, ExtraKeys{PromptEmbeds: true}, ErrPromptEmbeds},
		"bad lora":       {16, ExtraKeys{LoRAName: "\xfe"}, ErrInvalid},
		"bad salt":       {16, ExtraKeys{CacheSalt: "a\xff"}, ErrInvalid},
		"bad identifier": {16, ExtraKeys{Multimodal: []MultimodalItem{{Identifier: "\xff", Length: 1}}}, ErrInvalid},
		"empty item":     {16, ExtraKeys{Multimodal: []MultimodalItem{{Identifier: "a", Offset: 3}}}, ErrInvalid},
		"negative item":  {16, ExtraKeys{Multimodal: []MultimodalItem{{Identifier: "a", Offset: -1, Length: 2}}}, ErrInvalid},
		"out of order": {16, ExtraKeys{Multimodal: []MultimodalItem{
			{Identifier: "a", Offset: 10, Length: 2}, {Identifier: "b", Offset: 3, Length: 2}}}, ErrInvalid},
	} {
		if _, err := h.NewChain(c.bs, c.extra); !errors.Is(err, c.want) {
			t.Errorf("%s: NewChain = %v, want %v", name, err, c.want)
		}
		if _, err := h.Hash(c.bs, []int32{1, 2}, c.extra); !errors.Is(err, c.want) {
			t.Errorf("%s: Hash = %v, want %v", name, err, c.want)
		}
	}
}

func TestChainAccessors(t *testing.T) {
	h, err := NewHasher(XXHash, "7")
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.NewChain(4, ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	c.Append([]int32{1, 2, 3, 4, 5, 6})
	if c.Hasher() != h || c.BlockSize() != 4 || c.Len() != 1 || c.Tokens() != 6 || len(c.Hash(0)) != 16 {
		t.Fatalf("chain: len %d tokens %d", c.Len(), c.Tokens())
	}
	if h.Algorithm() != XXHash || len(h.Root()) != 16 {
		t.Fatal("hasher accessors")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Hash(1) of a one-block chain did not panic")
			}
		}()
		c.Hash(1)
	}()
	if err := c.Reset(0, ExtraKeys{}); err == nil || c.Len() != 0 {
		t.Fatal("Reset(0) did not fail or left blocks")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Append after a failed Reset did not panic")
			}
		}()
		c.Append([]int32{1})
	}()
	func() {
		defer func() {
			if recover() == nil {
				t.Error("AppendGenerated after a failed Reset did not panic")
			}
		}()
		c.AppendGenerated(1)
	}()
	if err := c.Reset(4, ExtraKeys{}); err != nil {
		t.Fatal(err)
	}
	c.Append([]int32{1, 2, 3})
	if n := c.AppendGenerated(4, 5); n != 1 || c.Len() != 1 || c.Tokens() != 5 {
		t.Fatalf("AppendGenerated = %d: %d blocks, %d tokens", n, c.Len(), c.Tokens())
	}
	if n := c.AppendGenerated(); n != 0 || c.Tokens() != 5 {
		t.Fatalf("AppendGenerated() = %d, %d tokens", n, c.Tokens())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Append after AppendGenerated did not panic")
			}
		}()
		c.Append([]int32{6})
	}()
	if err := c.Reset(4, ExtraKeys{}); err != nil {
		t.Fatal(err)
	}
	c.Append([]int32{1, 2, 3, 4}) // a reset chain takes a prompt again
	if c.Len() != 1 {
		t.Fatalf("after Reset: %d blocks", c.Len())
	}
}

// TestChainAllocationFree is the scheduler's steady state: a reused chain
// hashes a prompt, then tokens generated one at a time, without allocating,
// extra keys included.
func TestChainAllocationFree(t *testing.T) {
	tokens := make([]int32, 1024)
	for i := range tokens {
		tokens[i] = int32(i * 7919 % 152064)
	}
	extra := ExtraKeys{LoRAName: "adapter", CacheSalt: "salt",
		Multimodal: []MultimodalItem{{Identifier: "img", Offset: 20, Length: 40}}}
	for _, a := range allAlgorithms {
		h, err := NewHasher(a, "0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := h.NewChain(16, extra)
		if err != nil {
			t.Fatal(err)
		}
		c.Append(tokens)
		n := testing.AllocsPerRun(20, func() {
			if err := c.Reset(16, extra); err != nil {
				t.Fatal(err)
			}
			c.Append(tokens[:500])
			c.Append(tokens[500:700])
			for _, tok := range tokens[700:] {
				c.AppendGenerated(tok)
			}
		})
		if n != 0 {
			t.Errorf("%v: %v allocations per request", a, n)
		}
		if c.Len() != len(tokens)/16 {
			t.Errorf("%v: %d blocks", a, c.Len())
		}
	}
}

// decodeCBOR decodes a block encoding into the shape unpickle returns.
func decodeCBOR(t *testing.T, enc []byte) any {
	t.Helper()
	var v any
	dm, err := cbor.DecOptions{IntDec: cbor.IntDecConvertSignedOrFail}.DecMode()
	if err != nil {
		t.Fatal(err)
	}
	if err := dm.Unmarshal(enc, &v); err != nil {
		t.Fatalf("decoding %x: %v", enc, err)
	}
	return v
}

// FuzzChain checks a chain against itself and its decoders: prompt tokens
// appended in any pieces hash as in one piece, and generated tokens given
// one at a time as in any pieces; every block's encoding decodes (pickle or
// CBOR) to (parent, tokens, extra keys); and, when items do not overlap,
// the extra keys are the items a block overlaps, except that a block after
// the first that generated tokens completed holds only the last item, if it
// overlaps it. Without multimodal items, generated tokens hash as prompt
// tokens. Identifiers repeat the salt at times, so that the pickle's memo
// lookups are decoded too.
func FuzzChain(f *testing.F) {
	f.Add(uint8(0), uint8(4), []byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a"), []byte{3, 1}, "lora", "salt", []byte{1, 5, 9, 2}, uint8(0))
	f.Add(uint8(1), uint8(1), []byte("abc"), []byte{}, "", "", []byte{}, uint8(1))
	f.Add(uint8(3), uint8(16), bytes.Repeat([]byte{0xff, 0x01}, 40), []byte{7, 7, 7}, "", "s", []byte{0, 30, 2, 1}, uint8(30))
	f.Add(uint8(2), uint8(8), bytes.Repeat([]byte{0x10, 0x20}, 40), []byte{5}, "a", "a", []byte{10, 1, 2, 1, 3, 1}, uint8(17))
	f.Fuzz(func(t *testing.T, alg, bs uint8, raw, cuts []byte, lora, salt string, mm []byte, gen uint8) {
		a := allAlgorithms[int(alg)%len(allAlgorithms)]
		h, err := NewHasher(a, "fuzz")
		if err != nil {
			t.Fatal(err)
		}
		blockSize := int(bs%40) + 1
		tokens := make([]int32, 0, len(raw)/2)
		for i := 0; i+2 <= len(raw); i += 2 {
			tokens = append(tokens, int32(raw[i])<<16|int32(raw[i+1])<<3)
		}
		extra := ExtraKeys{LoRAName: lora, CacheSalt: salt}
		off := 0
		for i := 0; i+2 <= len(mm) && i < 16; i += 2 {
			off += int(mm[i] % 24)
			id := fmt.Sprint("m", i)
			if mm[i]&0x80 != 0 {
				id = salt
			}
			extra.Multimodal = append(extra.Multimodal, MultimodalItem{Identifier: id, Offset: off, Length: int(mm[i+1]%20) + 1})
		}
		whole, err := h.Hash(blockSize, tokens, extra)
		if err != nil {
			if errors.Is(err, ErrInvalid) {
				t.Skip()
			}
			t.Fatal(err)
		}
		c, err := h.NewChain(blockSize, extra)
		if err != nil {
			t.Fatal(err)
		}
		rest := tokens
		for _, k := range cuts {
			n := min(int(k), len(rest))
			c.Append(rest[:n])
			rest = rest[n:]
		}
		c.Append(rest)
		if c.Len() != len(tokens)/blockSize || c.Tokens() != len(tokens) {
			t.Fatalf("chain has %d blocks, %d tokens for %d tokens", c.Len(), c.Tokens(), len(tokens))
		}
		for i := range whole {
			if !bytes.Equal(c.Hash(i), whole[i]) {
				t.Fatalf("block %d: pieces and whole differ", i)
			}
		}

		// The same tokens, the last ones generated: one at a time, and
		// in the pieces cuts gives.
		prompt := tokens[:len(tokens)-min(int(gen), len(tokens))]
		generated := tokens[len(prompt):]
		r, err := h.NewChain(blockSize, extra)
		if err != nil {
			t.Fatal(err)
		}
		r.Append(prompt)
		n := r.Len()
		for _, tok := range generated {
			n += r.AppendGenerated(tok)
		}
		p, err := h.NewChain(blockSize, extra)
		if err != nil {
			t.Fatal(err)
		}
		p.Append(prompt)
		rest = generated
		for _, k := range cuts {
			k := min(int(k), len(rest))
			before := p.Len()
			if got := p.AppendGenerated(rest[:k]...); got != p.Len()-before {
				t.Fatalf("AppendGenerated says %d blocks, the chain grew by %d", got, p.Len()-before)
			}
			rest = rest[k:]
		}
		p.AppendGenerated(rest...)
		if r.Len() != len(whole) || n != r.Len() || p.Len() != len(whole) || r.Tokens() != len(tokens) {
			t.Fatalf("generated: %d blocks (%d counted), %d in pieces, %d tokens; want %d blocks of %d tokens",
				r.Len(), n, p.Len(), r.Tokens(), len(whole), len(tokens))
		}
		for i := range whole {
			if !bytes.Equal(r.Hash(i), p.Hash(i)) {
				t.Fatalf("block %d: generated tokens one at a time and in pieces differ", i)
			}
			if len(extra.Multimodal) == 0 && !bytes.Equal(r.Hash(i), whole[i]) {
				t.Fatalf("block %d: without multimodal items, generated and prompt tokens differ", i)
			}
		}

		disjoint := true
		for i := 1; i < len(extra.Multimodal); i++ {
			p := extra.Multimodal[i-1]
			disjoint = disjoint && p.Offset+p.Length <= extra.Multimodal[i].Offset
		}
		d, err := h.NewChain(blockSize, extra)
		if err != nil {
			t.Fatal(err)
		}
		parent := h.Root()
		for i := range whole {
			start, end := i*blockSize, (i+1)*blockSize
			fromGenerated := end > len(prompt)
			d.extraKeys(start, end, fromGenerated)
			if disjoint {
				var want []extraItem
				if lora != "" {
					want = append(want, extraItem{kind: itemLoRA, str: lora})
				}
				for j, m := range extra.Multimodal {
					if fromGenerated && start > 0 && j < len(extra.Multimodal)-1 {
						continue // only the last item is looked at
					}
					if m.Offset < end && m.Offset+m.Length > start {
						want = append(want, extraItem{kind: itemPair, str: m.Identifier, offset: m.Offset - start})
					}
				}
				if start == 0 && salt != "" {
					want = append(want, extraItem{kind: itemSalt, str: salt})
				}
				if !reflect.DeepEqual(append([]extraItem(nil), d.items...), want) {
					t.Fatalf("block %d: extra keys %+v, want %+v", i, d.items, want)
				}
			}
			wantValue := blockValue(parent, tokens[start:end], d.items)
			var got any
			if a.usesCBOR() {
				enc := d.encodeCBOR(parent, tokens[start:end])
				if sum := a.digest(nil, enc); !bytes.Equal(sum, r.Hash(i)) {
					t.Fatalf("block %d: digest of the encoding differs", i)
				}
				got = decodeCBOR(t, enc)
			} else {
				enc := d.encodePickle(parent, tokens[start:end])
				if sum := a.digest(nil, enc); !bytes.Equal(sum, r.Hash(i)) {
					t.Fatalf("block %d: digest of the encoding differs", i)
				}
				if got, err = unpickle(enc); err != nil {
					t.Fatalf("block %d: %v", i, err)
				}
			}
			if !reflect.DeepEqual(got, wantValue) {
				t.Fatalf("block %d: decoded %#v, want %#v", i, got, wantValue)
			}
			parent = r.Hash(i)
		}
	})
}
