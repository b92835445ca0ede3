#!/usr/bin/env python3
"""Register a publisher with conductor, publish one vLLM-shaped KV event
over ZMQ, and query the prompt back.

It is what an engine integration does, in about a hundred lines, with only
Debian's python3-msgpack and python3-zmq besides the standard library:

1. bind a ZMQ PUB socket, as vLLM's publisher does;
2. POST /register (MessagePack) naming that endpoint and the hash profile;
3. publish a BlockStored event whose block hashes are computed exactly as
   vLLM computes them with --prefix-caching-hash-algo sha256 and
   PYTHONHASHSEED=0 (pickle protocol 5, SHA-256, chained on full digests,
   the last 8 bytes as the published integer; docs/hashing.md);
4. POST /query with the prompt's token ids until the instance reports the
   blocks cached on the device tier;
5. POST /unregister.

Usage:
    python3 publish_and_query.py --server http://127.0.0.1:13333 [--token-file F]

It exits 0 when the query reports every published block as cached, 1
otherwise. The test suite runs it against the real binary
(examples_test.go), so it keeps working.
"""

import argparse
import hashlib
import json
import pickle
import struct
import sys
import time
import urllib.error
import urllib.request

import msgpack
import zmq

BLOCK_SIZE = 16
SEED = "0"  # the engine's PYTHONHASHSEED, as text


def vllm_block_hashes(tokens, seed=SEED, block_size=BLOCK_SIZE):
    """The published integers of a prompt's full blocks, as vLLM's sha256
    algorithm computes them: each block hashes (parent digest, token tuple,
    extra keys) with pickle protocol 5; the chain starts from the hash of
    the seed's text; the event carries the digest's last 8 bytes."""

    def sha256(value):
        return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()

    parent = sha256(seed)
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = sha256((parent, tuple(tokens[start:start + block_size]), None))
        out.append(int.from_bytes(parent[24:], "big"))
    return out


def call(server, path, body, token=None):
    """POSTs body as MessagePack; returns (status, decoded answer). Errors
    are asked for in JSON, so reason and field read plainly."""
    req = urllib.request.Request(server.rstrip("/") + path, data=msgpack.packb(body), method="POST")
    req.add_header("Content-Type", "application/msgpack")
    req.add_header("Accept", "application/msgpack, application/json;q=0.5")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, msgpack.unpackb(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        if "json" in e.headers.get("Content-Type", ""):
            return e.code, json.loads(raw)
        return e.code, msgpack.unpackb(raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="http://127.0.0.1:13333", help="conductor base URL")
    ap.add_argument("--token-file", help="bearer token file of a server run with --auth-token-file")
    ap.add_argument("--instance-id", default="python-example-0")
    ap.add_argument("--model", default="example-model")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the blocks to show")
    args = ap.parse_args()
    token = open(args.token_file).read().strip() if args.token_file else None

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    endpoint = "tcp://127.0.0.1:%d" % port

    registration = {
        "endpoint": endpoint, "type": "vLLM", "modelname": args.model,
        "instance_id": args.instance_id, "block_size": BLOCK_SIZE, "dp_rank": 0,
        "hash_profile": {"strategy": "vllm_v1", "algorithm": "sha256",
                         "python_hash_seed": SEED, "index_projection": "low64_be"},
    }
    status, answer = call(args.server, "/register", registration, token)
    print("register:", status, answer)
    if status != 200:
        return 1

    tokens = list(range(1000, 1000 + 3 * BLOCK_SIZE))  # three full blocks
    hashes = vllm_block_hashes(tokens)
    # A BlockStored as current vLLM encodes it: a map tagged by "type".
    # extra_keys has one entry per block (None: no extra keys), which is
    # what lets conductor's ingest hash check re-hash the blocks.
    stored = {
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
        "token_ids": tokens, "block_size": BLOCK_SIZE, "lora_id": None,
        "medium": "GPU", "lora_name": None, "extra_keys": [None] * len(hashes),
    }
    query = {"model": args.model, "block_size": BLOCK_SIZE, "token_ids": tokens}
    seq = 0
    found = {}
    deadline = time.monotonic() + args.timeout
    try:
        # A PUB socket drops what it sends before the subscriber has
        # connected, so resend (each batch with the next sequence number)
        # until the blocks show; re-storing a stored block changes nothing.
        while time.monotonic() < deadline:
            batch = msgpack.packb([time.time(), [stored], 0])  # [ts, events, data_parallel_rank]
            pub.send_multipart([b"kv-events", struct.pack(">Q", seq), batch])
            seq += 1
            status, answer = call(args.server, "/query", query)
            found = answer.get("instances", {}).get(args.instance_id, {}) if status == 200 else {}
            if found.get("device", 0) == len(tokens):
                break
            time.sleep(0.2)
        print("query:", status, found)
        ok = found.get("device", 0) == len(tokens) and found.get("longest_matched", 0) == len(tokens)
    finally:
        status, answer = call(args.server, "/unregister", {"instance_id": args.instance_id, "dp_rank": 0}, token)
        print("unregister:", status, answer)
        pub.close(linger=0)
        ctx.term()
    return 0 if ok and status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
