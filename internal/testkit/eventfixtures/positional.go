package eventfixtures

// Array-encoded events (docs/events.md#array-encoded-events): one fixture
// per release layout of each engine (docs/engines.md#event-layouts), with
// trailing defaults omitted as msgspec omits them, the newest layouts in
// full, arrays longer than any known layout, and wrong types at each kind
// of position. Expectations name the outcome and, after "rejected: " or
// "ignored: ", the counter reason first (the events package's golden test
// checks that reason).

const (
	pVLLMArr16750 = "vLLM PR #16750 to before PR #19737 (array events without medium, 2025-04-30 to 2025-09-01)"
	pVLLMArr19737 = "vLLM PR #19737 to before PR #27577 (array events, medium required, 2025-09-01 to 2025-12-30)"
	pVLLMArr27577 = "vLLM PR #27577 to before PR #33304 (array events, lora_name required, 2025-12-30 to 2026-02-20)"
	pVLLMArr33304 = "vLLM PR #33304 to before PR #37688 (array events, extra_keys defaulted, 2026-02-20 to 2026-04-12)"
	pVLLMArr37688 = "vLLM PR #37688 to before PR #40984 (array events, group_idx defaulted, 2026-04-12 to 2026-05-12)"
	pVLLMArr40984 = "vLLM PR #40984 to before PR #42892 (newest array layout, 2026-05-12 to 2026-06-09; last array release before v0.26.0)"
	pSGLArr6098   = "SGLang PR #6098 to before PR #18205 (array events without medium; v0.4.6.post5 to v0.5.8)"
	pSGLArr18205  = "SGLang PR #18205 (medium defaulted, omitted when nil; from v0.5.9)"
	pSGLArr30827  = "SGLang PR #30827 to before PR #37482 (no omit_defaults, metadata map at position 7 when salted; to 0.5.18)"
)

func positionalFixtures(add func(F)) {
	tok4 := vllmTokens[:4]
	h1 := []uint64{v1}
	// vLLM, each layout: a store and a removal of block 1, short as the
	// release sent them.
	add(F{ID: "vllm_array_layout_16750", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil}, []any{"BlockRemoved", h1}, []any{"AllBlocksCleared"}),
		Expect: ok(effects(store("device", vOwn, v1), remove("device", vOwn, v1), m("op", "clear", "tiers", []any{"device"}, "owner", vOwn)),
			"applied", "applied", "applied"),
		Producer: pVLLMArr16750, Seq: 500,
		Note: "no medium position: the release published the GPU pool only, so an absent medium is GPU"})
	add(F{ID: "vllm_array_layout_19737", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU"}, []any{"BlockStored", h1, nil, tok4, 4, nil, "CPU"},
			[]any{"BlockRemoved", h1, "GPU"}),
		Expect:   ok(effects(store("device", vOwn, v1), remove("device", vOwn, v1)), "applied", "ignored: medium CPU", "applied"),
		Producer: pVLLMArr19737, Seq: 501})
	add(F{ID: "vllm_array_layout_27577", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil}),
		Expect:   ok(effects(store("device", vOwn, v1)), "applied"),
		Producer: pVLLMArr27577, Seq: 502})
	add(F{ID: "vllm_array_layout_27577_lora", Source: "vLLM", Reg: "vllm-lora",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, 1, "GPU", "sql-adapter"},
			[]any{"BlockStored", h1, nil, tok4, 4, 1, "GPU", "other-adapter"}),
		Expect:   ok(effects(store("device", "engine vllm-lora|default|0", v1)), "applied", "rejected: lora (name is not the registration's)"),
		Producer: pVLLMArr27577, Seq: 503})
	add(F{ID: "vllm_array_layout_33304", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, []any{nil}},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, []any{nil, nil}}),
		Expect:   ok(effects(store("device", vOwn, v1)), "applied", "rejected: extra_keys (two entries for one block)"),
		Producer: pVLLMArr33304, Seq: 504})
	add(F{ID: "vllm_array_layout_37688", Source: "vLLM", Reg: "vllm-a",
		Payload:  vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, nil, 0}, []any{"BlockRemoved", h1, "GPU", 0}),
		Expect:   ok(effects(store("device", vOwn, v1), remove("device", vOwn, v1)), "applied", "applied"),
		Producer: pVLLMArr37688, Seq: 505})
	add(F{ID: "vllm_array_layout_40984", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, []any{nil}, 0, "full_attention", nil},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, nil, 0, "full_attention", 128}),
		Expect:   ok(effects(store("device", vOwn, v1)), "applied", "rejected: attention_kind (a window on full attention)"),
		Producer: pVLLMArr40984, Seq: 506})
	add(F{ID: "vllm_array_longer_than_known", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch([]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, nil, 0, "full_attention", nil, "LOCAL", m("future", 1)},
			[]any{"BlockRemoved", h1, "GPU", 0, "LOCAL"}, []any{"AllBlocksCleared", "future"}),
		Expect: ok(effects(store("device", vOwn, v1), remove("device", vOwn, v1), m("op", "clear", "tiers", []any{"device"}, "owner", vOwn)),
			"applied", "applied", "applied"),
		Producer: "a vLLM array layout with fields appended after the newest known one", Seq: 507,
		Note: "the known prefix is read, the positions after it are skipped"})
	add(F{ID: "vllm_array_wrong_types", Source: "vLLM", Reg: "vllm-a",
		Payload: vBatch(
			[]any{"BlockStored", h1, nil, tok4, "4", nil, "GPU"},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, 5},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", 7},
			[]any{"BlockStored", v1, nil, tok4, 4, nil, "GPU"},
			[]any{"BlockStored", h1, "x", tok4, 4, nil, "GPU"},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, "x"},
			[]any{"BlockStored", h1, nil, tok4, 4, nil, "GPU", nil, nil, "0"},
			[]any{"BlockStored", []int64{-1}, nil, tok4, 4, nil, "GPU"},
			[]any{"BlockStored", h1, nil, tok4, 4},
			[]any{"BlockRemoved"},
			[]any{},
			[]any{7, h1},
			[]any{"BlockUpdated", h1},
			[]any{"BlockRemoved", h1, "GPU"}),
		Expect: ok(effects(remove("device", vOwn, v1)),
			"rejected: wrong_type (block_size is a string)",
			"rejected: wrong_type (medium is an integer)",
			"rejected: wrong_type (lora_name is an integer)",
			"rejected: wrong_type (block_hashes is not an array)",
			"rejected: wrong_type (parent_block_hash is a string)",
			"rejected: extra_keys (not an array)",
			"rejected: wrong_type (group_idx is a string)",
			"rejected: hash (negative)",
			"rejected: missing_key (lora_id position missing)",
			"rejected: missing_key (block_hashes position missing)",
			"rejected: missing_key (no tag)",
			"rejected: wrong_type (tag is an integer)",
			"rejected: unknown_tag",
			"applied"),
		Producer: pVLLMArr40984, Seq: 508,
		Note: "each position has its map key's type and reason; siblings still apply"})

	// SGLang layouts.
	s1 := []int64{sS[0]}
	stok4 := sglTokens[:4]
	add(F{ID: "sglang_array_layout_6098", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{[]any{"BlockStored", s1, nil, stok4, 4, nil}, []any{"BlockRemoved", s1}, []any{"AllBlocksCleared"}}, 0),
		Expect: ok(effects(store("device", sOwn, sU[0]), remove("device", sOwn, sU[0]),
			m("op", "clear", "tiers", []any{"device", "cpu_local", "disk"}, "owner", sOwn)), "applied", "applied", "applied"),
		Producer: pSGLArr6098, Seq: 600})
	add(F{ID: "sglang_array_layout_18205", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{
			[]any{"BlockStored", s1, nil, stok4, 4, nil},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "CPU_PINNED"},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "DISK"},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "EXTERNAL"},
			[]any{"BlockRemoved", s1, "CPU_PINNED"}}, 0),
		Expect: ok(effects(store("device", sOwn, sU[0]), store("cpu_local", sOwn, sU[0]), store("disk", sOwn, sU[0]),
			remove("cpu_local", sOwn, sU[0])), "applied", "applied", "applied", "ignored: medium EXTERNAL", "applied"),
		Producer: pSGLArr18205, Seq: 601,
		Note: "a nil medium is omitted (trailing default): the device"})
	add(F{ID: "sglang_array_layout_30827", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{
			[]any{"BlockStored", s1, nil, stok4, 4, nil, nil},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, nil, m("cache_salt", "salt-a")},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "CPU_PINNED", m("cache_salt", "salt-a", "session_hint", 3)},
			[]any{"BlockRemoved", s1, nil}}, 0),
		Expect: ok(effects(store("device", sOwn, sU[0]), store("device", sOwn, sU[0]), store("cpu_local", sOwn, sU[0]),
			remove("device", sOwn, sU[0])), "applied", "applied", "applied", "applied"),
		Producer: pSGLArr30827, Seq: 602,
		Note: "medium always present (nil = device); the metadata map's cache_salt is read, its other keys skipped"})
	add(F{ID: "sglang_array_longer_than_known", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU", m("cache_salt", "salt-a"), "future", 9},
			[]any{"BlockRemoved", s1, "GPU", "future"}}, 0),
		Expect:   ok(effects(store("device", sOwn, sU[0]), remove("device", sOwn, sU[0])), "applied", "applied"),
		Producer: "an SGLang array layout with fields appended after the newest known one", Seq: 603})
	add(F{ID: "sglang_array_wrong_types", Source: "SGLang", Reg: "sglang-a",
		Payload: batch(vts, []any{
			[]any{"BlockStored", s1, nil, stok4, 4, nil, 3},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU", "salt-a"},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU", m("cache_salt", 5)},
			[]any{"BlockStored", s1, nil, stok4, 4, nil, "GPU", rawMap{{1, "x"}}},
			[]any{"BlockStored", s1, nil, stok4, 8, nil},
			[]any{"BlockStored", s1, nil, stok4, 4, 2},
			[]any{"BlockStored", []uint64{sU[0]}, nil, stok4, 4, nil},
			[]any{"BlockStored", s1, nil, stok4},
			[]any{"BlockRemoved", s1, "GPU"}}, 0),
		Expect: ok(effects(remove("device", sOwn, sU[0])),
			"rejected: wrong_type (medium is an integer)",
			"rejected: wrong_type (metadata is not a map)",
			"rejected: wrong_type (cache_salt is an integer)",
			"rejected: non_string_key (in the metadata map)",
			"rejected: block_size (8 > registered 4)",
			"rejected: lora (lora_id must be nil)",
			"rejected: hash (above int64)",
			"rejected: missing_key (block_size position missing)",
			"applied"),
		Producer: pSGLArr30827, Seq: 604})
}
