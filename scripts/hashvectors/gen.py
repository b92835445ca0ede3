#!/usr/bin/env python3
"""Golden vectors for every vLLM hash algorithm and root (docs/hashing.md).

Writes testdata/hashing/vllm_algorithms.json: vLLM's block chain computed
the way vLLM computes it, with CPython's own pickle, cbor2 and the xxhash
module, for the four --prefix-caching-hash-algo values and the roots a
registration can name ("0", "42", "random", and "vllm-none-hash" for the
SHA-256 algorithms). internal/hashing/vllm_algorithms_test.go recomputes
every case with the conductor's chain and compares the whole file.

Run from the repository root with the Debian interpreter, which has the
modules (python3-cbor2, python3-xxhash):

    /usr/bin/python3 scripts/hashvectors/gen.py

The output is deterministic; a change in it is a change in what vLLM (or
one of these modules) computes, to be understood before it is committed.
"""

import hashlib
import json
import os
import pickle
import sys

import cbor2
import xxhash

ALGORITHMS = {
    # name: (serializer, digest function)
    "sha256": (lambda v: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL),
               lambda b: hashlib.sha256(b).digest()),
    "sha256_cbor": (lambda v: cbor2.dumps(v, canonical=True),
                    lambda b: hashlib.sha256(b).digest()),
    "xxhash": (lambda v: pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL),
               xxhash.xxh3_128_digest),
    "xxhash_cbor": (lambda v: cbor2.dumps(v, canonical=True),
                    xxhash.xxh3_128_digest),
}

# The seed texts a registration may name. "random" is hashed as the text
# it is (vLLM hashes PYTHONHASHSEED's text), so its root is reproducible.
# "vllm-none-hash" is vLLM's root text when PYTHONHASHSEED is unset, for
# the SHA-256 algorithms only: xxhash engines then draw a random root.
SEEDS = ["0", "42", "random", "vllm-none-hash"]


def seeds_of(alg):
    return [s for s in SEEDS if not (s == "vllm-none-hash" and alg.startswith("xxhash"))]


def chain(alg, seed, block_size, tokens, lora, salt):
    """vLLM's hash_block_tokens over full blocks, extra keys as
    generate_block_hash_extra_keys builds them for a LoRA name (every
    block) and a cache salt (the first block only)."""
    ser, dig = ALGORITHMS[alg]
    parent = dig(ser(seed))
    blocks = []
    lora_obj = lora or None
    salt_obj = salt or None
    for i in range(len(tokens) // block_size):
        extra = []
        if lora_obj:
            extra.append(lora_obj)
        if salt_obj and i == 0:
            extra.append(salt_obj)
        value = (parent, tuple(tokens[i * block_size:(i + 1) * block_size]),
                 tuple(extra) if extra else None)
        data = ser(value)
        d = dig(data)
        key = int.from_bytes(d, "big") & ((1 << 64) - 1)
        blocks.append({
            "index": i,
            "span": [i * block_size, (i + 1) * block_size],
            "covered": block_size,
            "input_hex": data.hex(),
            "digest": d.hex(),
            "projected": str(key),
            "projected_hex": "%016x" % key,
            "wire_int": str(key),
        })
        parent = d
    return blocks


def edge_tokens():
    # CBOR and pickle integer widths on both sides of each threshold.
    return [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, -1, -24, -25,
            -256, -257, -65536, -65537, -2**31, 7, 8, 9]


PROMPTS = [
    # id, block size, tokens, lora, salt
    ("tokens1-32", 16, list(range(1, 33)), None, None),
    ("lora-salt", 16, list(range(1, 54)), "adapter-A", "tenant-salt"),
    ("salt-only", 4, edge_tokens(), None, "tenant-salt"),
    ("lora-only-bs1", 1, [5, 6, 7], "adapter-A", None),
    ("memo-alias", 4, list(range(100, 112)), "a", "a"),
    ("utf8-names", 8, list(range(1000, 1024)), "adaptér-ü", "租户-salt"),
    ("bs64-multi", 64, [(i * 7919) % 151936 for i in range(200)], "L", "s"),
    ("short", 16, list(range(1, 16)), None, None),
]


def cbor_version():
    try:
        from importlib.metadata import version
        return version("cbor2")
    except Exception:  # noqa: BLE001 - the version is informative only
        return "unknown"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_path = os.path.join(root, "testdata", "hashing", "vllm_algorithms.json")
    seed_roots = []
    cases = []
    for alg in ALGORITHMS:
        ser, dig = ALGORITHMS[alg]
        for seed in seeds_of(alg):
            seed_roots.append({
                "strategy": "vllm_v1",
                "algorithm": alg,
                "python_hash_seed": seed,
                "root_input_hex": ser(seed).hex(),
                "root_digest": dig(ser(seed)).hex(),
            })
            for pid, bs, toks, lora, salt in PROMPTS:
                cases.append({
                    "id": "%s/%s/%s" % (alg, seed, pid),
                    "profile": {
                        "strategy": "vllm_v1",
                        "algorithm": alg,
                        "index_projection": "low64_be",
                        "python_hash_seed": seed,
                    },
                    "root_digest": dig(ser(seed)).hex(),
                    "block_size": bs,
                    "lora_name": lora,
                    "cache_salt": salt,
                    "token_ids": toks,
                    "token_count": len(toks),
                    "expected": chain(alg, seed, bs, toks, lora, salt),
                })
    doc = {
        "format": "conductor-hash-vectors",
        "version": 1,
        "generator": "scripts/hashvectors/gen.py",
        "produced_with": "CPython %d.%d pickle protocol %d, cbor2 %s, xxhash %s (libxxhash %s)" % (
            sys.version_info[0], sys.version_info[1], pickle.HIGHEST_PROTOCOL,
            cbor_version(), xxhash.VERSION, xxhash.XXHASH_VERSION),
        "case_count": len(cases),
        "seed_roots": seed_roots,
        "cases": cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote %d cases, %d roots to %s" % (len(cases), len(seed_roots), out_path))


if __name__ == "__main__":
    main()
