#!/usr/bin/env python3
"""Golden vectors and a speed reference for umbp/vllmhash.

Computes vLLM's prefix-cache block hashes the way vLLM 0.22 does
(vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens,
generate_block_hash_extra_keys; vllm/utils/hashing.py: sha256, sha256_cbor,
xxhash, xxhash_cbor), using CPython's own pickle, cbor2 and xxhash as the
encoders, so the Go package is checked against the real libraries.

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

OUT = Path(__file__).resolve().parent.parent / "umbp/vllmhash/testdata/generated_vectors.json"


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
            mm = [(expand(i), o, n) for i, o, n in c.get("mm", [])]
            hashes, first = chain(alg, c["seed"], c["block_size"], expand(c["tokens"]),
                                  lora=expand(c.get("lora", "")), salt=expand(c.get("salt")), mm=mm)
            entry = dict(c, algorithm=alg, hashes=[h.hex() for h in hashes])
            if first is not None and len(first) <= 4096:
                entry["first_encoding"] = first.hex()
            elif first is not None:
                entry["first_encoding_sha256"] = hashlib.sha256(first).hexdigest()
            result["cases"].append(entry)
    OUT.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(result['cases'])} cases)")


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
