package eventfixtures

// The Mooncake Store master as released: the publisher of Mooncake
// v0.3.12, v0.3.12.post1 and main (mooncake-store/src/kv_event/
// kv_event_publisher.cpp, blob 8349bfc on main @ 2026-08-22; v0.3.12 differs
// only in where it normalizes an empty tenant to "default"). It stamps no
// context: model_name, block_size, additional_salt, lora_name and the
// event's dp_rank are nil, the batch's dp_rank is 0, and the registration
// supplies the context (docs/events.md#registration-context).

const pRel = "mooncake_master v0.3.12 / v0.3.12.post1 / main @ 2026-08-22 (context fields nil)"

// ro are the knobs of a released master event.
type ro struct {
	key             string
	medium, group   any
	tenant, backend string
	eventID         int64
	noLegacy        bool // --kv_events_emit_legacy_compat=false
	noObjectKey     bool // --kv_events_emit_object_key=false
	// seqHash is what the master's ParseSeqHashFromObjectKey makes of a
	// key that is a whole decimal or 0x-hex uint64; nil for any other key
	// (every key an engine connector writes).
	seqHash *uint64
}

// rEvent is one event map of the released publisher, in its packing order.
// Its integers go out as msgpack-c picks their width: event_id and the
// millisecond timestamp as unsigned, base_block_idx as the uint32 0, the
// legacy block_hashes alias as the int64 of the hash (negative from 2^63).
func rEvent(kind string, o ro) omap {
	if o.tenant == "" {
		o.tenant = "default"
	}
	if o.backend == "" {
		o.backend = "pool-r"
	}
	if o.eventID == 0 {
		o.eventID = 1
	}
	legacyType := map[string]string{"stored": "BlockStored", "removed": "BlockRemoved"}[kind]
	ev := m("event_id", o.eventID, "timestamp", mts, "event_type", kind)
	if !o.noLegacy {
		ev = ev.with("type", legacyType)
	}
	ev = ev.with("model_name", nil, "block_size", nil, "additional_salt", nil, "lora_name", nil,
		"tenant_id", o.tenant, "backend_id", o.backend, "group_id", o.group,
		"medium", o.medium, "dp_rank", nil)
	if !o.noObjectKey {
		ev = ev.with("object_key", o.key)
	}
	seq, legacy := []any{}, []any{}
	if o.seqHash != nil {
		seq, legacy = []any{*o.seqHash}, []any{int64(*o.seqHash)}
	}
	ev = ev.with("seq_hashes", seq)
	if !o.noLegacy {
		ev = ev.with("block_hashes", legacy)
	}
	if kind == "stored" {
		ev = ev.with("base_block_idx", 0, "parent_hash", nil, "token_ids", nil)
		if !o.noLegacy {
			ev = ev.with("parent_block_hash", nil)
		}
	} else {
		ev = ev.with("base_block_idx", nil)
	}
	return ev
}

// rBatch is the released master's batch: integer milliseconds and the
// batch-level dp_rank 0 ("storage pool has no DP context").
func rBatch(events ...any) []any { return batch(mts, events, 0) }

func u64p(v uint64) *uint64 { return &v }

func releasedMasterFixtures() []F {
	const (
		ownR  = "shared backend=pool-r (endpoint tcp://10.0.0.11:5557)"
		ownRT = "shared backend=pool-r tenant=t1 (endpoint tcp://10.0.0.11:5557)"
		ownRL = "shared backend=pool-r (endpoint tcp://10.0.0.12:5557)"
		ownS  = "shared backend=pool-s (endpoint tcp://10.0.0.13:5557)"
	)
	obj := func(owner, key string) string { return owner + " object=" + key }
	logical := func(key string) string { return ownS + " logical=" + key }
	bareHex := uint64(0xfedcba9876543210) // above 2^63: the legacy alias is negative
	var fs []F
	add := func(f F) {
		f.Source = "Mooncake"
		if f.Reg == "" {
			f.Reg = "pool-r-sub"
		}
		fs = append(fs, f)
	}

	add(F{ID: "mooncake_released_stored_cpu_disk",
		Payload: rBatch(rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 1}),
			rEvent("stored", ro{key: kVLLM1, medium: "disk", eventID: 2})),
		Expect: ok(effects(store("cpu_share", obj(ownR, kVLLM1), v1), store("disk", obj(ownR, kVLLM1), v1)),
			"applied: context (default, test-model, '', 4) from the registration", "applied"),
		Producer: pRel, Seq: 1,
		Note: "a MEMORY and a DISK PutEnd of one object: one stored event each; a master numbers its batches from 1"})
	add(F{ID: "mooncake_released_removed_cpu_disk",
		Payload: rBatch(rEvent("removed", ro{key: kVLLM1, medium: "cpu", eventID: 3})),
		Expect: ok(effects(remove("cpu_share", obj(ownR, kVLLM1), v1), remove("disk", obj(ownR, kVLLM1), v1)),
			"applied: the object's last replica is gone, both tiers released"),
		Producer: pRel, Seq: 2,
		Note: "the released master publishes removed once per object, when no replica is left, under the medium it derives from the replicas it is removing (cpu whenever one was in memory)"})
	add(F{ID: "mooncake_released_stored_tp_ranks",
		Payload: rBatch(rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 1}),
			rEvent("stored", ro{key: kVLLM1TP1, medium: "cpu", eventID: 2}),
			rEvent("stored", ro{key: kVLLM2, medium: "cpu", eventID: 3})),
		Expect: ok(effects(store("cpu_share", obj(ownR, kVLLM1), v1), store("cpu_share", obj(ownR, kVLLM1TP1), v1),
			store("cpu_share", obj(ownR, kVLLM2), v2)), "applied", "applied (second owner of the same prefix)", "applied"),
		Producer: pRel + "; vLLM MooncakeStoreConnector keys, TP 2", Seq: 1})
	add(F{ID: "mooncake_released_removed_tp0",
		Payload:  rBatch(rEvent("removed", ro{key: kVLLM1, medium: "cpu", eventID: 4})),
		Expect:   ok(effects(remove("cpu_share", obj(ownR, kVLLM1), v1)), "applied"),
		Producer: pRel, Seq: 2,
		Note: "prefix V1 stays present in cpu_share while the tp_rank:1 object is still stored"})
	add(F{ID: "mooncake_released_stored_no_legacy",
		Payload:  rBatch(rEvent("stored", ro{key: kAsc, medium: "disk", noLegacy: true, eventID: 1})),
		Expect:   ok(effects(store("disk", obj(ownR, kAsc), v2)), "applied"),
		Producer: pRel + " --kv_events_emit_legacy_compat=false; vLLM-Ascend key", Seq: 1})
	add(F{ID: "mooncake_released_removed_no_legacy",
		Payload:  rBatch(rEvent("removed", ro{key: kAsc, medium: "disk", noLegacy: true, eventID: 2})),
		Expect:   ok(effects(remove("disk", obj(ownR, kAsc), v2)), "applied"),
		Producer: pRel + " --kv_events_emit_legacy_compat=false", Seq: 2})
	add(F{ID: "mooncake_released_stored_tenants",
		Payload: rBatch(rEvent("stored", ro{key: kVLLM1, medium: "cpu", tenant: "t1", eventID: 1}),
			rEvent("stored", ro{key: kVLLM1, medium: "cpu", tenant: "t2", eventID: 2}),
			rEvent("stored", ro{key: kVLLM2, medium: "cpu", eventID: 3})),
		Expect: ok(effects(store("cpu_share", obj(ownRT, kVLLM1), v1), store("cpu_share", obj(ownR, kVLLM2), v2)),
			"applied: the writer's tenant t1 kept, (t1, test-model, '', 4) bound by vllm-t1",
			"rejected: context (t2, test-model, '', 4) not registered by an engine with this profile",
			"applied"),
		Producer: pRel + "; objects written by tenants", Seq: 1})
	add(F{ID: "mooncake_released_removed_tenant",
		Payload: rBatch(rEvent("removed", ro{key: kVLLM1, medium: "cpu", eventID: 4}),
			rEvent("removed", ro{key: kVLLM1, medium: "cpu", tenant: "t1", eventID: 5})),
		Expect: ok(effects(remove("cpu_share", obj(ownRT, kVLLM1), v1)),
			"no-op: no binding for object/tier (same key, default tenant)", "applied"),
		Producer: pRel, Seq: 2})
	add(F{ID: "mooncake_released_bad_keys",
		Payload: rBatch(rEvent("stored", ro{key: "plain-user-key-42", medium: "cpu", eventID: 1}),
			rEvent("stored", ro{key: kAscPartial, medium: "cpu", eventID: 2}),
			rEvent("stored", ro{key: "4660", medium: "cpu", seqHash: u64p(4660), eventID: 3}),
			rEvent("stored", ro{key: "0xfedcba9876543210", medium: "disk", seqHash: &bareHex, eventID: 4}),
			rEvent("removed", ro{key: "0xfedcba9876543210", medium: "cpu", seqHash: &bareHex, eventID: 5}),
			rEvent("stored", ro{key: kVLLM2, medium: "cpu", eventID: 6})),
		Expect: ok(effects(store("cpu_share", obj(ownR, kVLLM2), v2)),
			"rejected: unrecognized vLLM/vLLM-Ascend object_key",
			"rejected: unrecognized vLLM/vLLM-Ascend object_key (partial-block scratch key)",
			"rejected: object_key (a bare number the master parsed into seq_hashes; no engine connector writes such keys)",
			"rejected: object_key (legacy block_hashes is the int64 of seq_hashes, accepted; the key is still a bare number)",
			"no-op: no binding (a key that never parsed was never bound)",
			"applied: the batch and the source go on"),
		Producer: pRel, Seq: 1})
	add(F{ID: "mooncake_released_no_object_key",
		Payload: rBatch(rEvent("stored", ro{medium: "cpu", noObjectKey: true, seqHash: u64p(v1), eventID: 1}),
			rEvent("removed", ro{medium: "cpu", noObjectKey: true, seqHash: u64p(v1), eventID: 2})),
		Expect: ok(nil, "rejected: object_key missing (the master sent only the number it parsed from the key)",
			"rejected: object_key missing"),
		Producer: pRel + " --kv_events_emit_object_key=false", Seq: 1,
		Note: "with object keys off the master drops every event whose key is not a bare number (every connector key) and sends the rest without object_key"})
	add(F{ID: "mooncake_released_stated_fields", Reg: "pool-r-sub",
		Payload: rBatch(rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 1}).with("model_name", "other-model"),
			rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 2}).with("block_size", 0),
			rEvent("stored", ro{key: kVLLM1, medium: "cpu", group: "1", eventID: 3}),
			rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 4}).with("dp_rank", -1),
			rEvent("stored", ro{key: kVLLM1, medium: "gpu", eventID: 5})),
		Expect: ok(nil,
			"rejected: context (default, other-model, '', 4): a stated model_name is checked as today",
			"rejected: block_size must be positive",
			"rejected: group_id must be nil, empty or 0 (vllm_v1)",
			"rejected: dp_rank must be a non-negative integer or nil",
			"ignored: medium gpu not a shared tier"),
		Producer: pRel + ", fields altered to show what is still checked", Seq: 1})
	add(F{ID: "mooncake_released_lora", Reg: "pool-r-lora-sub",
		Payload: rBatch(rEvent("stored", ro{key: kVLLM1, medium: "cpu", eventID: 1})),
		Expect: ok(effects(store("cpu_share", obj(ownRL, kVLLM1), v1)),
			"applied: lora_name sql-adapter from the registration, (default, test-model, sql-adapter, 4) bound by vllm-lora"),
		Producer: pRel + "; a master in front of one adapter's engines", Seq: 1})
	add(F{ID: "mooncake_released_sglang_stored_k_v", Reg: "pool-s-sub",
		Payload: rBatch(rEvent("stored", ro{key: kSGK, medium: "cpu", group: sgGroup, backend: "pool-s", eventID: 1}),
			rEvent("stored", ro{key: kSGV, medium: "cpu", group: sgGroup, backend: "pool-s", eventID: 2}),
			rEvent("stored", ro{key: kSGMLA, medium: "disk", backend: "pool-s", eventID: 3})),
		Expect: ok(effects(store("cpu_share", logical(sgPrefix+sg1), sU[0]), store("disk", logical(sg2), sU[1])),
			"applied (component _0_k)", "applied (component _0_v, same logical block)", "applied (MLA key)"),
		Producer: pRel + "; SGLang HiCache MooncakeStore keys", Seq: 1})
	add(F{ID: "mooncake_released_sglang_removed_k_v", Reg: "pool-s-sub",
		Payload: rBatch(rEvent("removed", ro{key: kSGK, medium: "cpu", group: sgGroup, backend: "pool-s", eventID: 4}),
			rEvent("removed", ro{key: kSGV, medium: "cpu", group: sgGroup, backend: "pool-s", eventID: 5}),
			rEvent("removed", ro{key: kSGMLA, medium: "cpu", backend: "pool-s", eventID: 6})),
		Expect: ok(effects(remove("cpu_share", logical(sgPrefix+sg1), sU[0]), remove("disk", logical(sg2), sU[1])),
			"applied: component _0_k dropped, block still present", "applied: last component removed",
			"applied: a removal says cpu, the object was on disk"),
		Producer: pRel, Seq: 2})
	return fs
}
