package server

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// explainSetup registers engines a/0 and b/0 (block size 16) and stores
// the 4-block prompt 1..64: a holds 2 blocks on device, b 3; block 3 is
// nowhere. shared adds the first 3 blocks to the shared cpu_share pool.
func explainSetup(t *testing.T, debug, shared bool, memoBytes int) *harness {
	t.Helper()
	h := startServerMemo(t, Options{DebugRoutes: debug, TokenMemo: tokenmemo.New(memoBytes)}, hashing.NewMemo(memoBytes))
	for i, inst := range []string{"a", "b"} {
		body := pack(t, map[string]any{
			"endpoint": "tcp://127.0.0.1:" + itoa(6000+i), "type": "vLLM", "modelname": "m", "instance_id": inst,
			"block_size": 16, "dp_rank": 0,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
		})
		if st, got, _ := h.do("POST", "/register", "application/msgpack", body); st != 200 {
			t.Fatalf("register %s: %d %v", inst, st, got)
		}
	}
	tokens := json.RawMessage(`{"$range": [1, 64]}`)
	for _, s := range []storeStep{
		{Model: "m", BlockSize: 16, Instance: "a", Tier: "device", Tokens: tokens, Blocks: 2},
		{Model: "m", BlockSize: 16, Instance: "b", Tier: "device", Tokens: tokens, Blocks: 3},
	} {
		if err := h.store(&s); err != nil {
			t.Fatal(err)
		}
	}
	if shared {
		if err := h.store(&storeStep{Model: "m", BlockSize: 16, Shared: true, Tier: "cpu_share", Tokens: tokens, Blocks: 3}); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func pack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func promptTokens(n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(i + 1)
	}
	return toks
}

// promptKeys are the block keys of tokens under the harness's context.
func (h *harness) promptKeys(tokens []int32) []uint64 {
	c := h.cat.Get(index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16})
	return eventtest.ChainKeys(&c.Profile, 16, tokens)
}

// explained is the /debug/explain body, decoded with its own types so
// that 64-bit keys compare exactly.
type explained struct {
	ContextKnown bool           `msgpack:"context_known"`
	Blocks       []explainBlock `msgpack:"blocks"`
	Owners       []explainOwner `msgpack:"owners"`
}

type explainBlock struct {
	Key           uint64   `msgpack:"key"`
	Tokens        int      `msgpack:"tokens"`
	Indexed       bool     `msgpack:"indexed"`
	EngineHolders int      `msgpack:"engine_holders"`
	Shared        []string `msgpack:"shared"`
}

type explainOwner struct {
	Instance string         `msgpack:"instance_id"`
	Rank     int            `msgpack:"dp_rank"`
	Matched  map[string]int `msgpack:"matched"`
	Stop     int            `msgpack:"stopped_at_block"`
	Reason   string         `msgpack:"reason"`
}

func (h *harness) explain(body []byte) explained {
	h.t.Helper()
	st, got, resp := h.do("POST", "/debug/explain", "application/msgpack", body)
	if st != 200 {
		h.t.Fatalf("explain: status %d: %v", st, got)
	}
	var x explained
	if err := msgpack.Unmarshal(resp.Body(), &x); err != nil {
		h.t.Fatal(err)
	}
	return x
}

func matched(d, l, s, k int) map[string]int {
	return map[string]int{"device": d, "cpu_local": l, "cpu_share": s, "disk": k}
}

func owner(inst string, m map[string]int, stop int, reason string) explainOwner {
	return explainOwner{Instance: inst, Matched: m, Stop: stop, Reason: reason}
}

// TestExplain: per owner, where the run stopped and why; per block, its
// key and state; an instance filter; an unknown context; a salt that
// changes every key.
func TestExplain(t *testing.T) {
	query := map[string]any{"model": "m", "block_size": 16, "token_ids": promptTokens(64)}
	blocks := func(k []uint64, shared ...string) []explainBlock {
		holders := []int{2, 2, 1, 0}
		out := make([]explainBlock, len(k))
		for i := range k {
			out[i] = explainBlock{Key: k[i], Tokens: 16 * (i + 1), Indexed: holders[i] > 0, EngineHolders: holders[i], Shared: []string{}}
			if i < 3 && shared != nil {
				out[i].Shared = shared
			}
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		shared bool
		body   map[string]any
		want   func(keys []uint64) explained
	}{
		{"engines only", false, query, func(k []uint64) explained {
			return explained{ContextKnown: true, Blocks: blocks(k),
				Owners: []explainOwner{owner("a", matched(32, 32, 32, 32), 2, "held_by_others"), owner("b", matched(48, 48, 48, 48), 3, "key_absent")}}
		}},
		{"shared pool carries a", true, query, func(k []uint64) explained {
			return explained{ContextKnown: true, Blocks: blocks(k, "cpu_share"),
				Owners: []explainOwner{owner("a", matched(32, 32, 48, 48), 3, "key_absent"), owner("b", matched(48, 48, 48, 48), 3, "key_absent")}}
		}},
		{"instance filter", false, with(query, "instance_id", "a"), func(k []uint64) explained {
			return explained{ContextKnown: true, Blocks: blocks(k),
				Owners: []explainOwner{owner("a", matched(32, 32, 32, 32), 2, "held_by_others")}}
		}},
		{"whole prompt held", false, with(query, "token_ids", promptTokens(32)), func(k []uint64) explained {
			return explained{ContextKnown: true, Blocks: blocks(k)[:2],
				Owners: []explainOwner{owner("a", matched(32, 32, 32, 32), 2, "prompt_end"), owner("b", matched(32, 32, 32, 32), 2, "prompt_end")}}
		}},
		{"unknown context", false, with(query, "model", "other"), func([]uint64) explained {
			return explained{Blocks: []explainBlock{}, Owners: []explainOwner{}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := explainSetup(t, true, tc.shared, 0)
			got := h.explain(pack(t, tc.body))
			if diff := cmp.Diff(tc.want(h.promptKeys(promptTokens(64))), got); diff != "" {
				t.Errorf("explain (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("other salt: every key absent", func(t *testing.T) {
		h := explainSetup(t, true, false, 0)
		got := h.explain(pack(t, with(query, "cache_salt", "s")))
		plain := h.promptKeys(promptTokens(64))
		if len(got.Blocks) != 4 {
			t.Fatalf("%d blocks, want 4", len(got.Blocks))
		}
		for i, b := range got.Blocks {
			if b.Indexed || b.Key == plain[i] {
				t.Errorf("block %d: %+v (unsalted key %d)", i, b, plain[i])
			}
		}
		want := []explainOwner{owner("a", matched(0, 0, 0, 0), 0, "key_absent"), owner("b", matched(0, 0, 0, 0), 0, "key_absent")}
		if diff := cmp.Diff(want, got.Owners); diff != "" {
			t.Errorf("owners (-want +got):\n%s", diff)
		}
	})
}

func with(m map[string]any, k string, v any) map[string]any {
	out := map[string]any{}
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}

// TestExplainAgreesWithQuery: every owner's counts are /query's rank
// counts for the same body.
func TestExplainAgreesWithQuery(t *testing.T) {
	h := explainSetup(t, true, true, 0)
	body := pack(t, map[string]any{"model": "m", "block_size": 16, "token_ids": promptTokens(64)})
	_, q, _ := h.do("POST", "/query", "application/msgpack", body)
	x := h.explain(body)
	if len(x.Owners) != 2 {
		t.Fatalf("%d owners explained, want 2", len(x.Owners))
	}
	for _, o := range x.Owners {
		inst := q.(map[string]any)["instances"].(map[string]any)[o.Instance].(map[string]any)
		want := inst["rank_matches"].(map[string]any)["0"]
		got := map[string]any{}
		for k, v := range o.Matched {
			got[k] = int64(v)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: explain counts differ from /query (-query +explain):\n%s", o.Instance, diff)
		}
	}
}

// TestExplainIsOptIn: off by default the route is an unknown path; on,
// /query answers byte for byte as with it off, explaining leaves both memos
// as they were, and a malformed body gets /query's own error.
func TestExplainIsOptIn(t *testing.T) {
	body := pack(t, map[string]any{"model": "m", "block_size": 16, "token_ids": promptTokens(512)})
	off := explainSetup(t, false, false, 1<<20)
	st, got, _ := off.do("POST", "/debug/explain", "application/msgpack", body)
	if diff := cmp.Diff(map[string]any{"error": "not found: /debug/explain"}, got); st != 404 || diff != "" {
		t.Errorf("debug routes off: status %d, body (-want +got):\n%s", st, diff)
	}
	on := explainSetup(t, true, false, 1<<20)
	_, _, offResp := off.do("POST", "/query", "application/msgpack", body)
	offBody := append([]byte(nil), offResp.Body()...)
	h0, m0 := on.memo.Stats()
	b0 := on.memo.Bytes()
	for range 2 {
		if st, got, _ := on.do("POST", "/debug/explain", "application/msgpack", body); st != 200 {
			t.Fatalf("explain: %d %v", st, got)
		}
	}
	if h, m := on.memo.Stats(); h != h0 || m != m0 || on.memo.Bytes() != b0 {
		t.Errorf("explaining touched the prefix memo: stats %d/%d -> %d/%d", h0, m0, h, m)
	}
	_, _, onResp := on.do("POST", "/query", "application/msgpack", body)
	if !bytes.Equal(offBody, onResp.Body()) {
		t.Errorf("/query differs with debug routes on:\noff % x\non  % x", offBody, onResp.Body())
	}
	bad := pack(t, map[string]any{"model": "m", "block_size": 16, "token_ids": []int{1}, "extra": 1})
	_, qErr, _ := on.do("POST", "/query", "application/msgpack", bad)
	st, xErr, _ := on.do("POST", "/debug/explain", "application/msgpack", bad)
	if diff := cmp.Diff(qErr, xErr); st != 400 || diff != "" {
		t.Errorf("malformed body: status %d, explain error differs from /query's (-query +explain):\n%s", st, diff)
	}
}
