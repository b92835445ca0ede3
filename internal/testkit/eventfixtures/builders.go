package eventfixtures

import (
	"reflect"
	"strconv"
)

// Batch timestamps: engines send float seconds, the master integer
// milliseconds.
const (
	vts = 1789095808.5
	mts = int64(1789095808500)
)

// evOpts are the optional fields of an engine event builder, with the
// values a current publisher leaves at their defaults.
type evOpts struct {
	medium, blockSize, loraID, loraName any
	extraKeys, groupIdx, specKind       any
	extra                               []any
}

type opt func(*evOpts)

// autoExtraKeys asks vStored for one nil extra_keys entry per hash, which
// is what vLLM sends for a prompt without LoRA, salt or multimodal data.
type autoExtraKeys struct{}

func medium(v any) opt    { return func(o *evOpts) { o.medium = v } }
func blockSize(v any) opt { return func(o *evOpts) { o.blockSize = v } }
func loraID(v any) opt    { return func(o *evOpts) { o.loraID = v } }
func loraName(v any) opt  { return func(o *evOpts) { o.loraName = v } }
func extraKeys(v any) opt { return func(o *evOpts) { o.extraKeys = v } }
func groupIdx(v any) opt  { return func(o *evOpts) { o.groupIdx = v } }
func specKind(v any) opt  { return func(o *evOpts) { o.specKind = v } }

// extra appends keys after the declared fields, in the order given.
func extra(pairs ...any) opt { return func(o *evOpts) { o.extra = append(o.extra, pairs...) } }

func apply(o evOpts, opts []opt) evOpts {
	for _, f := range opts {
		f(&o)
	}
	return o
}

// vStored is vLLM's map-encoded BlockStored: fields in declaration order,
// fields equal to their default (nil extra_keys, group_idx, spec kind)
// omitted.
func vStored(hashes, parent, tokens any, opts ...opt) omap {
	o := apply(evOpts{medium: "GPU", blockSize: 4, extraKeys: autoExtraKeys{}, groupIdx: 0, specKind: "full_attention"}, opts)
	ev := m("type", "BlockStored", "block_hashes", hashes, "parent_block_hash", parent,
		"token_ids", tokens, "block_size", o.blockSize, "lora_id", o.loraID,
		"medium", o.medium, "lora_name", o.loraName)
	if _, auto := o.extraKeys.(autoExtraKeys); auto {
		o.extraKeys = make([]any, reflect.ValueOf(hashes).Len())
	}
	if o.extraKeys != nil {
		ev = ev.with("extra_keys", o.extraKeys)
	}
	if o.groupIdx != nil {
		ev = ev.with("group_idx", o.groupIdx)
	}
	if o.specKind != nil {
		ev = ev.with("kv_cache_spec_kind", o.specKind)
	}
	return ev.with(o.extra...)
}

// vRemoved is vLLM's BlockRemoved.
func vRemoved(hashes any, opts ...opt) omap {
	o := apply(evOpts{medium: "GPU", groupIdx: 0}, opts)
	ev := m("type", "BlockRemoved", "block_hashes", hashes, "medium", o.medium)
	if o.groupIdx != nil {
		ev = ev.with("group_idx", o.groupIdx)
	}
	return ev.with(o.extra...)
}

var vCleared = m("type", "AllBlocksCleared")

// batch is the positional envelope every publisher sends.
func batch(ts any, events []any, dp any) []any { return []any{ts, events, dp} }

func vBatch(events ...any) []any { return batch(vts, events, 0) }

// sStored is SGLang's map-encoded BlockStored (tag first, nil medium
// omitted).
func sStored(hashes, parent, tokens any, opts ...opt) omap {
	o := apply(evOpts{medium: "GPU", blockSize: 4}, opts)
	ev := m("type", "BlockStored", "block_hashes", hashes, "parent_block_hash", parent,
		"token_ids", tokens, "block_size", o.blockSize, "lora_id", o.loraID)
	if o.medium != nil {
		ev = ev.with("medium", o.medium)
	}
	return ev.with(o.extra...)
}

func sRemoved(hashes any, opts ...opt) omap {
	o := apply(evOpts{medium: "GPU"}, opts)
	ev := m("type", "BlockRemoved", "block_hashes", hashes)
	if o.medium != nil {
		ev = ev.with("medium", o.medium)
	}
	return ev
}

// mo are the knobs of a Mooncake master event; zero fields take the
// defaults of the fixtures' pool-a master.
type mo struct {
	key, medium, group any
	model              string
	tenant, backend    string
	nilBlockSize       bool
	eventID, ts        int64
	noLegacy           bool
}

// mEvent is the key-agnostic master's event map in its packing order; with
// legacy compatibility on (the default) it also carries type, block_hashes
// and, on stored, parent_block_hash. Cleared events have the common fields
// only.
func mEvent(kind string, o mo) omap {
	if o.tenant == "" {
		o.tenant = "default"
	}
	if o.backend == "" {
		o.backend = "pool-a"
	}
	if o.model == "" {
		o.model = "test-model"
	}
	if o.eventID == 0 {
		o.eventID = 1
	}
	if o.ts == 0 {
		o.ts = mts
	}
	var bs any = 4
	if o.nilBlockSize {
		bs = nil
	}
	legacyType := map[string]string{"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}[kind]
	ev := m("event_id", o.eventID, "timestamp", o.ts, "event_type", kind)
	if !o.noLegacy {
		ev = ev.with("type", legacyType)
	}
	med := o.medium
	if kind == "cleared" {
		med = nil
	}
	ev = ev.with("model_name", o.model, "block_size", bs, "additional_salt", nil,
		"lora_name", nil, "tenant_id", o.tenant, "backend_id", o.backend,
		"medium", med, "dp_rank", 0)
	if kind == "cleared" {
		return ev
	}
	ev = ev.with("group_id", o.group, "object_key", o.key, "seq_hashes", []any{})
	if !o.noLegacy {
		ev = ev.with("block_hashes", []any{})
	}
	ev = ev.with("base_block_idx", nil)
	if kind == "stored" {
		ev = ev.with("parent_hash", nil, "token_ids", nil)
		if !o.noLegacy {
			ev = ev.with("parent_block_hash", nil)
		}
	}
	return ev
}

func mBatch(events ...any) []any { return batch(mts, events, 0) }

// seq8 is a sequence frame: 8 bytes, big-endian.
func seq8(n uint64) []byte {
	b := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		b[i] = byte(n)
		n >>= 8
	}
	return b
}

// Expectations.

func ok(effects []any, events ...any) omap {
	return m("envelope", "accept", "seq_advances", true, "effects", nonNil(effects), "events", nonNil(events))
}

func envReject(reason string) omap {
	return m("envelope", "reject", "reason", reason, "seq_advances", true, "effects", []any{})
}

func nonNil(s []any) []any {
	if s == nil {
		return []any{}
	}
	return s
}

func decimal[T int64 | uint64](vs ...T) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		switch x := any(v).(type) {
		case int64:
			out[i] = strconv.FormatInt(x, 10)
		case uint64:
			out[i] = strconv.FormatUint(x, 10)
		}
	}
	return out
}

func store(tier, owner string, prefixes ...uint64) omap {
	return m("op", "store", "tier", tier, "owner", owner, "prefixes", decimal(prefixes...))
}

// storeGroup and removeGroup are store and remove in a KV-cache group
// other than 0 (docs/hybrid.md).
func storeGroup(tier, owner string, group int, prefixes ...uint64) omap {
	return store(tier, owner, prefixes...).with("group", group)
}

func removeGroup(tier, owner string, group int, prefixes ...uint64) omap {
	return remove(tier, owner, prefixes...).with("group", group)
}

func remove(tier, owner string, prefixes ...uint64) omap {
	return m("op", "remove", "tier", tier, "owner", owner, "prefixes", decimal(prefixes...))
}

func repeat(s string, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = s
	}
	return out
}
