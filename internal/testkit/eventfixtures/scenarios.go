package eventfixtures

// scenarios are the multi-message cases: sequence handling, replay
// exchanges, staleness and ingest-then-query checks. Frames in replay
// exchanges are hex, with "<payload …>" standing for a fixture's payload.
func scenarios() []any {
	live := func(id string, seq int) omap { return m("live", id, "seq", seq) }
	liveOn := func(id string, seq int, reg string) omap { return m("live", id, "seq", seq, "registration", reg) }
	expect := func(pairs ...any) omap { return m("expect", m(pairs...)) }
	query := func(tokens []int64, inst omap) omap {
		return m("query", m("model", "test-model", "block_size", 4, "token_ids", tokens), "expect_instance", inst)
	}
	const kvHex = "6b762d6576656e7473" // "kv-events"
	return []any{
		m("id", "seq_first_message_baseline", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 41), expect("state", "live", "last_applied", 41)},
			"note", "first message after subscribe is applied and becomes the baseline; nothing before it is requested"),
		m("id", "seq_contiguous", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 0), live("vllm_removed_gpu", 1),
				live("vllm_all_cleared", 2), expect("state", "live", "last_applied", 2)}),
		m("id", "seq_gap_replayed_vllm_new", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_chained", 5), live("vllm_all_cleared", 7),
				m("expect_replay_request", []any{"", "0000000000000006"}),
				m("replay_frames", []any{
					[]any{"", kvHex, "0000000000000006", "<payload vllm_removed_gpu>"},
					[]any{"", kvHex, "0000000000000007", "<payload vllm_all_cleared>"},
					[]any{"", "", "ffffffffffffffff", ""}}),
				expect("state", "live", "last_applied", 7, "applied_order", []any{5, 6, 7})},
			"note", "replayed seq 7 duplicates the buffered live message and is applied once"),
		m("id", "seq_gap_replayed_legacy_frames", "registration", "sglang-a",
			"steps", []any{live("sglang_stored_gpu", 10), live("sglang_stored_disk", 12),
				m("expect_replay_request", []any{"", "000000000000000b"}),
				m("replay_frames", []any{
					[]any{"", "000000000000000b", "<payload sglang_stored_cpu_pinned>"},
					[]any{"", "000000000000000c", "<payload sglang_stored_disk>"},
					[]any{"", "ffffffffffffffff", ""}}),
				expect("state", "live", "last_applied", 12, "applied_order", []any{10, 11, 12})}),
		m("id", "seq_gap_no_replay_endpoint", "registration", "vllm-lora",
			"steps", []any{live("vllm_lora_stored", 0), live("vllm_lora_stored", 2),
				expect("state", "stale", "index_entries_of_source", 0, "applied_order", []any{0}),
				live("vllm_lora_stored", 3), expect("state", "stale", "note", "ignored")}),
		m("id", "seq_gap_mooncake", "registration", "pool-a-sub",
			"steps", []any{live("mooncake_stored_vllm_cpu_disk", 1), live("mooncake_stored_vllm_block2_cpu", 3),
				expect("state", "stale", "index_entries_of_source", 0)},
			"note", "master seq starts at 1; a dropped queue entry reserves a sequence number, so loss always shows as a gap"),
		m("id", "seq_replay_window_expired", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 100), live("vllm_all_cleared", 20000),
				m("expect_replay_request", []any{"", "0000000000000065"}),
				m("replay_frames", []any{[]any{"", kvHex, "0000000000002710", "<payload>"}}),
				expect("state", "stale", "reason", "replay skipped a sequence (first replayed 10000 > requested 101)")}),
		m("id", "seq_replay_end_early", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 5), live("vllm_all_cleared", 9),
				m("expect_replay_request", []any{"", "0000000000000006"}),
				m("replay_frames", []any{[]any{"", "", "ffffffffffffffff", ""}}),
				expect("state", "stale", "reason", "end marker before seq 8")}),
		m("id", "seq_replay_timeout", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 5), live("vllm_all_cleared", 9),
				m("expect_replay_request", []any{"", "0000000000000006"}),
				m("silence_ms", 30000),
				expect("state", "stale", "reason", "recovery deadline (30 s) exceeded; each receive times out after 5 s and is retried with a fresh DEALER")}),
		m("id", "seq_regression_restart", "registration", "vllm-a",
			"steps", []any{live("vllm_stored_gpu_2blocks", 57), live("vllm_stored_mla", 0),
				expect("state", "live", "applied_order", []any{0},
					"reason", "sequence regression: a new publisher process; the old process's entries are dropped and the new stream is indexed from its first message")},
			"note", "spec decision, see events.md 1.5 step 3 and 5.4; applied_order is the new epoch's (docs/events.md#restarts)"),
		m("id", "query_after_vllm_and_mooncake", "registrations", []any{"vllm-a", "pool-a-sub"},
			"steps", []any{
				liveOn("vllm_stored_gpu_chained", 0, "vllm-a"),
				liveOn("vllm_removed_gpu", 1, "vllm-a"),
				liveOn("mooncake_stored_vllm_cpu_disk", 1, "pool-a-sub"),
				liveOn("mooncake_stored_vllm_block2_cpu", 2, "pool-a-sub"),
				query(vllmTokens, m("vllm-a", m("device", 4, "cpu_local", 4, "cpu_share", 8, "disk", 8,
					"longest_matched", 8, "dp", m("0", 4))))},
			"note", "GPU holds block 1, the pool holds blocks 1 and 2 on cpu; depends on the query algorithm, not only on ingest"),
		m("id", "query_sglang_tiers", "registrations", []any{"sglang-a"},
			"steps", []any{live("sglang_stored_gpu", 0), live("sglang_stored_cpu_pinned", 1), live("sglang_stored_disk", 2),
				query(sglTokens, m("sglang-a", m("device", 4, "cpu_local", 8, "cpu_share", 8, "disk", 12,
					"longest_matched", 12, "dp", m("0", 4)))),
				live("sglang_cleared", 3),
				query(sglTokens, m("sglang-a", m("device", 0, "cpu_local", 0, "cpu_share", 0, "disk", 0,
					"longest_matched", 0, "dp", m("0", 0))))},
			"note", "same numbers as upstream sglang_map_event_vectors.json integration block (npu 4 / cpu_local 8 / cpu_share 8 / disk 12)"),
		m("id", "query_released_master", "registrations", []any{"vllm-a", "pool-r-sub"},
			"steps", []any{
				liveOn("mooncake_released_stored_cpu_disk", 1, "pool-r-sub"),
				liveOn("mooncake_released_stored_no_legacy", 2, "pool-r-sub"),
				query(vllmTokens, m("vllm-a", m("device", 0, "cpu_share", 4, "disk", 8))),
				liveOn("mooncake_released_removed_cpu_disk", 3, "pool-r-sub"),
				query(vllmTokens, m("vllm-a", m("cpu_share", 0, "disk", 0)))},
			"note", "the released master (context from the registration): block 1 in memory and on disk, block 2 on disk; a tier counts blocks held there or faster; the one removal of block 1 clears both tiers"),
		m("id", "query_sglang_components", "registrations", []any{"sglang-a", "pool-b-sub"},
			"steps", []any{
				liveOn("mooncake_sglang_stored_k_v", 1, "pool-b-sub"),
				query(sglTokens[:4], m("sglang-a", m("cpu_share", 4))),
				liveOn("mooncake_sglang_removed_k", 2, "pool-b-sub"),
				query(sglTokens[:4], m("sglang-a", m("cpu_share", 4))),
				liveOn("mooncake_sglang_removed_v", 3, "pool-b-sub"),
				query(sglTokens[:4], m("sglang-a", m("cpu_share", 0)))}),
	}
}
