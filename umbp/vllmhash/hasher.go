package vllmhash

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/fxamacker/cbor/v2"
	"github.com/zeebo/xxh3"
)

var (
	// ErrEmptySeed is returned for an empty hash seed. vLLM derives the
	// root of every hash chain from PYTHONHASHSEED; when it is not set, each
	// engine process draws a random root, so no two engines (and no
	// restarted engine) share block hashes, and no other process can
	// compute them.
	ErrEmptySeed = errors.New("vllmhash: empty hash seed: without PYTHONHASHSEED vLLM uses a random root per process, so no two engines (and no restarted engine) would share keys; set PYTHONHASHSEED on every engine and pass the same value here")
	// ErrPromptEmbeds is returned for a request with prompt embeddings: vLLM
	// adds a SHA-256 of each block's embedding tensor bytes to its extra
	// keys, which this package does not compute.
	ErrPromptEmbeds = errors.New("vllmhash: requests with prompt embeddings are not supported: their block hashes depend on the embedding tensor bytes")
	// ErrInvalid is matched by errors that report a bad argument: an
	// unknown algorithm, a non-positive block size, a string that is not
	// valid UTF-8, or multimodal items out of order.
	ErrInvalid = errors.New("vllmhash: invalid argument")
)

// Algorithm is one of vLLM's prefix-caching hash algorithms
// (--prefix-caching-hash-algo).
type Algorithm int

const (
	// SHA256 is "sha256", vLLM's default: SHA-256 of
	// pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), protocol 5 on
	// every Python vLLM supports. 32-byte hashes.
	SHA256 Algorithm = iota
	// SHA256CBOR is "sha256_cbor": SHA-256 of cbor2.dumps(value,
	// canonical=True). 32-byte hashes.
	SHA256CBOR
	// XXHash is "xxhash": XXH3-128 of the pickle encoding. 16-byte hashes.
	XXHash
	// XXHashCBOR is "xxhash_cbor": XXH3-128 of the canonical CBOR
	// encoding. 16-byte hashes.
	XXHashCBOR
)

var algorithmNames = [...]string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}

// String returns vLLM's name for the algorithm.
func (a Algorithm) String() string {
	if a < 0 || int(a) >= len(algorithmNames) {
		return fmt.Sprintf("Algorithm(%d)", int(a))
	}
	return algorithmNames[a]
}

// ParseAlgorithm returns the algorithm vLLM calls name. An unknown name is
// an error matching [ErrInvalid].
func ParseAlgorithm(name string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if n == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown hash algorithm %q (want sha256, sha256_cbor, xxhash or xxhash_cbor)", ErrInvalid, name)
}

// Size returns the length in bytes of the algorithm's hashes: 32 for the
// SHA-256 algorithms, 16 for the xxHash ones, 0 for an invalid algorithm.
func (a Algorithm) Size() int {
	switch a {
	case SHA256, SHA256CBOR:
		return sha256.Size
	case XXHash, XXHashCBOR:
		return 16
	}
	return 0
}

func (a Algorithm) valid() bool { return a.Size() != 0 }

func (a Algorithm) usesCBOR() bool { return a == SHA256CBOR || a == XXHashCBOR }

// digest appends the hash of data to dst.
func (a Algorithm) digest(dst, data []byte) []byte {
	if a == SHA256 || a == SHA256CBOR {
		sum := sha256.Sum256(data)
		return append(dst, sum[:]...)
	}
	sum := xxh3.Hash128(data).Bytes() // big-endian, as xxhash's xxh3_128_digest
	return append(dst, sum[:]...)
}

// cborMode encodes as cbor2.dumps(value, canonical=True) does for the
// values vLLM hashes: tuples as definite-length arrays, bytes as byte
// strings, str as text strings, ints in their shortest form, None as null.
var cborMode = func() cbor.UserBufferEncMode {
	m, err := cbor.CanonicalEncOptions().UserBufferEncMode()
	if err != nil {
		panic(err)
	}
	return m
}()

// Hasher computes block hashes with one algorithm and seed. It is
// immutable and safe for concurrent use.
type Hasher struct {
	alg  Algorithm
	root []byte
}

// NewHasher returns a hasher for the algorithm and the engines'
// PYTHONHASHSEED, which vLLM hashes, as a str, into NONE_HASH, the parent of
// every request's first block. An empty seed is refused with [ErrEmptySeed];
// an invalid algorithm with an error matching [ErrInvalid].
func NewHasher(alg Algorithm, seed string) (*Hasher, error) {
	if !alg.valid() {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, alg)
	}
	if seed == "" {
		return nil, ErrEmptySeed
	}
	if !utf8.ValidString(seed) {
		return nil, fmt.Errorf("%w: seed %q is not valid UTF-8", ErrInvalid, seed)
	}
	var enc []byte
	if alg.usesCBOR() {
		var buf bytes.Buffer
		if err := cborMode.MarshalToBuffer(seed, &buf); err != nil {
			return nil, fmt.Errorf("vllmhash: encoding the seed: %w", err)
		}
		enc = buf.Bytes()
	} else {
		var p pickler
		p.begin()
		p.saveStr(seed)
		enc = p.end()
	}
	return &Hasher{alg: alg, root: alg.digest(nil, enc)}, nil
}

// Algorithm returns the hasher's algorithm.
func (h *Hasher) Algorithm() Algorithm { return h.alg }

// Root returns NONE_HASH, the parent hash of every request's first block.
// The caller must not modify it.
func (h *Hasher) Root() []byte { return h.root }

// Hash returns the hashes of every full block of tokens, blockSize tokens a
// block; a partial last block is not hashed. It is NewChain, Append and
// the chain's hashes, copied out.
func (h *Hasher) Hash(blockSize int, tokens []int32, extra ExtraKeys) ([][]byte, error) {
	c, err := h.NewChain(blockSize, extra)
	if err != nil {
		return nil, err
	}
	c.Append(tokens)
	out := make([][]byte, c.Len())
	flat := append([]byte(nil), c.hashes...)
	size := h.alg.Size()
	for i := range out {
		out[i] = flat[i*size : (i+1)*size : (i+1)*size]
	}
	return out, nil
}

// MultimodalItem is one multimodal input (image, audio, ...) of a request:
// its placeholder tokens are tokens [Offset, Offset+Length) of the prompt.
type MultimodalItem struct {
	// Identifier is vLLM's identifier for the item (its mm_hash, or the
	// UUID the client gave).
	Identifier string
	// Offset is the position of the item's first placeholder token.
	Offset int
	// Length is the number of placeholder tokens; it must be positive.
	Length int
}

// ExtraKeys is what besides its tokens vLLM puts in a request's block
// hashes. The zero value is a plain text request.
type ExtraKeys struct {
	// LoRAName is the request's LoRA adapter name (lora_request.lora_name),
	// hashed into every block; empty means no adapter.
	LoRAName string
	// CacheSalt is the request's cache_salt, hashed into its first block
	// only; empty means none (vLLM ignores an empty salt too).
	CacheSalt string
	// Multimodal lists the request's multimodal items, in increasing
	// Offset, as vLLM requires.
	Multimodal []MultimodalItem
	// PromptEmbeds says the request carries prompt embeddings; such a
	// request is refused with [ErrPromptEmbeds].
	PromptEmbeds bool
}

func (e *ExtraKeys) validate() error {
	if e.PromptEmbeds {
		return ErrPromptEmbeds
	}
	if !utf8.ValidString(e.LoRAName) {
		return fmt.Errorf("%w: LoRA name %q is not valid UTF-8", ErrInvalid, e.LoRAName)
	}
	if !utf8.ValidString(e.CacheSalt) {
		return fmt.Errorf("%w: cache salt %q is not valid UTF-8", ErrInvalid, e.CacheSalt)
	}
	for i, m := range e.Multimodal {
		switch {
		case !utf8.ValidString(m.Identifier):
			return fmt.Errorf("%w: multimodal item %d: identifier %q is not valid UTF-8", ErrInvalid, i, m.Identifier)
		case m.Offset < 0 || m.Length <= 0:
			return fmt.Errorf("%w: multimodal item %d: offset %d, length %d", ErrInvalid, i, m.Offset, m.Length)
		case i > 0 && m.Offset < e.Multimodal[i-1].Offset:
			return fmt.Errorf("%w: multimodal item %d: offset %d before item %d's %d (items must be in increasing offset)",
				ErrInvalid, i, m.Offset, i-1, e.Multimodal[i-1].Offset)
		}
	}
	return nil
}
