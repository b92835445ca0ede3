package events

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

const (
	v1 = uint64(2164874634404590027)
	v2 = uint64(17270480062156288726)
	d1 = "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb"
	d2 = "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6"
	s1 = "f67c5ff154ee4961a5f9223699a9f82f6e06cb3c064efbf28119e8a43639ed97"
	p1 = uint64(17761176520559053153)
)

func TestParseVLLMKey(t *testing.T) {
	cases := []struct {
		key, hash string
		ok        bool
	}{
		{"deploy-a@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + d1, d1, true},
		{"test-model@tp_rank:3@pcp1@dcp0@pp_rank:2@" + d1, d1, true},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + d1, d1, true},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@0x" + strings.ToUpper(d1), "0x" + strings.ToUpper(d1), true},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1[:32], d1[:32], true}, // xxhash-sized
		{`we\@ird@tp_rank:0@pcp0@dcp0@pp_rank:0@` + d1, d1, true},     // escaped @ in the model
		{"m@pcp0@dcp0@head_or_tp_rank:1@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + d2, d2, true},
		{"m@pcp0@dcp0@head_or_tp_rank:0@group:0@cache_role:kv@cache_family:default@layer_id:3@" + d2, d2, true},
		{"m@pcp0@dcp0@head_or_tp_rank:0@" + d2 + "@3", d2, true},
		{"m@" + d1 + "@0", d1, true},
		{"m@1@" + d1 + "@0", d1, true},
		{"plain-user-key-42", "", false},
		{"test-model@partial@req-7@0@3@64@0", "", false},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1 + "@extra", "", false},
		{"m@tp_rank:x@pcp0@dcp0@pp_rank:0@" + d1, "", false},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1[:15], "", false}, // too short
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1[:63], "", false}, // odd length
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@zz" + d1[2:], "", false},
	}
	for _, c := range cases {
		h, ok := parseVLLMKey(c.key)
		if ok != c.ok || h != c.hash {
			t.Errorf("parseVLLMKey(%q) = %q,%v want %q,%v", c.key, h, ok, c.hash, c.ok)
		}
	}
}

func TestParseSGLangKey(t *testing.T) {
	cases := []struct {
		key, logical, comp string
		ok                 bool
	}{
		{"tagA_Qwen-Qwen3-8B_" + s1 + "_0_k", "tagA_Qwen-Qwen3-8B_" + s1, "_0_k", true},
		{s1 + "__k", s1, "__k", true},
		{s1, s1, "", true},
		{"model_" + s1 + "_1_2_v", "model_" + s1, "_1_2_v", true},
		{"abc" + s1 + "_k", "", "", false}, // hex run of 67
		{"x" + s1 + "_k", "", "", false},   // not preceded by _
		{"m_" + s1 + "x", "", "", false},   // not followed by _
		{"sglang_mooncake_store_warmup_key0123456789abcdef0123456789abcdef", "", "", false},
		{"m_" + s1[:40] + "_" + s1 + "_0_k", "m_" + s1[:40] + "_" + s1, "_0_k", true},
	}
	for _, c := range cases {
		l, comp, h, ok := parseSGLangKey(c.key)
		if ok != c.ok || l != c.logical || comp != c.comp || (ok && h != s1) {
			t.Errorf("parseSGLangKey(%q) = %q,%q,%q,%v", c.key, l, comp, h, ok)
		}
	}
}

// direct builds a tester for a manifest registration.
func direct(t *testing.T, reg string, also ...string) *tester {
	t.Helper()
	return newTester(t, eventtest.LoadManifest(t), reg, also...)
}

func results(x *tester, seq uint64) []string {
	var out []string
	for _, o := range x.outcomes[seq] {
		out = append(out, o.Result.String()+":"+o.Reason.String())
	}
	return out
}

func vllmStored(mod func(m map[string]any)) map[string]any {
	m := map[string]any{
		"type": "BlockStored", "block_hashes": []any{v1}, "parent_block_hash": nil,
		"token_ids": []int{1, 2, 3, 4}, "block_size": 4, "lora_id": nil, "medium": "GPU", "lora_name": nil,
	}
	if mod != nil {
		mod(m)
	}
	return m
}

func TestVLLMEventRules(t *testing.T) {
	x := direct(t, "vllm-a")
	bin16 := make([]byte, 16)
	copy(bin16[8:], []byte{0x1e, 0x0b, 0x2e, 0x02, 0x8e, 0xf0, 0x71, 0xcb})
	events := []any{
		vllmStored(func(m map[string]any) { m["block_hashes"] = []any{bin16} }),                // 16-byte bin: last 8 bytes
		vllmStored(func(m map[string]any) { m["kv_cache_spec_kind"] = nil }),                   // nil kind ok
		vllmStored(func(m map[string]any) { m["kv_cache_spec_kind"] = "sink_full_attention" }), // ok
		vllmStored(func(m map[string]any) { m["kv_cache_spec_kind"] = "mamba" }),               // a hybrid group 0 (docs/hybrid.md)
		vllmStored(func(m map[string]any) { m["lora_id"] = 0; m["lora_name"] = "x" }),          // reject (lora name mismatch first)
		vllmStored(func(m map[string]any) { m["medium"] = "gpu" }),                             // case-insensitive
		vllmStored(func(m map[string]any) { m["medium"] = nil }),                               // ignored
		vllmStored(func(m map[string]any) { m["extra_keys"] = []any{"x"} }),                    // bad entry
		vllmStored(func(m map[string]any) { m["token_ids"] = []any{1, -2147483648, 2} }),       // min int32 ok
		vllmStored(func(m map[string]any) { m["token_ids"] = []any{1, "a"} }),                  // wrong type
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{v1}, "medium": "GPU", "group_idx": nil},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{v1}}, // medium required
		map[string]any{"type": "AllBlocksCleared"},
		[]any{"BlockStored"}, // an array without the required positions
		7,
	}
	x.applyBatch(1, eventtest.Encode(t, []any{float32(1.5), events, uint64(0)}))
	want := []string{
		"applied:none", "applied:none", "applied:none", "applied:none", "rejected:lora",
		"applied:none", "ignored:medium", "rejected:extra_keys", "applied:none", "rejected:wrong_type",
		"applied:none", "rejected:missing_key", "applied:none", "rejected:missing_key", "rejected:not_map",
	}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	ops := x.engine.Take()
	if ops[0] != (eventtest.Op{Kind: "store", Owner: eventtest.Owner, Tier: index.Device, Key: v1}) {
		t.Errorf("bin16 projected to %v", ops[0])
	}
	if last := ops[len(ops)-1]; last.Kind != "clear" || last.Mask != 1<<index.Device {
		t.Errorf("vLLM clear = %v, want device only", last)
	}
}

func TestSGLangEventRules(t *testing.T) {
	x := direct(t, "sglang-a")
	stored := func(mod func(m map[string]any)) map[string]any {
		m := map[string]any{"type": "BlockStored", "block_hashes": []any{int64(-685567553150498463)},
			"parent_block_hash": nil, "token_ids": []int{11, 12, 13, 14}, "block_size": 4, "lora_id": nil}
		if mod != nil {
			mod(m)
		}
		return m
	}
	events := []any{
		stored(func(m map[string]any) { m["medium"] = "cpu" }),                                     // cpu_local
		stored(func(m map[string]any) { m["medium"] = "Cpu_Pinned" }),                              // cpu_local
		stored(func(m map[string]any) { m["medium"] = "DISK" }),                                    // disk
		stored(func(m map[string]any) { m["token_ids"] = []any{[]int{1, 2}, []int{3}} }),           // bad pair
		stored(func(m map[string]any) { m["block_hashes"] = []any{} }),                             // empty
		stored(func(m map[string]any) { m["block_size"] = 0 }),                                     // < 1
		stored(func(m map[string]any) { m["block_hashes"] = []any{[]byte("12345678")} }),           // bin not SGLang
		stored(func(m map[string]any) { m["lora_name"] = "ignored"; m["extra_keys"] = "x" }),       // unknown for SGLang
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{}},                            // no-op
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(1)}, "cache_salt": "x"}, // foreign
		map[string]any{"type": "AllBlocksCleared"},
	}
	x.applyBatch(1, eventtest.Encode(t, []any{1.5, events, nil}))
	want := []string{
		"applied:none", "applied:none", "applied:none", "rejected:token_range", "rejected:hash",
		"rejected:block_size", "rejected:hash", "applied:none", "no-op:none", "rejected:foreign_key", "applied:none",
	}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	want2 := []eventtest.Op{
		{Kind: "store", Owner: eventtest.Owner, Tier: index.CPULocal, Key: p1},
		{Kind: "store", Owner: eventtest.Owner, Tier: index.CPULocal, Key: p1},
		{Kind: "store", Owner: eventtest.Owner, Tier: index.Disk, Key: p1},
		{Kind: "store", Owner: eventtest.Owner, Tier: index.Device, Key: p1},
		{Kind: "clear", Owner: eventtest.Owner, Mask: index.AllEngineTiers},
	}
	if diff := cmp.Diff(want2, x.engine.Take()); diff != "" {
		t.Errorf("ops (-want +got):\n%s", diff)
	}
}

func mcEventMap(kind, medium, key string, mod func(m map[string]any)) map[string]any {
	m := map[string]any{
		"event_id": 1, "timestamp": uint64(1000), "event_type": kind, "model_name": "test-model",
		"block_size": 4, "additional_salt": nil, "lora_name": nil, "tenant_id": "default",
		"backend_id": "pool-a", "medium": medium, "dp_rank": 0,
	}
	if kind != "cleared" {
		m["group_id"] = nil
		m["object_key"] = key
		m["seq_hashes"] = []any{}
		m["base_block_idx"] = nil
	}
	if kind == "stored" {
		m["parent_hash"] = nil
		m["token_ids"] = nil
	}
	if mod != nil {
		mod(m)
	}
	return m
}

func mcBatch(t *testing.T, events ...any) []byte {
	return eventtest.Encode(t, []any{uint64(1000), events, 0})
}

// TestMooncakeBindings covers the binding-table rules of
// docs/events.md#bindings that the fixtures do not: conflicts, idempotence,
// assertions and in-batch order.
func TestMooncakeBindings(t *testing.T) {
	x := direct(t, "pool-a-sub", "vllm-a")
	k1 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1
	k1b := "m@tp_rank:1@pcp0@dcp0@pp_rank:0@" + d1
	// same prefix, different full hash
	other := strings.Repeat("0", 48) + d1[48:]
	k3 := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + other
	x.applyBatch(1, mcBatch(t,
		mcEventMap("stored", "cpu", k1, nil),
		mcEventMap("stored", "CPU", k1, nil), // idempotent
		mcEventMap("stored", "cpu", k1b, nil),
		mcEventMap("stored", "cpu", k3, nil),
		mcEventMap("stored", "cpu", k1, func(m map[string]any) { m["connector_block_hash"] = d2 }), // conflicting hash
		mcEventMap("stored", "cpu", k1, func(m map[string]any) { m["tenant_id"] = "" }),            // "" = default: idempotent
		mcEventMap("stored", "cpu", k1, func(m map[string]any) { m["seq_hashes"] = []any{v1, v1} }),
	))
	want := []string{"applied:none", "applied:none", "applied:none", "applied:none", "rejected:binding_conflict", "applied:none", "rejected:seq_hashes"}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("batch 1 (-want +got):\n%s", diff)
	}
	if bal := eventtest.SharedBalance(x.shared.Snapshot()); bal[[2]uint64{uint64(index.CPUShare), v1}] != 3 {
		t.Errorf("references %v, want 3 on V1", bal)
	}
	x.applyBatch(2, mcBatch(t,
		mcEventMap("removed", "cpu", k1, func(m map[string]any) { m["model_name"] = "other" }), // assertion
		mcEventMap("removed", "cpu", k1, func(m map[string]any) { m["seq_hashes"] = []any{v2} }),
		mcEventMap("removed", "cpu", k1, func(m map[string]any) { m["group_id"] = "2" }),  // the binding is group 0's: assertion
		mcEventMap("removed", "cpu", k1, func(m map[string]any) { m["group_id"] = "10" }), // no such group
		mcEventMap("removed", "disk", k1, nil),                                            // other tier: no binding
		mcEventMap("removed", "cpu", k1, func(m map[string]any) { m["model_name"] = nil; m["group_id"] = "0" }),
		mcEventMap("removed", "cpu", k1, nil), // duplicate remove
		mcEventMap("cleared", "", "", func(m map[string]any) { m["medium"] = nil }),
		mcEventMap("stored", "disk", k1, nil), // re-added after the clear
		mcEventMap("cleared", "", "", func(m map[string]any) { m["medium"] = nil; m["tenant_id"] = "t2" }),
	))
	want = []string{"rejected:assertion", "rejected:assertion", "rejected:assertion", "rejected:group", "no-op:no_binding",
		"applied:none", "no-op:no_binding", "applied:none", "applied:none", "applied:none"}
	if diff := cmp.Diff(want, results(x, 2)); diff != "" {
		t.Errorf("batch 2 (-want +got):\n%s", diff)
	}
	bal := eventtest.SharedBalance(x.shared.Snapshot())
	if diff := cmp.Diff(map[[2]uint64]int{{uint64(index.Disk), v1}: 1}, bal); diff != "" {
		t.Errorf("references after clear (-want +got):\n%s", diff)
	}
	x.retract()
	if bal := eventtest.SharedBalance(x.shared.Snapshot()); len(bal) != 0 {
		t.Errorf("after retract %v", bal)
	}
}

func TestMooncakeSGLangComponents(t *testing.T) {
	x := direct(t, "pool-b-sub", "sglang-a")
	key := func(c string) string { return "m_" + s1 + c }
	g := "sglang-hicache:m_" + s1
	withGroup := func(m map[string]any) { m["group_id"] = g }
	x.applyBatch(1, mcBatch(t,
		mcEventMap("stored", "cpu", key("_0_k"), withGroup),
		mcEventMap("stored", "cpu", key("_0_v"), withGroup),
		mcEventMap("stored", "cpu", key("_1_k"), func(m map[string]any) { m["group_id"] = "other" }), // group conflict
		mcEventMap("stored", "cpu", key("_0_k"), func(m map[string]any) { withGroup(m); m["connector_block_hash"] = d1 }),
		mcEventMap("stored", "cpu", key("_0_k"), func(m map[string]any) { withGroup(m); m["model_name"] = "x" }), // not own context
		mcEventMap("removed", "cpu", key("_9_k"), withGroup),                                                     // unknown component
		mcEventMap("removed", "cpu", key("_0_k"), nil),                                                           // group mismatch (nil vs g)
		mcEventMap("removed", "cpu", key("_0_k"), withGroup),
	))
	want := []string{"applied:none", "applied:none", "rejected:binding_conflict", "rejected:object_key",
		"rejected:context", "no-op:no_binding", "rejected:assertion", "applied:none"}
	if diff := cmp.Diff(want, results(x, 1)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if bal := eventtest.SharedBalance(x.shared.Snapshot()); bal[[2]uint64{uint64(index.CPUShare), p1}] != 1 {
		t.Errorf("block must stay while _0_v is stored: %v", bal)
	}
	x.applyBatch(2, mcBatch(t, mcEventMap("removed", "cpu", key("_0_v"), withGroup)))
	if bal := eventtest.SharedBalance(x.shared.Snapshot()); len(bal) != 0 {
		t.Errorf("block must go with its last component: %v", bal)
	}
}
