package vllmhash

import (
	"bytes"
	"fmt"
)

// Chain hashes one request's tokens block by block, as vLLM fills
// Request.block_hashes: [Chain.Append] the prompt's tokens, in any pieces,
// then [Chain.AppendGenerated] the tokens the engine generates; every block
// they complete is hashed onto the chain. Once its buffers have grown, a
// Chain allocates nothing; [Chain.Reset] reuses them for another request.
//
// A Chain is not safe for concurrent use.
type Chain struct {
	h         *Hasher
	blockSize int
	extra     ExtraKeys
	hashes    []byte  // Len() hashes of Algorithm().Size() bytes, in order
	pending   []int32 // tokens of the partial block
	tokens    int     // tokens appended, pending ones included
	mmNext    int     // vLLM's curr_mm_idx: the first item a block may overlap
	generated bool    // AppendGenerated was called since Reset

	pickle pickler
	cbuf   bytes.Buffer
	cblock cborBlock
	// extra keys of the block being hashed
	items []extraItem
	boxed []any
	mmBox []cborPair
	lora  any // LoRAName, boxed once
	salt  any // CacheSalt, boxed once
}

// extraItem is one element of a block's extra_keys tuple: a string (LoRA
// name or cache salt) or a multimodal (identifier, offset) pair.
type extraItem struct {
	kind   itemKind
	str    string
	offset int // of a multimodal item, relative to the block's start
}

type itemKind uint8

const (
	itemLoRA itemKind = iota
	itemPair
	itemSalt
)

// cborBlock is the (parent, tokens, extra_keys) tuple as CBOR sees it.
type cborBlock struct {
	_      struct{} `cbor:",toarray"`
	Parent []byte
	Tokens []int32 // an array of integers, never a byte string
	Extra  []any   // nil encodes None
}

// cborPair is a multimodal (identifier, offset) tuple.
type cborPair struct {
	_      struct{} `cbor:",toarray"`
	ID     string
	Offset int
}

// NewChain starts an empty chain of blocks of blockSize tokens for a
// request with the given extra keys. A non-positive block size or bad
// extra keys are errors matching [ErrInvalid]; prompt embeddings are
// refused with [ErrPromptEmbeds].
func (h *Hasher) NewChain(blockSize int, extra ExtraKeys) (*Chain, error) {
	c := &Chain{h: h}
	if err := c.Reset(blockSize, extra); err != nil {
		return nil, err
	}
	return c, nil
}

// Reset empties the chain and starts it anew for another request, keeping
// its buffers. Its errors are NewChain's; after an error the chain is
// empty and must be Reset again before use.
func (c *Chain) Reset(blockSize int, extra ExtraKeys) error {
	c.hashes, c.pending, c.tokens, c.mmNext, c.generated = c.hashes[:0], c.pending[:0], 0, 0, false
	c.blockSize = 0
	if blockSize <= 0 {
		return fmt.Errorf("%w: block size %d", ErrInvalid, blockSize)
	}
	if err := extra.validate(); err != nil {
		return err
	}
	c.blockSize = blockSize
	if extra.LoRAName != c.extra.LoRAName || c.lora == nil {
		c.lora = extra.LoRAName
	}
	if extra.CacheSalt != c.extra.CacheSalt || c.salt == nil {
		c.salt = extra.CacheSalt
	}
	c.extra = extra
	return nil
}

// Hasher returns the chain's hasher.
func (c *Chain) Hasher() *Hasher { return c.h }

// BlockSize returns the number of tokens in each block.
func (c *Chain) BlockSize() int { return c.blockSize }

// Len returns the number of blocks hashed: the full blocks appended.
func (c *Chain) Len() int { return len(c.hashes) / c.h.alg.Size() }

// Tokens returns the number of tokens appended, those of a partial last
// block included.
func (c *Chain) Tokens() int { return c.tokens }

// Hash returns block i's hash (0 <= i < Len()), which is vLLM's
// request.block_hashes[i]. The slice is shared: the caller must not modify
// it, and it is valid until the next Reset.
func (c *Chain) Hash(i int) []byte {
	size := c.h.alg.Size()
	if i < 0 || i >= c.Len() {
		panic(fmt.Sprintf("vllmhash: block %d of a chain of %d", i, c.Len()))
	}
	return c.hashes[i*size : (i+1)*size : (i+1)*size]
}

// Append adds prompt tokens to the request and hashes every block they
// complete, as vLLM hashes a prompt when it creates the request: pieces
// hash as the whole prompt would. It panics after [Chain.AppendGenerated]:
// a request's prompt comes before the tokens generated for it.
func (c *Chain) Append(tokens []int32) {
	if c.blockSize <= 0 {
		panic("vllmhash: Append on a chain whose Reset failed")
	}
	if c.generated {
		panic("vllmhash: Append (prompt tokens) after AppendGenerated")
	}
	for len(tokens) > 0 {
		if len(c.pending) == 0 && len(tokens) >= c.blockSize {
			c.hashBlock(tokens[:c.blockSize], false)
			tokens = tokens[c.blockSize:]
			c.tokens += c.blockSize
			continue
		}
		n := min(c.blockSize-len(c.pending), len(tokens))
		c.pending = append(c.pending, tokens[:n]...)
		tokens = tokens[n:]
		c.tokens += n
		if len(c.pending) == c.blockSize {
			c.hashBlock(c.pending, false)
			c.pending = c.pending[:0]
		}
	}
}

// AppendGenerated adds tokens the engine generated for the request, after
// its prompt, and hashes every block they complete; it returns how many,
// which are the last ones: Hash(Len()-n) to Hash(Len()-1).
//
// vLLM's scheduler appends generated tokens one at a time
// (Request.append_output_token_ids, speculative tokens included), and
// each append hashes the block it completes with its request block hasher
// (kv_cache_utils.get_request_block_hasher), which looks at the request's
// multimodal items differently than the prompt's hashing does: for a block
// other than the request's first, it starts from the last item
// (curr_mm_idx -1), so such a block's extra keys hold the last multimodal
// item if the block overlaps it and no other item, where the same tokens
// hashed as a prompt would list every item the block overlaps. The first
// block, completed when the prompt is shorter than a block, is hashed as a
// prompt's. LoRA name and cache salt are as for the prompt. AppendGenerated
// hashes each token as such an append, so the tokens may be given one at a
// time or many at once. A later change to vLLM (pull request 51694,
// proposed after 0.22) picks a block's items by its token window on this
// path too, so that generated blocks hash as prompt blocks; for an engine
// with it, Append the generated tokens as well.
func (c *Chain) AppendGenerated(tokens ...int32) int {
	if c.blockSize <= 0 {
		panic("vllmhash: AppendGenerated on a chain whose Reset failed")
	}
	c.generated = true
	n := 0
	for len(tokens) > 0 {
		k := min(c.blockSize-len(c.pending), len(tokens))
		c.pending = append(c.pending, tokens[:k]...)
		tokens = tokens[k:]
		c.tokens += k
		if len(c.pending) == c.blockSize {
			c.hashBlock(c.pending, true)
			c.pending = c.pending[:0]
			n++
		}
	}
	return n
}

// parent returns the hash the next block chains to.
func (c *Chain) parent() []byte {
	if n := len(c.hashes); n > 0 {
		return c.hashes[n-c.h.alg.Size():]
	}
	return c.h.root
}

// extraKeys fills c.items with the extra keys of the block of tokens
// [start, end), as vLLM's generate_block_hash_extra_keys: the LoRA name, the
// multimodal items the block overlaps with their offset relative to the
// block's start, then the cache salt on the first block. A block that
// generated tokens completed (lastItem, start > 0) looks at the last
// multimodal item only; see AppendGenerated.
func (c *Chain) extraKeys(start, end int, lastItem bool) {
	c.items = c.items[:0]
	if c.extra.LoRAName != "" {
		c.items = append(c.items, extraItem{kind: itemLoRA, str: c.extra.LoRAName})
	}
	mm := c.extra.Multimodal
	if lastItem && start > 0 {
		// vLLM's scan from index -1: the last item, if the block has
		// reached it and not passed it.
		if n := len(mm); n > 0 && end > mm[n-1].Offset && start < mm[n-1].Offset+mm[n-1].Length {
			it := mm[n-1]
			c.items = append(c.items, extraItem{kind: itemPair, str: it.Identifier, offset: it.Offset - start})
		}
	} else {
		for c.mmNext < len(mm) {
			it := mm[c.mmNext]
			if end <= it.Offset {
				break // the block has not reached this item
			}
			if start >= it.Offset+it.Length {
				c.mmNext++ // the block is past this item
				continue
			}
			c.items = append(c.items, extraItem{kind: itemPair, str: it.Identifier, offset: it.Offset - start})
			if end < it.Offset+it.Length {
				break // the item goes on into the next block
			}
			c.mmNext++
		}
	}
	if start == 0 && c.extra.CacheSalt != "" {
		c.items = append(c.items, extraItem{kind: itemSalt, str: c.extra.CacheSalt})
	}
}

// hashBlock hashes the next block, whose tokens are given, onto the chain;
// generated says generated tokens completed it.
func (c *Chain) hashBlock(tokens []int32, generated bool) {
	start := len(c.hashes) / c.h.alg.Size() * c.blockSize
	c.extraKeys(start, start+c.blockSize, generated)
	var enc []byte
	if c.h.alg.usesCBOR() {
		enc = c.encodeCBOR(c.parent(), tokens)
	} else {
		enc = c.encodePickle(c.parent(), tokens)
	}
	// Hashing appends to c.hashes, which may move; the parent was read
	// before.
	c.hashes = c.h.alg.digest(c.hashes, enc)
}

// encodePickle pickles the block (parent, tuple(tokens), extra keys).
func (c *Chain) encodePickle(parent []byte, tokens []int32) []byte {
	p := &c.pickle
	p.begin()
	p.startTuple(3)
	p.saveBytes(parent)
	p.saveTokens(tokens)
	if len(c.items) == 0 {
		p.saveNone()
	} else {
		p.startTuple(len(c.items))
		for _, it := range c.items {
			if it.kind == itemPair {
				p.startTuple(2)
				p.saveStr(it.str)
				p.saveInt(int64(it.offset))
				p.endTuple(2)
			} else {
				p.saveStr(it.str)
			}
		}
		p.endTuple(len(c.items))
	}
	p.endTuple(3)
	return p.end()
}

// encodeCBOR encodes the block (parent, tokens, extra keys) in canonical
// CBOR.
func (c *Chain) encodeCBOR(parent []byte, tokens []int32) []byte {
	b := &c.cblock
	b.Parent, b.Tokens, b.Extra = parent, tokens, nil
	if len(c.items) > 0 {
		c.boxed = c.boxed[:0]
		c.mmBox = c.mmBox[:0]
		for _, it := range c.items {
			if it.kind == itemPair {
				c.mmBox = append(c.mmBox, cborPair{ID: it.str, Offset: it.offset})
			}
		}
		pairs := 0
		for _, it := range c.items {
			switch it.kind {
			case itemLoRA:
				c.boxed = append(c.boxed, c.lora)
			case itemPair:
				c.boxed = append(c.boxed, &c.mmBox[pairs])
				pairs++
			case itemSalt:
				c.boxed = append(c.boxed, c.salt)
			}
		}
		b.Extra = c.boxed
	}
	c.cbuf.Reset()
	if err := cborMode.MarshalToBuffer(b, &c.cbuf); err != nil {
		// Every value here is a byte string, an integer array, a text
		// string or an integer: encoding cannot fail.
		panic(fmt.Sprintf("vllmhash: CBOR encoding failed: %v", err))
	}
	b.Parent, b.Tokens, b.Extra = nil, nil, nil
	return c.cbuf.Bytes()
}
