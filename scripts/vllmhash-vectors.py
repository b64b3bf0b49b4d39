#!/usr/bin/env python3
"""Golden vectors and a speed reference for umbp/vllmhash.

Computes vLLM's prefix-cache block hashes the way vLLM 0.22 does
(vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens,
generate_block_hash_extra_keys, get_request_block_hasher;
vllm/v1/request.py: a request hashes its prompt when it is made, then each
generated token as the scheduler appends it; vllm/utils/hashing.py: sha256,
sha256_cbor, xxhash, xxhash_cbor), using CPython's own pickle, cbor2 and
xxhash as the encoders, so the Go package is checked against the real
libraries.

Writes testdata/generated_vectors.json (prompts) and
testdata/request_vectors.json (prompts followed by generated tokens, and
extra keys that repeat a string CPython shares).

    /usr/bin/python3 scripts/vllmhash-vectors.py            # rewrite the vectors
    /usr/bin/python3 scripts/vllmhash-vectors.py --bench    # Python vs Go speed

Needs cbor2 and xxhash (Debian: python3-cbor2 python3-xxhash). The bench
also runs `go test -bench` on umbp/vllmhash and prints both, with the ratio.
"""

import hashlib
import json
import pickle
import platform
import random
import re
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import cbor2
import xxhash

TESTDATA = Path(__file__).resolve().parent.parent / "umbp/vllmhash/testdata"
OUT = TESTDATA / "generated_vectors.json"
REQUEST_OUT = TESTDATA / "request_vectors.json"


def enc_pickle(value):
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def enc_cbor(value):
    return cbor2.dumps(value, canonical=True)


ALGORITHMS = {
    "sha256": lambda v: hashlib.sha256(enc_pickle(v)).digest(),
    "sha256_cbor": lambda v: hashlib.sha256(enc_cbor(v)).digest(),
    "xxhash": lambda v: xxhash.xxh3_128_digest(enc_pickle(v)),
    "xxhash_cbor": lambda v: xxhash.xxh3_128_digest(enc_cbor(v)),
}
ENCODERS = {"sha256": enc_pickle, "sha256_cbor": enc_cbor, "xxhash": enc_pickle, "xxhash_cbor": enc_cbor}


def wire(s):
    """s as vLLM's engine core process holds it.

    The LoRA name, cache salt and multimodal identifiers reach the engine
    core in the request's msgpack, and msgspec decodes each string with
    PyUnicode_DecodeUTF8: a new object per field, except the empty string
    and one-character strings up to U+00FF, which are CPython's cached
    singletons. Decoding UTF-8 here makes the same objects, so pickle's memo
    sees what it sees in vLLM (literals in this file could be shared
    constants instead).
    """
    if s is None:
        return None
    return s.encode("utf-8").decode("utf-8")


def extra_keys(lora, salt, mm, start, end, mm_next):
    """The extra keys of the block [start, end) and the next multimodal index."""
    keys = []
    if lora:
        keys.append(lora)
    i = mm_next
    while i < len(mm):
        ident, offset, length = mm[i]
        if end <= offset:
            break
        if start >= offset + length:
            i += 1
            continue
        keys.append((ident, offset - start))
        if end < offset + length:
            break
        i += 1
    if start == 0 and salt:
        keys.append(salt)
    return (tuple(keys) if keys else None), i


def chain(alg, seed, block_size, tokens, lora="", salt=None, mm=()):
    fn = ALGORITHMS[alg]
    parent = fn(seed)
    hashes, first = [], None
    mm_next = 0
    for b in range(len(tokens) // block_size):
        start, end = b * block_size, (b + 1) * block_size
        extra, mm_next = extra_keys(lora, salt, list(mm), start, end, mm_next)
        value = (parent, tuple(tokens[start:end]), extra)
        if first is None:
            first = ENCODERS[alg](value)
        parent = fn(value)
        hashes.append(parent)
    return hashes, first


class Request:
    """What vLLM's request block hasher reads of a vllm.v1.request.Request.

    As in vLLM, the request hashes its prompt's full blocks when it is
    made, and every generated token the scheduler appends (one at a time,
    Scheduler._update_request_with_output) hashes the blocks it completes.
    """

    def __init__(self, prompt, lora, salt, mm, hasher):
        self.all_token_ids = list(prompt)
        self.lora_name = lora or None  # lora_request.lora_name; None without an adapter
        self.cache_salt = salt
        self.mm = mm  # (identifier, offset, length), sorted by offset
        self.hasher = hasher
        self.block_hashes = []
        self.block_hashes.extend(hasher(self))

    def append_output_token(self, token):
        self.all_token_ids.append(token)
        self.block_hashes.extend(self.hasher(self))


def request_extra_keys(req, start, end, mm_idx):
    """The block [start, end)'s extra keys and the next multimodal index, as
    generate_block_hash_extra_keys gives them; mm_idx -1 is the last item."""
    mm_keys = []
    if req.mm and req.mm[-1][1] + req.mm[-1][2] > start:
        i = len(req.mm) + mm_idx if mm_idx < 0 else mm_idx
        while i < len(req.mm):
            ident, offset, length = req.mm[i]
            if end <= offset:
                break  # not reached yet
            if start >= offset + length:
                i += 1  # passed
                continue
            mm_keys.append((ident, offset - start))
            if end < offset + length:
                break  # goes on into the next block
            i += 1
        mm_idx = i
    keys = [req.lora_name] if req.lora_name is not None else []
    keys += mm_keys
    if start == 0 and req.cache_salt:
        keys.append(req.cache_salt)
    return (tuple(keys) if keys else None), mm_idx


def request_block_hasher(block_size, fn, root, values):
    """The hasher get_request_block_hasher returns: it hashes the blocks a
    request has completed since its last call. A call that starts past the
    first block starts its multimodal scan at the last item (vLLM reaches it
    only for blocks that generated tokens complete). values collects every
    hashed (parent, tokens, extra_keys)."""

    def hasher(req):
        start = len(req.block_hashes) * block_size
        mm_idx = -1 if start > 0 else 0
        parent = req.block_hashes[-1] if req.block_hashes else root
        new = []
        while start + block_size <= len(req.all_token_ids):
            end = start + block_size
            extra, mm_idx = request_extra_keys(req, start, end, mm_idx)
            value = (parent, tuple(req.all_token_ids[start:end]), extra)
            values.append(value)
            parent = fn(value)
            new.append(parent)
            start = end
        return new

    return hasher


def request_chain(alg, seed, block_size, prompt, generated, lora="", salt=None, mm=()):
    """A request's block_hashes after its prompt and then each generated
    token; also how many blocks the prompt filled, and the hashed values."""
    fn = ALGORITHMS[alg]
    values = []
    req = Request(prompt, lora, salt, list(mm), request_block_hasher(block_size, fn, fn(seed), values))
    prompt_blocks = len(req.block_hashes)
    for t in generated:
        req.append_output_token(t)
    return req.block_hashes, prompt_blocks, values


def expand(spec):
    """A token list or string: given as is, or {"cycle": x, "count": n}."""
    if isinstance(spec, dict):
        c, n = spec["cycle"], spec["count"]
        if isinstance(c, str):
            return (c * (n // len(c) + 1))[:n]
        return [c[i % len(c)] for i in range(n)]
    return spec


def cases():
    rnd = random.Random(20261130)
    big = [rnd.randrange(0, 152064) for _ in range(70)]
    out = []
    seeds = ["0", "42", "random", "4294967295", "00"]
    for bs in (1, 2, 3, 4, 16, 17):
        out.append(dict(name=f"plain_bs{bs}", block_size=bs, tokens=big[: bs * 3 + 1]))
    out.append(dict(name="int_boundaries", block_size=4,
                    tokens=[0, 255, 256, 65535, 65536, 2**31 - 1, 151935, 1]))
    out.append(dict(name="lora_every_block", block_size=16, tokens=big[:48], lora="adapter-A"))
    out.append(dict(name="salt_first_block", block_size=16, tokens=big[:40], salt="tenant-salt"))
    out.append(dict(name="lora_mm_salt", block_size=16, tokens=big[:64], lora="sql-lora", salt="s1",
                    mm=[["img-a", 5, 20], ["img-b", 40, 3], ["img-c", 43, 30]]))
    out.append(dict(name="mm_spans_blocks", block_size=4, tokens=big[:24],
                    mm=[["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", 1, 14]]))
    out.append(dict(name="mm_at_block_starts", block_size=8, tokens=big[:32],
                    mm=[["a", 0, 8], ["b", 8, 1], ["c", 9, 2], ["d", 11, 5], ["e", 24, 8]]))
    out.append(dict(name="mm_partial_tail", block_size=8, tokens=big[:20], mm=[["tail", 12, 8]]))
    out.append(dict(name="utf8", block_size=4, tokens=big[:8], lora="模型-适配器", salt="盐值-🚀",
                    mm=[["ид-😀", 2, 3]]))
    out.append(dict(name="str_255", block_size=4, tokens=big[:4], lora="a" * 255, salt="s" * 255))
    out.append(dict(name="str_256", block_size=4, tokens=big[:4], lora="a" * 256, salt="s" * 256))
    # Pickle framing: a frame closes at the first save() after it reaches
    # 64 KiB; payloads of 64 KiB or more go out unframed.
    for n in (13098, 13099, 13100, 13101, 13106, 26210):
        out.append(dict(name=f"frame_binint_{n}", block_size=n, tokens={"cycle": [70000], "count": n}))
    for n in (21832, 21833, 21834):
        out.append(dict(name=f"frame_binint2_{n}", block_size=n, tokens={"cycle": [256, 300], "count": n * 2}))
    for n in (65535, 65536, 70000):
        out.append(dict(name=f"large_lora_{n}", block_size=4, tokens=big[:8], lora={"cycle": "l", "count": n}))
    out.append(dict(name="large_salt_and_mm", block_size=2, tokens=big[:6], salt={"cycle": "xy", "count": 65536},
                    mm=[[{"cycle": "m", "count": 70000}, 1, 2]]))
    out.append(dict(name="frame_then_large_str", block_size=13000, tokens={"cycle": [70000, 1], "count": 13000},
                    lora={"cycle": "q", "count": 66000}))
    # Multimodal offsets reach the pickle's and CBOR's larger integer forms.
    out.append(dict(name="mm_large_offset", block_size=66000, tokens={"cycle": [7], "count": 66000},
                    mm=[["far", 65999, 1]]))
    out.append(dict(name="mm_large_negative_offset", block_size=65536, tokens={"cycle": [8, 9], "count": 131072},
                    mm=[["long", 0, 131072]]))
    for i, c in enumerate(out):
        c["seed"] = seeds[i % len(seeds)]
    return out


def request_cases():
    """Prompts followed by generated tokens, and strings CPython shares."""
    rnd = random.Random(20261201)
    big = [rnd.randrange(0, 152064) for _ in range(80)]
    out = []
    seeds = ["0", "42", "random", "4294967295", "00"]
    # Blocks that generated tokens complete.
    out.append(dict(name="decode_plain", block_size=16, prompt=big[:40], generated=big[40:75]))
    out.append(dict(name="decode_bs1", block_size=1, prompt=big[:3], generated=big[3:8], lora="L",
                    mm=[["img", 1, 2]]))
    out.append(dict(name="decode_first_block", block_size=16, prompt=big[:10], generated=big[10:40],
                    lora="adapter", salt="salt", mm=[["a", 2, 3], ["b", 6, 2]]))
    out.append(dict(name="decode_two_items_in_block", block_size=8, prompt=big[:14], generated=big[14:30],
                    mm=[["a", 10, 1], ["b", 12, 1]]))
    out.append(dict(name="decode_item_spans_into_block", block_size=8, prompt=big[:20], generated=big[20:36],
                    mm=[["a", 3, 2], ["b", 6, 11], ["c", 17, 2]]))
    out.append(dict(name="decode_last_item_spans_block", block_size=8, prompt=big[:20], generated=big[20:28],
                    mm=[["v", 4, 15]]))
    out.append(dict(name="decode_lora_mm_salt", block_size=4, prompt=big[:18], generated=big[18:40],
                    lora="sql-lora", salt="s1", mm=[["img-a", 1, 3], ["img-b", 9, 8], ["img-c", 17, 1]]))
    out.append(dict(name="decode_shared_strings", block_size=4, prompt=big[:6], generated=big[6:14],
                    lora="a", salt="a", mm=[["x", 1, 1], ["a", 4, 1], ["a", 5, 1]]))
    out.append(dict(name="decode_bs3000", block_size=3000, prompt={"cycle": big[:7], "count": 4500},
                    generated={"cycle": big[7:12], "count": 1600},
                    mm=[["i0", 2990, 20], ["i1", 4000, 100], ["i2", 4400, 90]]))
    out.append(dict(name="decode_bs20000", block_size=20000, prompt={"cycle": [70000, 3], "count": 30000},
                    generated={"cycle": [5], "count": 10000}, lora="l", salt="l",
                    mm=[["big", 19990, 9000], ["tail", 29000, 1000]]))
    # Equal strings: CPython shares the empty string and one-character
    # strings up to U+00FF, and pickles a repeat as a memo lookup.
    out.append(dict(name="shared_lora_salt", block_size=4, prompt=big[:8], lora="a", salt="a"))
    out.append(dict(name="shared_latin1", block_size=4, prompt=big[:8], lora="é", salt="é", mm=[["é", 0, 1]]))
    out.append(dict(name="shared_nul_ff", block_size=4, prompt=big[:8], lora="\x00", salt="\xff",
                    mm=[["\xff", 1, 1], ["\x00", 2, 1]]))
    out.append(dict(name="not_shared_u0100", block_size=4, prompt=big[:8], lora="Ā", salt="Ā", mm=[["Ā", 0, 1]]))
    out.append(dict(name="not_shared_cjk", block_size=4, prompt=big[:8], lora="盐", salt="盐", mm=[["盐", 0, 1]]))
    out.append(dict(name="not_shared_two_chars", block_size=4, prompt=big[:8], lora="ab", salt="ab",
                    mm=[["ab", 0, 1], ["ab", 1, 1]]))
    out.append(dict(name="shared_mm_ids", block_size=4, prompt=big[:8], lora="y", salt="x",
                    mm=[["x", 0, 1], ["x", 1, 1], ["y", 2, 1], ["x", 3, 1], ["x", 5, 1]]))
    out.append(dict(name="shared_empty_ids", block_size=4, prompt=big[:8], salt="", mm=[["", 0, 1], ["", 2, 1]]))
    # The first repeat of a shared string at memo index 255 (BINGET) and
    # 256 (LONG_BINGET).
    many = [[f"id{i:03d}", i, 1] for i in range(127)]
    out.append(dict(name="memo_index_255", block_size=140, prompt={"cycle": big, "count": 140}, lora="lora",
                    salt="z", mm=many[:126] + [["z", 126, 1], ["z", 127, 1]]))
    out.append(dict(name="memo_index_256", block_size=140, prompt={"cycle": big, "count": 140},
                    salt="z", mm=many + [["z", 127, 1], ["z", 128, 1]]))
    # Lookups next to the 64 KiB frame target.
    for n in (13099, 13100, 13101, 13102):
        out.append(dict(name=f"shared_frame_{n}", block_size=n, prompt={"cycle": [70000], "count": n},
                        lora="a", salt="a", mm=[["a", 0, 1]]))
    for i, c in enumerate(out):
        c["seed"] = seeds[i % len(seeds)]
        c.setdefault("generated", [])
    return out


def encoding_fields(entry, key, enc):
    """Store enc in full when small, else its SHA-256."""
    if len(enc) <= 4096:
        entry[key] = enc.hex()
    else:
        entry[key + "_sha256"] = hashlib.sha256(enc).hexdigest()


def generate():
    result = {
        "description": "Block hashes for umbp/vllmhash, computed with vLLM 0.22's recipe over "
                       "CPython's pickle (protocol 5), cbor2 (canonical) and xxhash (xxh3_128).",
        "generator": "scripts/vllmhash-vectors.py",
        "python": platform.python_version(),
        "cbor2": version("cbor2"),
        "xxhash": f"python-xxhash {xxhash.VERSION}, libxxhash {xxhash.XXHASH_VERSION}",
        "roots": [],
        "cases": [],
    }
    for alg, fn in ALGORITHMS.items():
        for seed in ("0", "42", "random", "4294967295", "00", "种子"):
            result["roots"].append({"algorithm": alg, "seed": seed, "root": fn(seed).hex()})
    for alg in ALGORITHMS:
        for c in cases():
            mm = [(wire(expand(i)), o, n) for i, o, n in c.get("mm", [])]
            tokens, lora, salt = expand(c["tokens"]), wire(expand(c.get("lora", ""))), wire(expand(c.get("salt")))
            hashes, first = chain(alg, c["seed"], c["block_size"], tokens, lora=lora, salt=salt, mm=mm)
            # The request model gives the same for a prompt, and, without
            # multimodal items, for the same tokens partly generated.
            again, _, _ = request_chain(alg, c["seed"], c["block_size"], tokens, [], lora, salt, mm)
            assert again == hashes, c["name"]
            if not mm:
                half = len(tokens) // 2
                again, _, _ = request_chain(alg, c["seed"], c["block_size"], tokens[:half], tokens[half:], lora, salt)
                assert again == hashes, c["name"]
            entry = dict(c, algorithm=alg, hashes=[h.hex() for h in hashes])
            if first is not None and len(first) <= 4096:
                entry["first_encoding"] = first.hex()
            elif first is not None:
                entry["first_encoding_sha256"] = hashlib.sha256(first).hexdigest()
            result["cases"].append(entry)
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(result['cases'])} cases)")

    result = {
        "description": "Block hashes of vLLM 0.22 requests for umbp/vllmhash: the prompt's blocks hashed when "
                       "the request is made, then each generated token appended as the scheduler does "
                       "(get_request_block_hasher), over CPython's pickle (protocol 5), cbor2 (canonical) "
                       "and xxhash (xxh3_128), with every string decoded as the engine core decodes its "
                       "requests. prompt_blocks: the blocks the prompt filled; prompt_path_differs: the same "
                       "tokens hashed as one prompt give other hashes. first_encoding: block 0's encoded "
                       "value; generated_encoding: that of the first block generated tokens completed.",
        "generator": "scripts/vllmhash-vectors.py",
        "python": platform.python_version(),
        "cbor2": version("cbor2"),
        "xxhash": f"python-xxhash {xxhash.VERSION}, libxxhash {xxhash.XXHASH_VERSION}",
        "cases": [],
    }
    for alg in ALGORITHMS:
        for c in request_cases():
            mm = [(wire(expand(i)), o, n) for i, o, n in c.get("mm", [])]
            prompt, generated = expand(c["prompt"]), expand(c["generated"])
            lora, salt = wire(c.get("lora", "")), wire(c.get("salt"))
            hashes, prompt_blocks, values = request_chain(alg, c["seed"], c["block_size"], prompt, generated,
                                                          lora, salt, mm)
            as_prompt, _ = chain(alg, c["seed"], c["block_size"], prompt + generated, lora=lora, salt=salt, mm=mm)
            entry = dict(c, algorithm=alg, hashes=[h.hex() for h in hashes], prompt_blocks=prompt_blocks,
                         prompt_path_differs=as_prompt != hashes)
            if values:
                encoding_fields(entry, "first_encoding", ENCODERS[alg](values[0]))
            if len(values) > prompt_blocks:
                encoding_fields(entry, "generated_encoding", ENCODERS[alg](values[prompt_blocks]))
            result["cases"].append(entry)
    REQUEST_OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {REQUEST_OUT} ({len(result['cases'])} cases)")


def bench():
    """Hash a 32k-token prompt (2048 blocks of 16) per algorithm, as vLLM does."""
    rnd = random.Random(1)
    tokens = [rnd.randrange(0, 152064) for _ in range(32768)]
    py = {}
    for alg in ALGORITHMS:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            chain(alg, "0", 16, tokens)
            best = min(best, time.perf_counter() - t0)
        py[alg] = len(tokens) / best
    root = Path(__file__).resolve().parent.parent
    go = subprocess.run(
        ["go", "test", "-run", "^$", "-bench", "BenchmarkChain32k", "-benchmem", "-count", "1", "./umbp/vllmhash/"],
        cwd=root, capture_output=True, text=True, check=True).stdout
    print(f"python {platform.python_version()}, cbor2 {version('cbor2')}, xxhash {xxhash.VERSION}")
    print("| algorithm | Go ns/op | Go allocs/op | Go tokens/s | Python tokens/s | Go/Python |")
    print("|---|---|---|---|---|---|")
    for alg in ALGORITHMS:
        m = re.search(rf"BenchmarkChain32k/{alg}-\d+\s+\d+\s+(\d+) ns/op\s+([\d.]+) tokens/s\s+(\d+) B/op\s+(\d+) allocs/op", go)
        if not m:
            print(go, file=sys.stderr)
            raise SystemExit(f"no Go result for {alg}")
        ns, gts, allocs = int(m.group(1)), float(m.group(2)), int(m.group(4))
        print(f"| {alg} | {ns} | {allocs} | {gts:.3g} | {py[alg]:.3g} | {gts / py[alg]:.1f}x |")


if __name__ == "__main__":
    if "--bench" in sys.argv[1:]:
        bench()
    else:
        generate()
