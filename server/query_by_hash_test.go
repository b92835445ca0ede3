package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
	"pgregory.net/rapid"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// rawPost sends body to path and returns the status and the raw answer.
func (h *harness) rawPost(path string, body []byte, accept string) (int, []byte, string) {
	h.t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + h.addr + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/msgpack")
	if accept != "" {
		req.Header.Set(fasthttp.HeaderAccept, accept)
	}
	req.SetBody(body)
	if err := h.c.Do(req, resp); err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), string(resp.Header.ContentType())
}

var propertyProfiles = []map[string]any{
	{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "7", "index_projection": "low64_be"},
	{"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"},
	{"strategy": "rfc1527", "algorithm": "xxh3_64"},
	{"strategy": "rfc1527", "algorithm": "xxh3_64", "seed": "0"},
}

// TestQueryByHashEqualsQuery is the route's property
// (docs/api.md#post-query_by_hash): for random stores and prompts, under
// every profile, /query_by_hash with the prompt's keys answers byte for
// byte what /query answers for its tokens, over HTTP.
func TestQueryByHashEqualsQuery(t *testing.T) {
	h := startServer(t, Options{})
	port := 20000
	iter := 0
	rapid.Check(t, func(rt *rapid.T) {
		iter++
		model := fmt.Sprintf("m%d", iter)
		bs := rapid.SampledFrom([]int{1, 4, 16}).Draw(rt, "block_size")
		prof := rapid.SampledFrom(propertyProfiles).Draw(rt, "profile")
		nInst := rapid.IntRange(1, 3).Draw(rt, "instances")
		typ := "vLLM"
		if prof["strategy"] == "sglang" {
			typ = "SGLang"
		}
		for i := range nInst {
			for rank := range rapid.IntRange(1, 2).Draw(rt, "ranks") {
				port++
				body, _ := msgpack.Marshal(map[string]any{"endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", port), "type": typ,
					"modelname": model, "instance_id": fmt.Sprintf("%s-i%d", model, i), "block_size": bs, "dp_rank": rank, "hash_profile": prof})
				if st, ans, _ := h.rawPost("/register", body, ""); st != 200 {
					rt.Fatalf("register: %d %x", st, ans)
				}
			}
		}
		c := h.cat.Get(index.ContextKey{Tenant: "default", Model: model, BlockSize: bs})
		if c == nil {
			rt.Fatal("no table")
		}
		tbl := c.Table
		// A few base prompts; stores and queries are their prefixes, some
		// diverging after a point, so that runs break at varied blocks.
		bases := make([][]int32, rapid.IntRange(1, 3).Draw(rt, "bases"))
		for b := range bases {
			n := bs * rapid.IntRange(0, 12).Draw(rt, "blocks")
			bases[b] = make([]int32, n)
			for j := range bases[b] {
				bases[b][j] = int32(rapid.IntRange(0, 5).Draw(rt, "tok"))
			}
		}
		keysOf := func(toks []int32) []uint64 {
			ch := hashing.AcquireChain()
			defer hashing.ReleaseChain(ch)
			ch.Reset(&c.Profile, bs, toks, "", "")
			ks := []uint64{}
			for {
				k, _, ok := ch.Next()
				if !ok {
					return ks
				}
				ks = append(ks, k)
			}
		}
		for range rapid.IntRange(0, 8).Draw(rt, "stores") {
			keys := keysOf(bases[rapid.IntRange(0, len(bases)-1).Draw(rt, "base")])
			n := rapid.IntRange(0, len(keys)).Draw(rt, "stored")
			tier := index.Tier(rapid.IntRange(0, 3).Draw(rt, "tier"))
			if tier == index.CPUShare {
				for _, k := range keys[:n] {
					r := new(index.SharedRef)
					r.Init(nil, tier, 0, k, 0, nil)
					tbl.Acquire(r)
				}
				continue
			}
			owner := tbl.AddEngineOwner(fmt.Sprintf("%s-i%d", model, rapid.IntRange(0, nInst-1).Draw(rt, "owner")), 0)
			for _, k := range keys[:n] {
				tbl.Store(owner, index.Put{Key: k, Tier: tier})
			}
		}
		for range rapid.IntRange(1, 4).Draw(rt, "queries") {
			toks := append([]int32{}, bases[rapid.IntRange(0, len(bases)-1).Draw(rt, "qbase")]...)
			if len(toks) > 0 && rapid.Bool().Draw(rt, "diverge") {
				toks[rapid.IntRange(0, len(toks)-1).Draw(rt, "at")] = 99
			}
			m := map[string]any{"model": model, "block_size": bs}
			if rapid.Bool().Draw(rt, "filter") {
				m["instance_id"] = fmt.Sprintf("%s-i%d", model, rapid.IntRange(0, nInst).Draw(rt, "inst"))
			}
			m["token_ids"] = toks
			qb, _ := msgpack.Marshal(m)
			delete(m, "token_ids")
			m[rapid.SampledFrom([]string{"seq_hashes", "block_hash"}).Draw(rt, "name")] = keysOf(toks)
			hb, _ := msgpack.Marshal(m)
			s1, a1, _ := h.rawPost("/query", qb, "")
			s2, a2, _ := h.rawPost("/query_by_hash", hb, "")
			if s1 != 200 || s2 != 200 || !bytes.Equal(a1, a2) {
				var v1, v2 any
				_ = msgpack.Unmarshal(a1, &v1)
				_ = msgpack.Unmarshal(a2, &v2)
				rt.Fatalf("tokens %v: /query %d %v, /query_by_hash %d %v", toks, s1, v1, s2, v2)
			}
		}
	})
}

// TestQueryByHashJSON: the answer and the errors come as JSON on Accept.
func TestQueryByHashJSON(t *testing.T) {
	h := startServer(t, Options{})
	body, _ := msgpack.Marshal(map[string]any{"endpoint": "tcp://127.0.0.1:5557", "type": "vLLM", "modelname": "m", "instance_id": "a",
		"block_size": 16, "dp_rank": 0, "hash_profile": map[string]any{"strategy": "rfc1527", "algorithm": "xxh3_64"}})
	if st, _, _ := h.rawPost("/register", body, ""); st != 200 {
		t.Fatal("register refused")
	}
	tbl := h.cat.Get(index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}).Table
	tbl.Store(tbl.AddEngineOwner("a", 0), index.Put{Key: 16863443419780771464, Tier: index.Device})
	q, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "seq_hashes": []uint64{16863443419780771464, 12466389667045779788}})
	st, ans, ct := h.rawPost("/query_by_hash", q, "application/json")
	var got map[string]any
	if st != 200 || ct != "application/json" || json.Unmarshal(ans, &got) != nil {
		t.Fatalf("status %d, %s: %s", st, ct, ans)
	}
	if a := got["instances"].(map[string]any)["a"].(map[string]any); a["longest_matched"] != float64(16) {
		t.Errorf("answer %s", ans)
	}
	bad, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "seq_hashes": []any{1, "x"}})
	st, ans, ct = h.rawPost("/query_by_hash", bad, "application/json")
	if st != 400 || ct != "application/json" || !bytes.Contains(ans, []byte(`"index":1`)) {
		t.Errorf("status %d, %s: %s", st, ct, ans)
	}
}
