// Package vllmhash computes vLLM's prefix-cache block hashes from token IDs,
// byte for byte as vLLM does, so that a Go scheduler can name the KV blocks a
// vLLM engine stores without running Python.
//
// vLLM hashes a request's tokens in blocks of hash_block_size tokens, each
// block chained to the one before:
//
//	h[0]   = H((NONE_HASH, tuple(block 0 tokens), extra_keys(0)))
//	h[i]   = H((h[i-1],    tuple(block i tokens), extra_keys(i)))
//	NONE_HASH = H(PYTHONHASHSEED)
//
// where H is the engine's --prefix-caching-hash-algo (see [Algorithm]) and
// extra_keys is None or a tuple of the request's LoRA name (every block), a
// (multimodal identifier, offset in block) pair for each multimodal item the
// block overlaps, and the cache salt (first block only), in that order (see
// [ExtraKeys]). Only full blocks are hashed.
//
// A request's prompt is hashed when vLLM creates the request; each token it
// generates is then appended and hashes the block it completes, through
// vLLM's request block hasher, which in vLLM 0.22 looks at the last
// multimodal item only for every block but the first (see
// [Chain.AppendGenerated]).
//
// The recipe is vLLM v1's (vllm/v1/core/kv_cache_utils.py hash_block_tokens,
// generate_block_hash_extra_keys, get_request_block_hasher and
// init_none_hash; vllm/v1/request.py; vllm/utils/hashing.py) as in vLLM
// 0.22: the golden vectors in testdata come from fixtures made with vLLM
// 0.22.0's recipe and from CPython's pickle, cbor2 and xxhash. Older vLLM
// releases that hashed a multimodal item without its offset in the block
// differ for multimodal requests; the msgpack algorithms of later releases
// are not supported.
//
// The pickle encoding is CPython's for the objects vLLM's engine core
// process hashes, memo included: equal strings of one Latin-1 character
// (or none) are one object there, so a repeat is pickled as a memo lookup,
// and any other strings are distinct objects (see the pickler's comment
// in pickle.go).
//
// A [Hasher] holds the algorithm and the root; a [Chain] hashes one
// request's tokens incrementally, block by block, without allocating once
// its buffers have grown.
package vllmhash
