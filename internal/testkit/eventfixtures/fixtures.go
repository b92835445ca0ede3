package eventfixtures

import (
	"strings"
)

// Registrations the fixtures refer to, as /register bodies in JSON form.
var (
	vllmProfile = m("strategy", "vllm_v1", "algorithm", "sha256_cbor",
		"python_hash_seed", "0", "index_projection", "low64_be")
	sglProfile = m("strategy", "sglang", "algorithm", "sha256_raw",
		"index_projection", "first64_be")

	registrations = m(
		"vllm-a", m("endpoint", "tcp://10.0.0.1:5557",
			"replay_endpoint", "tcp://10.0.0.1:5558", "type", "vLLM",
			"modelname", "test-model", "instance_id", "vllm-a",
			"block_size", 4, "dp_rank", 0, "hash_profile", vllmProfile),
		"vllm-lora", m("endpoint", "tcp://10.0.0.2:5557", "type", "vLLM",
			"modelname", "test-model", "lora_name", "sql-adapter",
			"instance_id", "vllm-lora", "block_size", 4, "dp_rank", 0,
			"hash_profile", vllmProfile),
		"sglang-a", m("endpoint", "tcp://10.0.0.3:5557",
			"replay_endpoint", "tcp://10.0.0.3:5558", "type", "SGLang",
			"modelname", "test-model", "instance_id", "sglang-a",
			"block_size", 4, "dp_rank", 0, "hash_profile", sglProfile),
		"pool-a-sub", m("endpoint", "tcp://10.0.0.9:5557", "type", "Mooncake",
			"modelname", "test-model", "instance_id", "pool-a-sub",
			"block_size", 4, "dp_rank", 0, "hash_profile", vllmProfile,
			"_master_flags", "--kv_events_backend_id=pool-a --kv_events_model_name=test-model --kv_events_block_size=4"),
		"pool-b-sub", m("endpoint", "tcp://10.0.0.10:5557", "type", "Mooncake",
			"modelname", "test-model", "instance_id", "pool-b-sub",
			"block_size", 4, "dp_rank", 0, "hash_profile", sglProfile,
			"_master_flags", "--kv_events_backend_id=pool-b --kv_events_model_name=test-model --kv_events_block_size=4"),
		// The released master (v0.3.12, main) stamps no context: the
		// registration is the context (docs/events.md#registration-context).
		"vllm-t1", m("endpoint", "tcp://10.0.0.4:5557", "type", "vLLM",
			"modelname", "test-model", "tenant_id", "t1", "instance_id", "vllm-t1",
			"block_size", 4, "dp_rank", 0, "hash_profile", vllmProfile),
		"pool-r-sub", m("endpoint", "tcp://10.0.0.11:5557", "type", "Mooncake",
			"modelname", "test-model", "instance_id", "pool-r-sub",
			"block_size", 4, "dp_rank", 0, "hash_profile", vllmProfile,
			"_master_flags", "--enable_kv_events --kv_events_bind_endpoint=tcp://0.0.0.0:5557 --kv_events_backend_id=pool-r"),
		"pool-r-lora-sub", m("endpoint", "tcp://10.0.0.12:5557", "type", "Mooncake",
			"modelname", "test-model", "lora_name", "sql-adapter", "instance_id", "pool-r-lora-sub",
			"block_size", 4, "dp_rank", 0, "hash_profile", vllmProfile,
			"_master_flags", "--enable_kv_events --kv_events_bind_endpoint=tcp://0.0.0.0:5557 --kv_events_backend_id=pool-r"),
		"pool-s-sub", m("endpoint", "tcp://10.0.0.13:5557", "type", "Mooncake",
			"modelname", "test-model", "instance_id", "pool-s-sub",
			"block_size", 4, "dp_rank", 0, "hash_profile", sglProfile,
			"_master_flags", "--enable_kv_events --kv_events_bind_endpoint=tcp://0.0.0.0:5557 --kv_events_backend_id=pool-s"),
	)

	// requires lists the fixtures a stateful one must follow on the same
	// subscription.
	requires = map[string][]any{
		"vllm_removed_gpu":          {"vllm_stored_gpu_2blocks"},
		"vllm_all_cleared":          {"vllm_stored_gpu_2blocks"},
		"sglang_removed_gpu":        {"sglang_stored_gpu"},
		"sglang_removed_cpu_pinned": {"sglang_stored_cpu_pinned"},
		"sglang_cleared":            {"sglang_stored_gpu", "sglang_stored_cpu_pinned", "sglang_stored_disk"},
		"mooncake_removed_vllm_cpu": {"mooncake_stored_vllm_cpu_disk", "mooncake_stored_vllm_tp1_cpu"},
		"mooncake_cleared":          {"mooncake_stored_vllm_cpu_disk"},
		"mooncake_sglang_removed_k": {"mooncake_sglang_stored_k_v"},
		"mooncake_sglang_removed_v": {"mooncake_sglang_stored_k_v", "mooncake_sglang_removed_k"},

		"mooncake_released_removed_cpu_disk":   {"mooncake_released_stored_cpu_disk"},
		"mooncake_released_removed_tp0":        {"mooncake_released_stored_tp_ranks"},
		"mooncake_released_removed_no_legacy":  {"mooncake_released_stored_no_legacy"},
		"mooncake_released_sglang_removed_k_v": {"mooncake_released_sglang_stored_k_v"},
		"mooncake_released_removed_tenant":     {"mooncake_released_stored_tenants"},
	}

	// alsoRegistered: a Mooncake context is bound by an engine registration
	// with the same profile.
	alsoRegistered = map[string][]any{"pool-a-sub": {"vllm-a"}, "pool-b-sub": {"sglang-a"},
		"pool-r-sub": {"vllm-a", "vllm-t1"}, "pool-r-lora-sub": {"vllm-lora"}, "pool-s-sub": {"sglang-a"}}
)

// Object keys as the engines' store connectors write them.
var (
	d1, d2      = hexOf(vllmDig[0]), hexOf(vllmDig[1])
	kVLLM1      = "deploy-a@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + d1
	kVLLM1TP1   = "deploy-a@test-model@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@" + d1
	kVLLM2      = "deploy-a@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + d2
	kVLLMOld    = "test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@" + d1
	kVLLMGroup1 = "deploy-a@test-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:1@" + d1
	kAsc        = "test-model@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + d2
	kAscLayer   = "test-model@pcp0@dcp0@head_or_tp_rank:0@group:0@cache_role:kv@cache_family:default@layer_id:3@" + d2
	kAscLayerO  = "test-model@pcp0@dcp0@head_or_tp_rank:0@" + d2 + "@3"
	kAscGVA     = "test-model@" + d1 + "@0"
	kAscPartial = "test-model@partial@req-7@0@3@64@0"
	sg1, sg2    = hexOf(sglDig[0]), hexOf(sglDig[1])
	sgPrefix    = "tagA_Qwen-Qwen3-8B_"
	kSGK        = sgPrefix + sg1 + "_0_k"
	kSGV        = sgPrefix + sg1 + "_0_v"
	kSGMLA      = sg2 + "__k"
	sgGroup     = "sglang-hicache:" + sgPrefix + sg1
	kSGWarmup   = "sglang_mooncake_store_warmup_key" + strings.Repeat("0123456789abcdef", 2)
)

// F is one fixture: a payload (or, for transport and replay cases, every
// frame) and what ingesting it must do.
type F struct {
	ID, Source, Reg string
	Payload         any    // nil: Raw or Frames
	Raw             []byte // the payload bytes themselves, when HasRaw
	HasRaw          bool
	Frames          [][]byte
	Expect          omap
	Producer        string
	Topic           []byte
	Seq             uint64
	Note            string
}

const (
	vOwn   = "engine vllm-a|default|0"
	sOwn   = "engine sglang-a|default|0"
	mOwnA  = "shared backend=pool-a (endpoint tcp://10.0.0.9:5557)"
	mOwnB  = "shared backend=pool-b (endpoint tcp://10.0.0.10:5557)"
	pVLLM  = "vLLM >= PR #42892 (map events; e.g. v0.26.0)"
	pSGL   = "SGLang >= PR #37482 (tagged-map events, positional batch)"
	pMoon  = "mooncake_master, key-agnostic publisher (after PR #3744)"
	kvTop  = "kv-events"
	noTopc = ""
)

func t(s string) []byte { return []byte(s) }

func effects(e ...any) []any { return e }

// fixtures returns every fixture in manifest order.
func fixtures() []F {
	tok4, tok8 := vllmTokens[:4], vllmTokens
	var fs []F
	add := func(f F) { fs = append(fs, f) }

	// vLLM
	add(F{ID: "vllm_stored_gpu_2blocks", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1, v2}, nil, tok8)),
		Expect:  ok(effects(store("device", vOwn, v1, v2)), "applied"), Producer: pVLLM, Topic: t(kvTop), Seq: 0})
	add(F{ID: "vllm_stored_gpu_chained", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch(vStored([]uint64{v1}, nil, tok4), vStored([]uint64{v2}, v1, vllmTokens[4:])),
		Expect:   ok(effects(store("device", vOwn, v1), store("device", vOwn, v2)), "applied", "applied"),
		Producer: pVLLM, Topic: t(kvTop), Seq: 1,
		Note: "parent_block_hash of the 2nd event links it to the 1st; Conductor does not need the link (hashes are prefix hashes)."})
	add(F{ID: "vllm_removed_gpu", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vRemoved([]uint64{v2})),
		Expect:  ok(effects(remove("device", vOwn, v2)), "applied"), Producer: pVLLM, Topic: t(kvTop), Seq: 2})
	add(F{ID: "vllm_all_cleared", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vCleared),
		Expect:  ok(effects(m("op", "clear", "tiers", []any{"device"}, "owner", vOwn)), "applied"), Producer: pVLLM, Topic: t(kvTop), Seq: 3})
	add(F{ID: "vllm_empty_batch", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(), Expect: ok(nil), Producer: pVLLM, Topic: t(kvTop), Seq: 4})
	add(F{ID: "vllm_dp_nil", Source: "vLLM", Reg: "vllm-a",
		Payload: batch(vts, []any{vStored([]uint64{v1}, nil, tok4)}, nil),
		Expect:  ok(effects(store("device", vOwn, v1)), "applied"), Producer: pVLLM, Seq: 5,
		Note: "nil data_parallel_rank skips the DP check"})
	add(F{ID: "vllm_stored_cpu_medium", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch(vStored([]uint64{v1}, nil, tok4, medium("CPU"))),
		Expect:   ok(nil, "ignored: medium CPU is not gpu"),
		Producer: "vLLM CPU offloading block pool (MEDIUM_CPU)", Topic: t(kvTop), Seq: 6})
	add(F{ID: "vllm_stored_ascend_connector_cpu", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch(vStored([]uint64{v1}, nil, tok4, medium("cpu"), extraKeys(nil), groupIdx(nil), specKind(nil))),
		Expect:   ok(nil, "ignored: medium cpu is not gpu"),
		Producer: "vLLM-Ascend AscendStore connector take_events (medium='cpu')", Seq: 7})
	add(F{ID: "vllm_stored_bin_hashes", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch(vStored([]any{vllmDig[0][:], vllmDig[1][:]}, nil, tok8)),
		Expect:   ok(effects(store("device", vOwn, v1, v2)), "applied"),
		Producer: "vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (32-byte bin hashes)", Topic: t(kvTop), Seq: 8,
		Note: "projection: last 8 bytes big-endian == int mode values"})
	add(F{ID: "vllm_stored_mla", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4, specKind("mla_attention"))),
		Expect:  ok(effects(store("device", vOwn, v1)), "applied"), Producer: pVLLM, Seq: 9})
	add(F{ID: "vllm_stored_newest_fields", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4,
			extraKeys([]any{[]any{m("type", "cache_salt", "salt", "s1")}}),
			extra("locality", "LOCAL", "event_version", 2))),
		Expect:   ok(effects(store("device", vOwn, v1)), "applied"),
		Producer: "vLLM main (typed ExtraKey schema; locality/ownership/event_version keys)", Seq: 10,
		Note: "unknown keys (locality, event_version) ignored; extra_keys inner items are typed tagged maps and are not interpreted. " +
			"NOTE: a cache_salt extra key means the hash is salted; the block only matches queries that pass the same cache_salt."})
	add(F{ID: "vllm_lora_stored", Source: "vLLM", Reg: "vllm-lora",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4, loraID(1), loraName("sql-adapter"),
			extraKeys([]any{[]any{m("type", "lora", "name", "sql-adapter")}}))),
		Expect:   ok(effects(store("device", "engine vllm-lora|default|0", v1)), "applied"),
		Producer: pVLLM, Seq: 0,
		Note: "V1 is the base-model hash; a real LoRA block hash differs. The fixture only exercises field validation."})
	add(F{ID: "vllm_lora_mismatch", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4, loraID(1), loraName("sql-adapter"))),
		Expect:  ok(nil, "rejected: lora_name conflicts with registration"), Producer: pVLLM, Seq: 11})
	add(F{ID: "vllm_lora_id_without_name", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4, loraID(7))),
		Expect:  ok(nil, "rejected: lora_id requires non-empty lora_name"), Producer: pVLLM, Seq: 12})
	add(F{ID: "vllm_dp_mismatch", Source: "vLLM", Reg: "vllm-a",
		Payload: batch(vts, []any{vStored([]uint64{v1}, nil, tok4)}, 1),
		Expect: m("envelope", "accept", "batch", "reject", "reason", "data_parallel_rank 1 != registered 0",
			"seq_advances", true, "effects", []any{}, "source_state", "stale"),
		Producer: pVLLM, Seq: 13,
		Note: "whole batch rejected and the source marked stale, as upstream does (docs/events.md#batch-dp-rank)."})
	add(F{ID: "vllm_mixed_batch", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4),
			vStored([]uint64{v2}, v1, vllmTokens[4:], groupIdx(1)),
			m("type", "BlockUpdated", "block_hashes", []uint64{v2}),
			vStored([]uint64{v2}, v1, vllmTokens[4:], extra("foo", "bar"))),
		Expect: ok(effects(store("device", vOwn, v1), storeGroup("device", vOwn, 1, v2), store("device", vOwn, v2)),
			"applied", "applied (KV-cache group 1, docs/hybrid.md)", "rejected: unknown tag", "applied (unknown key foo ignored)"),
		Producer: pVLLM, Seq: 14})

	// vLLM hybrid models: one stream of blocks per KV-cache group
	// (docs/hybrid.md#events).
	window := func(w int) opt { return extra("kv_cache_spec_sliding_window", w) }
	add(F{ID: "vllm_hybrid_two_groups", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1, v2}, nil, tok8, specKind("sliding_window"), window(128)),
			vStored([]uint64{v1, v2}, nil, tok8, groupIdx(1))),
		Expect: ok(effects(store("device", vOwn, v1, v2), storeGroup("device", vOwn, 1, v1, v2)),
			"applied (group 0, sliding window 128)", "applied (group 1, full attention)"),
		Producer: "vLLM >= 0.21 serving a gpt-oss-style model (group 0 sliding window, group 1 full attention)", Seq: 15})
	add(F{ID: "vllm_hybrid_mamba_sparse", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1, v2}, nil, tok8, groupIdx(1)),
			vStored([]uint64{v2}, nil, tok8, specKind("mamba"))),
		Expect: ok(effects(storeGroup("device", vOwn, 1, v1, v2), store("device", vOwn, v2)),
			"applied (group 1, full attention)", "applied (group 0, Mamba: only the chunk-end state, fewer hashes than blocks)"),
		Producer: "vLLM >= 0.21 serving a Mamba hybrid in align mode", Seq: 16,
		Note: "sparse kinds announce only some blocks; token spans are never matched to hashes for them"})
	add(F{ID: "vllm_hybrid_partial", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(vStored([]uint64{v1}, nil, tok4, groupIdx(1), specKind("sliding_window"), window(16)),
			vStored([]uint64{v2}, nil, tok8, groupIdx(1), specKind("sliding_window"), window(16), blockSize(8))),
		Expect: ok(effects(storeGroup("device", vOwn, 1, v1), storeGroup("device", vOwn, 1, v2)),
			"applied (a partial entry: one hash block)", "applied (the group's block of two hash blocks, keyed by the last)"),
		Producer: "vLLM >= 0.21, hash block 4 below a group block of 8", Seq: 17})
	add(F{ID: "vllm_hybrid_removed_with_kind", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch(vRemoved([]uint64{v1}, groupIdx(1), extra("kv_cache_spec_kind", "sliding_window", "kv_cache_spec_sliding_window", 128))),
		Expect:   ok(effects(removeGroup("device", vOwn, 1, v1)), "applied (kind and window accepted on removals)"),
		Producer: "a producer that sends the group's kind on removals too", Seq: 18})

	// vLLM events that fail validation, one per payload.
	type bad struct {
		id  string
		ev  any
		why string
	}
	bads := []bad{
		{"vllm_bad_negative_hash", vStored([]int64{-1}, nil, []int64{1, 2, 3, 4}), "rejected: negative integer hash"},
		{"vllm_bad_short_bin", vStored([]any{[]byte{1, 2, 3, 4}}, nil, []int64{1, 2, 3, 4}), "rejected: binary hash shorter than 8 bytes"},
		{"vllm_bad_block_size", vStored([]uint64{v1}, nil, tok4, blockSize(16)), "rejected: block_size 16 != registered 4"},
		{"vllm_bad_window_on_full", vStored([]uint64{v1}, nil, tok4, extra("kv_cache_spec_sliding_window", 128)),
			"rejected: a sliding window on a full-attention group"},
		{"vllm_bad_group_past_limit", vStored([]uint64{v1}, nil, tok4, groupIdx(10)),
			"rejected: group_idx 10 is past the 10 groups an owner can have"},
		{"vllm_bad_group_block_size", vStored([]uint64{v1}, nil, tok4, groupIdx(1), blockSize(6)),
			"rejected: a group's block size is not a multiple of the registered (hash) block size"},
		{"vllm_bad_extra_keys_len", vStored([]uint64{v1, v2}, nil, tok8, extraKeys([]any{nil})), "rejected: extra_keys length != block_hashes length"},
		{"vllm_bad_token_range", vStored([]uint64{v1}, nil, []int64{1, 2, 3, 1 << 31}), "rejected: token id outside int32"},
		{"vllm_bad_hashes_not_array", vStored(v1, nil, tok4, extraKeys(nil)), "rejected: block_hashes not an array"},
		{"vllm_bad_missing_lora_name", vStored([]uint64{v1}, nil, tok4).without("lora_name"), "rejected: required key lora_name missing"},
		{"vllm_bad_removed_with_tokens", vRemoved([]uint64{v1}, extra("token_ids", []int64{1, 2, 3, 4})),
			"rejected: BlockRemoved carries stored-only key token_ids"},
		{"vllm_bad_cleared_with_hashes", m("type", "AllBlocksCleared", "block_hashes", []uint64{v1}), "rejected: AllBlocksCleared carries block_hashes"},
		{"vllm_bad_dup_key", rawMap{{"type", "BlockRemoved"}, {"block_hashes", []uint64{v1}}, {"medium", "GPU"}, {"medium", "CPU"}},
			"rejected: duplicate recognized key medium"},
		{"vllm_bad_int_key", rawMap{{"type", "BlockRemoved"}, {1, "x"}, {"block_hashes", []uint64{v1}}, {"medium", "GPU"}},
			"rejected: non-string map key"},
		{"vllm_bad_missing_type", m("block_hashes", []uint64{v1}, "medium", "GPU"), "rejected: missing type"},
	}
	for i, b := range bads {
		add(F{ID: b.id, Source: "vLLM", Reg: "vllm-a", Payload: vBatch(b.ev), Expect: ok(nil, b.why),
			Producer: pVLLM, Seq: uint64(100 + i)})
	}
	add(F{ID: "vllm_legacy_array_events", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", []uint64{v1}, nil, tok4, 4, nil, "GPU", nil},
			[]any{"BlockRemoved", []uint64{v1}, "GPU"}, []any{"AllBlocksCleared"},
			[]any{"BlockStored", []uint64{v1}, nil, tok4, 4, nil, "GPU"}),
		Expect: ok(effects(store("device", vOwn, v1), remove("device", vOwn, v1),
			m("op", "clear", "tiers", []any{"device"}, "owner", vOwn), store("device", vOwn, v1)),
			repeat("applied", 4)...),
		Producer: "vLLM before PR #42892 (array_like tagged events, e.g. v0.11-v0.22)", Topic: t(kvTop), Seq: 200,
		Note: "positional events decode by the engine's field order; trailing defaulted fields may be absent"})

	// vLLM envelopes that are rejected whole.
	ev1 := vStored([]uint64{v1}, nil, tok4)
	envs := []struct {
		id       string
		payload  any
		why      string
		producer string
	}{
		{"vllm_env_ts_int", []any{1789095808, []any{ev1}, 0}, "vLLM timestamp must be a float", pVLLM},
		{"vllm_env_two_elements", []any{vts, []any{ev1}}, "expected three-element array envelope", "vLLM before data_parallel_rank was added (2025-05)"},
		{"vllm_env_four_elements", []any{vts, []any{ev1}, 0, 0}, "expected three-element array envelope", pVLLM},
		{"vllm_env_map", m("ts", vts, "events", []any{ev1}, "data_parallel_rank", 0), "envelope must be an array",
			"hypothetical map-encoded EventBatch (seen only in one transient upstream snapshot)"},
		{"vllm_env_events_not_array", []any{vts, ev1, 0}, "events must be an array", pVLLM},
		{"vllm_env_dp_negative", []any{vts, []any{ev1}, -1}, "data_parallel_rank must be non-negative or nil", pVLLM},
		{"vllm_env_dp_string", []any{vts, []any{ev1}, "0"}, "data_parallel_rank must be an integer or nil", pVLLM},
		{"vllm_env_ts_nan", []any{pyNaN, []any{ev1}, 0}, "vLLM timestamp must be finite", pVLLM},
	}
	for i, e := range envs {
		add(F{ID: e.id, Source: "vLLM", Reg: "vllm-a", Payload: e.payload, Expect: envReject(e.why), Producer: e.producer, Seq: uint64(300 + i)})
	}
	good := packMsgpack(vBatch(ev1))
	raws := []struct {
		id, why string
		raw     []byte
	}{
		{"vllm_env_trailing_bytes", "trailing bytes after MessagePack value", append(append([]byte(nil), good...), 0xc0)},
		{"vllm_env_not_msgpack", "invalid MessagePack (0xc1 is never used)", []byte{0xc1}},
		{"vllm_env_truncated", "truncated MessagePack", good[:len(good)-3]},
		{"vllm_env_empty_payload", "empty payload", []byte{}},
	}
	for i, r := range raws {
		add(F{ID: r.id, Source: "vLLM", Reg: "vllm-a", Raw: r.raw, HasRaw: true, Expect: envReject(r.why), Producer: pVLLM, Seq: uint64(308 + i)})
	}

	// SGLang
	s1 := []int64{sS[0]}
	stok4 := sglTokens[:4]
	add(F{ID: "sglang_stored_gpu", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(101.0, []any{sStored(s1, nil, stok4)}, 0),
		Expect:  ok(effects(store("device", sOwn, sU[0])), "applied"), Producer: pSGL, Seq: 0,
		Note: "bytes identical to upstream Conductor fixture sglang_map_event_vectors.json integration/tier GPU"})
	add(F{ID: "sglang_stored_cpu_pinned", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(102.0, []any{sStored(sS[:2], nil, sglTokens[:8], medium("CPU_PINNED"))}, 0),
		Expect:  ok(effects(store("cpu_local", sOwn, sU[:2]...)), "applied"), Producer: pSGL, Seq: 1})
	add(F{ID: "sglang_stored_disk", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(103.0, []any{sStored(sS[:3], nil, sglTokens[:12], medium("DISK"))}, 0),
		Expect:  ok(effects(store("disk", sOwn, sU[:3]...)), "applied"), Producer: pSGL, Seq: 2})
	add(F{ID: "sglang_stored_no_medium", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, medium(nil))}, 0),
		Expect:  ok(effects(store("device", sOwn, sU[0])), "applied"), Producer: pSGL, Seq: 3,
		Note: "medium omitted (default None) == engine-local device cache"})
	add(F{ID: "sglang_removed_gpu", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sRemoved(s1)}, 0),
		Expect:  ok(effects(remove("device", sOwn, sU[0])), "applied"), Producer: pSGL, Seq: 4})
	add(F{ID: "sglang_removed_cpu_pinned", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sRemoved([]int64{sS[1]}, medium("CPU_PINNED"))}, 0),
		Expect:  ok(effects(remove("cpu_local", sOwn, sU[1])), "applied"), Producer: pSGL, Seq: 5})
	add(F{ID: "sglang_cleared", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{vCleared}, 0),
		Expect:  ok(effects(m("op", "clear", "tiers", []any{"device", "cpu_local", "disk"}, "owner", sOwn)), "applied"), Producer: pSGL, Seq: 6})
	saltSession := extra("cache_salt", "salt-a", "session_id", "session-a")
	add(F{ID: "sglang_stored_salt_session", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, saltSession)}, 1),
		Expect: m("envelope", "accept", "batch", "reject", "reason", "attn_dp_rank 1 != registered 0",
			"seq_advances", true, "effects", []any{}, "source_state", "stale"),
		Producer: pSGL, Seq: 7,
		Note: "also shows cache_salt/session_id keys; with dp 0 it would be applied (the hash on the wire is already salted)"})
	add(F{ID: "sglang_stored_salt_session_dp0", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, saltSession)}, 0),
		Expect:  ok(effects(store("device", sOwn, sU[0])), "applied"), Producer: pSGL, Seq: 8})
	add(F{ID: "sglang_stored_bigram_tokens", Source: "SGLang", Reg: "sglang-a",
		Payload:  batch(vts, []any{sStored(s1, nil, []any{[]int64{11, 12}, []int64{12, 13}, []int64{13, 14}, []int64{14, 21}})}, 0),
		Expect:   ok(effects(store("device", sOwn, sU[0])), "applied"),
		Producer: "SGLang EAGLE/speculative (bigram token pairs)", Seq: 9,
		Note: "hash value reused from the plain chain for brevity; token pairs are only type-checked"})
	add(F{ID: "sglang_stored_partial_page", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, []int64{11, 12}, blockSize(2))}, 0),
		Expect:  ok(effects(store("device", sOwn, sU[0])), "applied"), Producer: pSGL, Seq: 10,
		Note: "SGLang may report a final partial page: 1 <= block_size <= registered block_size"})
	add(F{ID: "sglang_stored_external", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, medium("EXTERNAL"))}, 0),
		Expect:  ok(nil, "ignored: medium EXTERNAL is not an indexed SGLang medium"), Producer: pSGL, Seq: 11})
	add(F{ID: "sglang_bad_lora_id", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, loraID(3))}, 0),
		Expect:  ok(nil, "rejected: lora_id must be nil"), Producer: pSGL, Seq: 12})
	add(F{ID: "sglang_bad_block_size", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored(s1, nil, stok4, blockSize(8))}, 0),
		Expect:  ok(nil, "rejected: block_size 8 > registered 4"), Producer: pSGL, Seq: 13})
	add(F{ID: "sglang_bad_uint_hash_over_int64", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{sStored([]uint64{sU[0]}, nil, stok4)}, 0),
		Expect:  ok(nil, "rejected: SGLang hashes must fit signed int64"), Producer: pSGL, Seq: 14,
		Note: "S_U[0] >= 2^63 encoded as uint64; SGLang never emits this"})
	add(F{ID: "sglang_legacy_array_events", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU"},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU", m("cache_salt", "salt-a")},
			[]any{"BlockRemoved", s1, "GPU"},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU"}}, 0),
		Expect: ok(effects(store("device", sOwn, sU[0]), store("device", sOwn, sU[0]), remove("device", sOwn, sU[0]),
			store("device", sOwn, sU[0])), repeat("applied", 4)...),
		Producer: "SGLang before PR #37482 (incl. 0.5.18 BlockStoredWithMetadata)", Seq: 15,
		Note: "positional events decode by SGLang's field order; a map at position 7 is the block's metadata (cache_salt)"})
	positionalFixtures(add)
	epoch := t("\x00sgl-kv-epoch=" + strings.Repeat("0f", 16))
	add(F{ID: "sglang_epoch_topic", Source: "SGLang", Reg: "sglang-a",
		Payload:  batch(vts, []any{sStored(s1, nil, stok4)}, 0),
		Expect:   ok(effects(store("device", sOwn, sU[0])), "applied"),
		Producer: "SGLang with snapshot_endpoint configured (epoch in topic)", Topic: epoch, Seq: 16,
		Note: "topic bytes are ignored"})
	add(F{ID: "sglang_snapshot_barrier", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{}, 0), Expect: ok(nil),
		Producer: "SGLang snapshot barrier batch", Topic: append(append([]byte(nil), epoch...), "\x00sgl-kv-snapshot="+strings.Repeat("ab", 16)...), Seq: 17,
		Note: "empty batch that consumes a sequence number"})

	// Mooncake, vLLM keys
	obj := func(key string) string { return mOwnA + " object=" + key }
	add(F{ID: "mooncake_stored_vllm_cpu_disk", Source: "Mooncake", Reg: "pool-a-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", eventID: 1}), mEvent("stored", mo{key: kVLLM1, medium: "disk", eventID: 2})),
		Expect:   ok(effects(store("cpu_share", obj(kVLLM1), v1), store("disk", obj(kVLLM1), v1)), "applied", "applied"),
		Producer: pMoon, Seq: 1,
		Note: "one Put commit available on both media -> one event per medium, media sorted"})
	add(F{ID: "mooncake_stored_vllm_block2_cpu", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM2, medium: "cpu", eventID: 3})),
		Expect:  ok(effects(store("cpu_share", obj(kVLLM2), v2)), "applied"), Producer: pMoon, Seq: 2})
	add(F{ID: "mooncake_stored_vllm_tp1_cpu", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1TP1, medium: "cpu", eventID: 4})),
		Expect:  ok(effects(store("cpu_share", obj(kVLLM1TP1), v1)), "applied (second owner of the same prefix)"), Producer: pMoon, Seq: 3})
	add(F{ID: "mooncake_removed_vllm_cpu", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("removed", mo{key: kVLLM1, medium: "cpu", eventID: 5})),
		Expect:  ok(effects(remove("cpu_share", obj(kVLLM1), v1)), "applied"), Producer: pMoon, Seq: 4,
		Note: "prefix V1 stays present in cpu_share while the tp_rank:1 object is still stored"})
	add(F{ID: "mooncake_removed_unknown", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("removed", mo{key: kVLLM2, medium: "disk", eventID: 6})),
		Expect:  ok(nil, "no-op: no binding for object/tier"), Producer: pMoon, Seq: 5})
	add(F{ID: "mooncake_cleared", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("cleared", mo{eventID: 7})),
		Expect: ok(effects(m("op", "clear_shared", "backend_id", "pool-a", "tenant_id", "default",
			"tiers", []any{"cpu_share", "disk"})), "applied"), Producer: pMoon, Seq: 6})
	add(F{ID: "mooncake_stored_no_legacy", Source: "Mooncake", Reg: "pool-a-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", noLegacy: true, eventID: 8})),
		Expect:   ok(effects(store("cpu_share", obj(kVLLM1), v1)), "applied"),
		Producer: "mooncake_master --kv_events_emit_legacy_compat=false", Seq: 7})
	add(F{ID: "mooncake_stored_vllm_old_key", Source: "Mooncake", Reg: "pool-a-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kVLLMOld, medium: "cpu", eventID: 9})),
		Expect:   ok(effects(store("cpu_share", obj(kVLLMOld), v1)), "applied"),
		Producer: pMoon + "; vLLM connector key without group:N", Seq: 8})
	add(F{ID: "mooncake_stored_ascend", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kAsc, medium: "cpu", eventID: 10}),
			mEvent("stored", mo{key: kAscLayer, medium: "cpu", eventID: 11}),
			mEvent("stored", mo{key: kAscLayerO, medium: "cpu", eventID: 12}),
			mEvent("stored", mo{key: kAscGVA, medium: "cpu", eventID: 13})),
		Expect: ok(effects(store("cpu_share", obj(kAsc), v2), store("cpu_share", obj(kAscLayer), v2),
			store("cpu_share", obj(kAscLayerO), v2), store("cpu_share", obj(kAscGVA), v1)), repeat("applied", 4)...),
		Producer: pMoon + "; vLLM-Ascend keys", Seq: 9})
	add(F{ID: "mooncake_stored_legacy_connector_fields", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM2, medium: "cpu", group: "0", eventID: 14}).with(
			"connector_block_hash", d2, "cache_prefix", "deploy-a", "tp_rank", 0, "pcp_rank", 0,
			"dcp_rank", 0, "pp_rank", 0, "seq_hashes", []uint64{v2}, "block_hashes", []uint64{v2})),
		Expect:   ok(effects(store("cpu_share", obj(kVLLM2), v2)), "applied"),
		Producer: "dev/conductor-era publisher (PR #2876) that parsed keys itself", Seq: 10,
		Note: "key order differs from that publisher; maps are order-insensitive"})
	add(F{ID: "mooncake_bad_seq_hashes_conflict", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM2, medium: "cpu", eventID: 15}).with(
			"seq_hashes", []uint64{v1}, "block_hashes", []uint64{v1})),
		Expect: ok(nil, "rejected: seq_hashes conflicts with key hash"), Producer: pMoon, Seq: 11})
	add(F{ID: "mooncake_bad_group_nonzero", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", group: "1", eventID: 16})),
		Expect:  ok(nil, "rejected: group_id 1 disagrees with the key's group:0 label (vllm_v1)"), Producer: pMoon, Seq: 12})
	add(F{ID: "mooncake_group_label_in_key", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLMGroup1, medium: "cpu", eventID: 17})),
		Expect: ok(effects(storeGroup("cpu_share", obj(kVLLMGroup1), 1, v1)),
			"applied in KV-cache group 1, the key's group:1 label (docs/hybrid.md#mooncake)"), Producer: pMoon, Seq: 13})
	add(F{ID: "mooncake_medium_gpu", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, medium: "gpu", eventID: 18})),
		Expect:  ok(nil, "ignored: medium gpu not a shared tier"), Producer: pMoon, Seq: 14})
	add(F{ID: "mooncake_medium_nil_stored", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, eventID: 19})),
		Expect:  ok(nil, "ignored: medium nil"), Producer: pMoon, Seq: 15})
	add(F{ID: "mooncake_unknown_context", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", model: "other-model", eventID: 20})),
		Expect:  ok(nil, "rejected: context (default, other-model, '', 4) not registered by an engine with this profile"), Producer: pMoon, Seq: 16})
	add(F{ID: "mooncake_bad_block_size_nil", Source: "Mooncake", Reg: "pool-a-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", nilBlockSize: true, eventID: 21})),
		Expect:   ok(nil, "rejected: block_size must be positive"),
		Producer: "mooncake_master started without --kv_events_block_size", Seq: 17})
	add(F{ID: "mooncake_bad_ts_mismatch", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", ts: mts + 1, eventID: 22})),
		Expect:  ok(nil, "rejected: event timestamp != batch timestamp"), Producer: pMoon, Seq: 18})
	add(F{ID: "mooncake_bad_removed_with_tokens", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("removed", mo{key: kVLLM1, medium: "cpu", eventID: 23}).with("token_ids", []int64{1, 2, 3, 4})),
		Expect:  ok(nil, "rejected: removed carries stored-only key"), Producer: pMoon, Seq: 19})
	add(F{ID: "mooncake_bad_cleared_with_key", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("cleared", mo{eventID: 24}).with("object_key", kVLLM1)),
		Expect:  ok(nil, "rejected: cleared carries object key"), Producer: pMoon, Seq: 20})
	add(F{ID: "mooncake_bad_legacy_type_conflict", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: kVLLM1, medium: "cpu", eventID: 25}).with("type", "BlockRemoved")),
		Expect:  ok(nil, "rejected: legacy type conflicts with event_type"), Producer: pMoon, Seq: 21})
	add(F{ID: "mooncake_bad_unparseable_key", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: mBatch(mEvent("stored", mo{key: "plain-user-key-42", medium: "cpu", eventID: 26}),
			mEvent("stored", mo{key: kAscPartial, medium: "cpu", eventID: 27})),
		Expect: ok(nil, repeat("rejected: unrecognized vLLM/vLLM-Ascend object_key", 2)...), Producer: pMoon, Seq: 22})
	v0312 := m("event_id", 28, "timestamp", mts, "event_type", "stored",
		"type", "BlockStored", "model_name", nil, "block_size", nil,
		"additional_salt", nil, "lora_name", nil,
		"tenant_id", "default", "backend_id", "pool-a",
		"group_id", nil, "medium", "cpu", "dp_rank", nil,
		"object_key", kVLLM1, "seq_hashes", []any{}, "block_hashes", []any{},
		"base_block_idx", 0, "parent_hash", nil, "token_ids", nil,
		"parent_block_hash", nil)
	add(F{ID: "mooncake_v0312_shape", Source: "Mooncake", Reg: "pool-a-sub",
		Payload:  mBatch(v0312),
		Expect:   ok(effects(store("cpu_share", obj(kVLLM1), v1)), "applied: model_name, block_size, lora_name and dp_rank nil, taken from the registration"),
		Producer: pRel, Seq: 23})
	add(F{ID: "mooncake_env_ts_float", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: []any{1789095808.5, []any{mEvent("cleared", mo{})}, 0},
		Expect:  envReject("Mooncake timestamp must be a non-negative integer"), Producer: pMoon, Seq: 24})
	add(F{ID: "mooncake_env_legacy_two_elements", Source: "Mooncake", Reg: "pool-a-sub",
		Payload: []any{mts, []any{[]any{"BlockStoreEvent", kVLLM1, []any{[]any{"memory", "tcp://10.0.0.5:6000"}},
			nil, 4, []uint64{v1}, nil, []int64{1, 2, 3, 4}}}},
		Expect:   envReject("expected three-element array envelope"),
		Producer: "pre-RFC #1527 positional BlockStoreEvent with replica list (dev/kv-indexer era, RFC #1408; layout approximate)", Seq: 25})

	// Mooncake, SGLang keys
	logical := func(key string) string { return mOwnB + " logical=" + key }
	add(F{ID: "mooncake_sglang_stored_k_v", Source: "Mooncake", Reg: "pool-b-sub",
		Payload: mBatch(mEvent("stored", mo{key: kSGK, medium: "cpu", group: sgGroup, backend: "pool-b", eventID: 1}),
			mEvent("stored", mo{key: kSGV, medium: "cpu", group: sgGroup, backend: "pool-b", eventID: 2})),
		Expect: ok(effects(store("cpu_share", logical(sgPrefix+sg1), sU[0])),
			"applied (component _0_k)", "applied (component _0_v, same logical block)"),
		Producer: pMoon + "; SGLang HiCache MooncakeStore keys, enable_group_semantics", Seq: 1})
	add(F{ID: "mooncake_sglang_removed_k", Source: "Mooncake", Reg: "pool-b-sub",
		Payload: mBatch(mEvent("removed", mo{key: kSGK, medium: "cpu", group: sgGroup, backend: "pool-b", eventID: 3})),
		Expect:  ok(nil, "applied: component _0_k dropped, block still present"), Producer: pMoon, Seq: 2})
	add(F{ID: "mooncake_sglang_removed_v", Source: "Mooncake", Reg: "pool-b-sub",
		Payload: mBatch(mEvent("removed", mo{key: kSGV, medium: "cpu", group: sgGroup, backend: "pool-b", eventID: 4})),
		Expect:  ok(effects(remove("cpu_share", logical(sgPrefix+sg1), sU[0])), "applied: last component removed"), Producer: pMoon, Seq: 3})
	add(F{ID: "mooncake_sglang_mla_disk", Source: "Mooncake", Reg: "pool-b-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kSGMLA, medium: "disk", backend: "pool-b", eventID: 5})),
		Expect:   ok(effects(store("disk", logical(sg2), sU[1])), "applied"),
		Producer: pMoon + "; MLA key without PP (double underscore)", Seq: 4})
	add(F{ID: "mooncake_sglang_bad_warmup_key", Source: "Mooncake", Reg: "pool-b-sub",
		Payload:  mBatch(mEvent("stored", mo{key: kSGWarmup, medium: "cpu", backend: "pool-b", eventID: 6})),
		Expect:   ok(nil, "rejected: no isolated 64-hex hash"),
		Producer: "SGLang MooncakeStore warmup object", Seq: 5})

	fs = append(fs, releasedMasterFixtures()...)

	// Transport: whole frame sets.
	pl := packMsgpack(vBatch(ev1))
	drop := func(reason string) omap { return m("message", "drop", "reason", reason, "seq_advances", false) }
	ff := bytesRepeat(0xff, 8)
	add(F{ID: "transport_two_frames", Source: "vLLM", Reg: "vllm-a", Expect: drop("expected 3 frames"), Producer: pVLLM,
		Frames: [][]byte{seq8(20), pl}})
	add(F{ID: "transport_four_frames", Source: "vLLM", Reg: "vllm-a", Expect: drop("expected 3 frames"), Producer: pVLLM,
		Frames: [][]byte{{}, seq8(20), pl, {}}})
	add(F{ID: "transport_seq_4_bytes", Source: "vLLM", Reg: "vllm-a", Expect: drop("sequence frame must be 8 bytes"), Producer: pVLLM,
		Frames: [][]byte{{}, {0, 0, 0, 20}, pl}})
	add(F{ID: "transport_seq_reserved_max", Source: "vLLM", Reg: "vllm-a",
		Expect: drop("sequence 0xffffffffffffffff is the replay end marker / exceeds int64"), Producer: pVLLM,
		Frames: [][]byte{{}, ff, pl}})
	add(F{ID: "transport_topic_text", Source: "vLLM", Reg: "vllm-a",
		Expect: m("message", "accept", "reason", "topic ignored", "seq_advances", true,
			"effects", effects(store("device", vOwn, v1))), Producer: pVLLM,
		Frames: [][]byte{t("kv@10.0.0.1:8000@test-model"), seq8(21), pl}})

	// Replay protocol frames.
	add(F{ID: "replay_request_dealer", Source: "vLLM", Reg: "vllm-a",
		Expect:   m("role", "subscriber->publisher", "socket", "DEALER", "meaning", "replay from sequence 6"),
		Producer: pVLLM, Frames: [][]byte{{}, seq8(6)}})
	add(F{ID: "replay_response_vllm_new", Source: "vLLM", Reg: "vllm-a",
		Expect:   m("role", "publisher->subscriber (as received on DEALER)", "meaning", "one buffered batch, vLLM >= PR #45177 (topic frame)"),
		Producer: "vLLM >= PR #45177 (e.g. v0.26.0)", Frames: [][]byte{{}, t(kvTop), seq8(6), pl}})
	add(F{ID: "replay_end_vllm_new", Source: "vLLM", Reg: "vllm-a",
		Expect:   m("role", "publisher->subscriber", "meaning", "end of replay"),
		Producer: "vLLM >= PR #45177", Frames: [][]byte{{}, {}, ff, {}}})
	add(F{ID: "replay_response_legacy", Source: "SGLang", Reg: "sglang-a",
		Expect:   m("role", "publisher->subscriber (as received on DEALER)", "meaning", "one buffered batch, SGLang / vLLM before PR #45177"),
		Producer: "SGLang, vLLM <= v0.25",
		Frames:   [][]byte{{}, seq8(6), packMsgpack([]any{vts, []any{sStored(s1, nil, stok4)}, 0})}})
	add(F{ID: "replay_end_legacy", Source: "SGLang", Reg: "sglang-a",
		Expect:   m("role", "publisher->subscriber", "meaning", "end of replay"),
		Producer: "SGLang, vLLM <= v0.25", Frames: [][]byte{{}, ff, {}}})
	return fs
}

func bytesRepeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}
