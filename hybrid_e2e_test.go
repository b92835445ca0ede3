package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// The worked examples of docs/hybrid.md (E1–E4) end to end: a real ZMQ
// publisher sends a hybrid model's per-group events, /query answers what
// vLLM's hybrid prefix cache would hit.

// hybridKeys are a prompt's keys at hash block size hbs, under the e2e
// engines' profile: key j covers the first (j+1)·hbs tokens.
func hybridKeys(t *testing.T, tokens []int32, hbs int) []uint64 {
	t.Helper()
	prof := eventtest.VLLMProfile(t)
	return eventtest.ChainKeys(&prof, hbs, tokens)
}

func promptTokens(n, base int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(base + i)
	}
	return out
}

// groupStored is one group's BlockStored of the blocks with the given
// keys; group block size bs.
func groupStored(g int, kind string, window int, bs int, keys []uint64, tokens []int32) map[string]any {
	ev := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil, "token_ids": tokens,
		"block_size": bs, "lora_id": nil, "medium": "GPU", "lora_name": nil,
		"group_idx": g, "kv_cache_spec_kind": kind}
	if window > 0 {
		ev["kv_cache_spec_sliding_window"] = window
	}
	return ev
}

func groupRemoved(g int, keys ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": keys, "medium": "GPU", "group_idx": g}
}

func (e *e2e) hybridDevice(instance string, bs int, tokens []int32) int64 {
	e.t.Helper()
	status, out := e.post("/query", map[string]any{"model": "deepseek", "block_size": bs, "token_ids": tokens, "instance_id": instance})
	if status != 200 {
		e.t.Fatalf("query: %d %v", status, out)
	}
	in, ok := out["instances"].(map[string]any)[instance].(map[string]any)
	if !ok {
		e.t.Fatalf("instance %s missing from %v", instance, out)
	}
	v, _ := msgpackInt(in["device"])
	return v
}

func registerHybrid(t *testing.T, e *e2e, instance, endpoint string, bs int, groups []map[string]any) {
	t.Helper()
	reg := vllmRegistration(instance, endpoint)
	reg["block_size"] = bs
	if groups != nil {
		reg["kv_cache_groups"] = groups
	}
	if status, out := e.post("/register", reg); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
}

// TestHybridE1GptOss: gpt-oss's two groups (sliding window 128, full
// attention), learned from the events alone.
func TestHybridE1GptOss(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	registerHybrid(t, e, "p0", pub.endpoint, 16, nil)
	p := promptTokens(1000, 1000)
	keys := hybridKeys(t, p, 16) // 62 blocks
	query := append(append([]int32(nil), p[:800]...), promptTokens(300, 90000)...)
	eventtest.Eventually(t, "both groups stored", func() bool {
		pub.send(0, groupStored(0, "sliding_window", 128, 16, keys, p[:992]),
			groupStored(1, "full_attention", 0, 16, keys, p[:992]))
		return e.hybridDevice("p0", 16, query) == 800
	})
	// g0 evicts blocks 0..40: the window before 800 is intact
	pub.send(0, groupRemoved(0, keys[:41]...))
	// a prompt ending inside the evicted span has no window: the removal
	// has arrived once it answers 0, while full attention alone says 656
	eventtest.Eventually(t, "g0 eviction", func() bool { return e.hybridDevice("p0", 16, p[:656]) == 0 })
	if got := e.hybridDevice("p0", 16, query); got != 800 {
		t.Errorf("E1: %d, want 800", got)
	}
	// E1b: block 45 goes too; runs of 4 blocks, none of 8
	pub.send(0, groupRemoved(0, keys[45]))
	eventtest.Eventually(t, "E1b", func() bool { return e.hybridDevice("p0", 16, query) == 0 })

	m := e.scrape()
	if v := metricValue(m, `conductor_events_group_kind_total{kind="sliding_window"}`); v < 1 {
		t.Errorf("sliding-window events counted %v", v)
	}
	// A group whose window changes disagrees with the learned layout: the
	// event is rejected and counted, the answer keeps the layout's rule.
	conflicts := `conductor_events_rejected_total{reason="layout_conflict",source_type="vLLM"}`
	before := metricValue(m, conflicts)
	pub.send(0, groupStored(0, "sliding_window", 64, 16, keys[:41], p[:656]))
	eventtest.Eventually(t, "layout conflict counted", func() bool { return metricValue(e.scrape(), conflicts) == before+1 })
	if got := e.hybridDevice("p0", 16, p[:656]); got != 0 {
		t.Errorf("the conflicting event was applied: P[0:656] answers %d", got)
	}
}

// TestHybridE2Gemma3: six sliding-window groups and one full-attention
// group; one sliding group lost block 200.
func TestHybridE2Gemma3(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	registerHybrid(t, e, "p0", pub.endpoint, 16, nil)
	p := promptTokens(4096, 1000)
	keys := hybridKeys(t, p, 16)
	var evs []map[string]any
	for g := range 6 {
		evs = append(evs, groupStored(g, "sliding_window", 1024, 16, keys, p))
	}
	evs = append(evs, groupStored(6, "full_attention", 0, 16, keys, p))
	eventtest.Eventually(t, "seven groups stored", func() bool {
		pub.send(0, evs...)
		return e.hybridDevice("p0", 16, p) == 4096
	})
	pub.send(0, groupRemoved(3, keys[200]))
	eventtest.Eventually(t, "E2", func() bool { return e.hybridDevice("p0", 16, p) == 3200 })
}

// TestHybridE3Qwen35: three Mamba groups storing only chunk-end states and
// one full-attention group, all at block size 528.
func TestHybridE3Qwen35(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	registerHybrid(t, e, "p0", pub.endpoint, 528, nil)
	r := promptTokens(3000, 1000)
	keys := hybridKeys(t, r, 528) // 528 … 2,640
	query := append(append([]int32(nil), r...), promptTokens(1000, 90000)...)
	evs := []map[string]any{}
	for g := range 3 {
		evs = append(evs, groupStored(g, "mamba", 0, 528, []uint64{keys[2], keys[4]}, r[:2640]))
	}
	evs = append(evs, groupStored(3, "full_attention", 0, 528, keys, r[:2640]))
	eventtest.Eventually(t, "four groups stored", func() bool {
		pub.send(0, evs...)
		return e.hybridDevice("p0", 528, query) == 2640
	})
	pub.send(0, groupRemoved(1, keys[4]))
	eventtest.Eventually(t, "E3 after g1 evicted 2,640", func() bool { return e.hybridDevice("p0", 528, query) == 1584 })
}

// TestHybridE4Llama4: chunked local attention, whose chunk size only the
// registration's declaration can give.
func TestHybridE4Llama4(t *testing.T) {
	e := startAppWith(t, func(c *config.Config) { c.DebugRoutes = true })
	pub := newPublisher(t)
	registerHybrid(t, e, "p0", pub.endpoint, 16, []map[string]any{
		{"kind": "chunked_local_attention", "block_size": 16, "chunk_size": 8192},
		{"kind": "full_attention", "block_size": 16},
	})
	p := promptTokens(12000, 1000)
	keys := hybridKeys(t, p, 16) // 750 blocks
	eventtest.Eventually(t, "both groups stored", func() bool {
		pub.send(0, groupStored(0, "chunked_local_attention", 0, 16, keys, p),
			groupStored(1, "full_attention", 0, 16, keys, p))
		return e.hybridDevice("p0", 16, p) == 12000
	})
	pub.send(0, groupRemoved(0, keys[600]))
	eventtest.Eventually(t, "E4", func() bool { return e.hybridDevice("p0", 16, p) == 9600 })
	// /debug/explain shows the declared layout and the group that stopped
	// the hit; the registration's responses never echo it
	status, x := e.post("/debug/explain", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": p, "instance_id": "p0"})
	if status != 200 {
		t.Fatalf("explain: %d %v", status, x)
	}
	o := x["owners"].([]any)[0].(map[string]any)
	stop, _ := msgpackInt(o["stopped_at_block"])
	by, _ := msgpackInt(o["stopped_by_group"])
	layout := o["kv_cache_groups"].(map[string]any)
	g0 := layout["groups"].([]any)[0].(map[string]any)
	chunk, _ := msgpackInt(g0["chunk_size"])
	if o["reason"] != "group_rule" || stop != 600 || by != 0 || layout["declared"] != true || g0["kind"] != "chunked_local_attention" || chunk != 8192 {
		t.Errorf("explain owner %v", o)
	}
	if svcs := e.get("/services"); strings.Contains(fmt.Sprint(svcs), "chunk") {
		t.Errorf("/services echoes the declaration: %v", svcs)
	}
	// Block 100 is outside the bound's chunk, so the engine hits 12,000;
	// without the declaration the group gets the full-attention rule,
	// never more than the engine: the prefix before block 100.
	pub.send(0, groupStored(0, "chunked_local_attention", 0, 16, keys[600:601], p[:9616]), groupRemoved(0, keys[100]))
	eventtest.Eventually(t, "E4 block 100 evicted", func() bool { return e.hybridDevice("p0", 16, p) == 12000 })
	pub2 := newPublisher(t)
	registerHybrid(t, e, "p1", pub2.endpoint, 16, nil)
	eventtest.Eventually(t, "undeclared", func() bool {
		pub2.send(0, groupStored(0, "chunked_local_attention", 0, 16, keys, p),
			groupStored(1, "full_attention", 0, 16, keys, p), groupRemoved(0, keys[100]))
		return e.hybridDevice("p1", 16, p) == 1600
	})
}

// TestHybridGracefulRestartAnswersIdentically: the snapshot keeps the
// group dimension and the learned layout, so a restarted service answers a
// hybrid model's prompts exactly as before, before its source resumes.
func TestHybridGracefulRestartAnswersIdentically(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	p := startConductor(t, dir, "--snapshot-interval", "0")
	eng := newEngine(t, "e1", 1000)
	eng.register(p)
	tok := promptTokens(1000, 1000)
	keys := hybridKeys(t, tok, 16)
	query := func(p *proc, tokens []int32) int64 {
		_, a := p.do("POST", "/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tokens, "instance_id": "e1"})
		return device(a, "e1")
	}
	eventtest.Eventually(t, "both groups stored", func() bool {
		eng.send(groupStored(0, "sliding_window", 128, 16, keys, tok[:992]), groupStored(1, "full_attention", 0, 16, keys, tok[:992]))
		return query(p, tok) == 992
	})
	eng.send(groupRemoved(0, keys[:41]...))
	eventtest.Eventually(t, "g0 eviction", func() bool { return query(p, tok[:656]) == 0 })
	prompts := [][]int32{tok, tok[:656], tok[:800], append(append([]int32(nil), tok[:800]...), promptTokens(300, 90000)...)}
	before := p.answers(prompts)
	p.stop()

	p2 := startConductor(t, dir, "--snapshot-interval", "0")
	after := p2.answers(prompts)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("hybrid answers after a graceful restart (-before +after):\n%s", diff)
	}
	if got := query(p2, tok[:656]); got != 0 {
		t.Errorf("the restored owner lost its layout: P[0:656] answers %d", got)
	}
}

// TestHybridGroup0AboveTheHashBlock: group 0 of full attention (or MLA) at
// a multiple of the hash block size, beside a group at it, end to end:
// FA/B64 with a sliding window B16, and MLA/B48 with full attention B16,
// hash block 16; both get their hits.
func TestHybridGroup0AboveTheHashBlock(t *testing.T) {
	e := startApp(t)
	p := promptTokens(400, 1000)
	keys := hybridKeys(t, p, 16) // 25 keys, one per 16 tokens
	// blockKeys are a group's keys at block size bs: every (bs/16)-th.
	blockKeys := func(bs int) []uint64 {
		var out []uint64
		for t := bs; t <= len(p); t += bs {
			out = append(out, keys[t/16-1])
		}
		return out
	}
	for _, tc := range []struct {
		instance string
		g0kind   string
		g0bs     int
		g1       map[string]any
		want     int64
	}{
		{"fa64", "full_attention", 64, groupStored(1, "sliding_window", 128, 16, keys, p), 384},
		{"mla48", "mla_attention", 48, groupStored(1, "full_attention", 0, 16, keys, p), 384},
	} {
		pub := newPublisher(t)
		registerHybrid(t, e, tc.instance, pub.endpoint, 16, nil)
		g0 := blockKeys(tc.g0bs)
		eventtest.Eventually(t, tc.instance+" stored", func() bool {
			pub.send(0, groupStored(0, tc.g0kind, 0, tc.g0bs, g0, p[:len(g0)*tc.g0bs]), tc.g1)
			return e.hybridDevice(tc.instance, 16, p) == tc.want
		})
		if got := metricValue(e.scrape(), `conductor_events_rejected_total{reason="block_size",source_type="vLLM"}`); got != 0 {
			t.Errorf("%s: %v events rejected as block_size", tc.instance, got)
		}
	}
}
