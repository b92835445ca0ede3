package main

import (
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestVLLMAlgorithmsEndToEnd: engines under every vLLM hash algorithm and
// root (docs/hashing.md#vllm-algorithms) are registered over the HTTP API,
// publish over real ZMQ sockets (integers, or raw digests of their
// algorithm's size), and their blocks are found by /query; /services and
// /global_view report each root in hex of its size, and /query_by_hash
// finds the blocks by the hashes the engines published. An xxhash engine
// without PYTHONHASHSEED cannot be registered, and the answer says why.
func TestVLLMAlgorithmsEndToEnd(t *testing.T) {
	e := startApp(t)
	cases := []struct {
		instance, model, alg, seed, root string
		bin                              bool
	}{
		{"d0", "m-default", "sha256", "vllm-none-hash", "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198", false},
		{"d1", "m-cbor-unset", "sha256_cbor", "vllm-none-hash", "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0", true},
		{"x0", "m-xxhash", "xxhash", "0", "6fb31cc38bba6066183f7f2104b9c051", true},
		{"x1", "m-xxhash-cbor", "xxhash_cbor", "42", "a9d2e63407fce1a26c9dc9d7fa2d7caf", false},
	}
	tokens := make([]int32, 48)
	for i := range tokens {
		tokens[i] = int32(1000 + i)
	}
	for _, c := range cases {
		pub := newPublisher(t)
		reg := map[string]any{
			"endpoint": pub.endpoint, "type": "vLLM", "modelname": c.model, "instance_id": c.instance,
			"block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": c.alg, "python_hash_seed": c.seed, "index_projection": "low64_be"},
		}
		if status, out := e.post("/register", reg); status != 200 {
			t.Fatalf("%s: register: %d %v", c.alg, status, out)
		}
		seed := c.seed
		prof, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: c.alg, IndexProjection: "low64_be", PythonHashSeed: &seed})
		if err != nil {
			t.Fatal(err)
		}
		var hashes []any
		ch := hashing.AcquireChain()
		ch.Reset(&prof, 16, tokens, "", "")
		for {
			k, _, ok := ch.Next()
			if !ok {
				break
			}
			d := ch.Digest()
			if c.bin {
				hashes = append(hashes, append([]byte(nil), prof.DigestBytes(&d)...))
			} else {
				hashes = append(hashes, k)
			}
		}
		hashing.ReleaseChain(ch)
		stored := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
			"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
		eventtest.Eventually(t, c.alg+" blocks found", func() bool {
			pub.send(0, stored)
			status, out := e.post("/query", map[string]any{"model": c.model, "block_size": 16, "token_ids": tokens, "instance_id": c.instance})
			if status != 200 {
				t.Fatalf("%s: query: %d %v", c.alg, status, out)
			}
			in, _ := out["instances"].(map[string]any)[c.instance].(map[string]any)
			v, _ := msgpackInt(in["device"])
			return v == 48
		})
		// The engine's own hashes, as it published them, find the same
		// blocks through /query_by_hash.
		status, out := e.post("/query_by_hash", map[string]any{"model": c.model, "block_size": 16, "seq_hashes": hashes, "instance_id": c.instance})
		in, _ := out["instances"].(map[string]any)[c.instance].(map[string]any)
		if v, _ := msgpackInt(in["device"]); status != 200 || v != 48 {
			t.Errorf("%s: query_by_hash: %d %v", c.alg, status, out)
		}
	}
	roots := map[string]string{}
	for _, s := range e.get("/services")["services"].([]any) {
		svc := s.(map[string]any)
		hp := svc["HashProfile"].(map[string]any)
		roots[svc["InstanceID"].(string)] = hp["root_digest"].(string)
	}
	views := map[string]string{}
	for _, v := range e.get("/global_view")["contexts"].([]any) {
		cv := v.(map[string]any)
		views[cv["model_name"].(string)] = cv["hash_profile"].(map[string]any)["root_digest"].(string)
	}
	for _, c := range cases {
		if roots[c.instance] != c.root || views[c.model] != c.root {
			t.Errorf("%s/%s: root_digest %q in /services, %q in /global_view; want %q", c.alg, c.seed, roots[c.instance], views[c.model], c.root)
		}
	}
	for _, alg := range []string{"xxhash", "xxhash_cbor"} {
		reg := map[string]any{
			"endpoint": "tcp://127.0.0.1:1", "type": "vLLM", "modelname": "m", "instance_id": "bad", "block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": alg, "python_hash_seed": "vllm-none-hash", "index_projection": "low64_be"},
		}
		status, out := e.post("/register", reg)
		msg, _ := out["error"].(string)
		if status != 400 || out["reason"] != "invalid_value" || out["field"] != "python_hash_seed" ||
			!strings.Contains(msg, "random root per process") || !strings.Contains(msg, "set PYTHONHASHSEED") {
			t.Errorf("%s with vllm-none-hash: %d %v", alg, status, out)
		}
	}
	if svcs := e.get("/services"); len(svcs["services"].([]any)) != len(cases) {
		t.Errorf("a refused registration changed the services: %v", svcs)
	}
}
