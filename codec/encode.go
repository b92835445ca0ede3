package codec

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Responses are written with append-style encoders in the smallest format
// for each value (what Python's msgpack.packb produces), with map keys in the
// contract's documented order. Hand-writing them keeps /query at zero
// allocations; tests decode every response with vmihailenco/msgpack as an
// independent reader.

func appendMapLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n < 1<<16:
		return append(b, 0xde, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

func appendArrayLen(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return append(b, 0xdc, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

func appendStr(b []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = append(b, 0xda, byte(n>>8), byte(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		u := uint64(v)
		switch {
		case u < 128:
			return append(b, byte(u))
		case u < 1<<8:
			return append(b, 0xcc, byte(u))
		case u < 1<<16:
			return append(b, 0xcd, byte(u>>8), byte(u))
		case u < 1<<32:
			return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
		}
		return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
	}
	switch {
	case v >= -32:
		return append(b, byte(v))
	case v >= -128:
		return append(b, 0xd0, byte(v))
	case v >= -32768:
		return append(b, 0xd1, byte(v>>8), byte(v))
	case v >= -1<<31:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func appendNil(b []byte) []byte { return append(b, 0xc0) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

func appendUint(b []byte, v uint64) []byte {
	if v <= math.MaxInt64 {
		return appendInt(b, int64(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// AppendError writes the contract's 400 body {error, reason, field?, index?}.
func AppendError(b []byte, e *Error) []byte {
	n := 2
	if e.Field != "" {
		n++
	}
	if e.Index != NoIndex {
		n++
	}
	b = appendMapLen(b, n)
	b = appendStr(appendStr(b, "error"), e.Msg)
	b = appendStr(appendStr(b, "reason"), string(e.Reason))
	if e.Field != "" {
		b = appendStr(appendStr(b, "field"), e.Field)
	}
	if e.Index != NoIndex {
		b = appendInt(appendStr(b, "index"), int64(e.Index))
	}
	return b
}

// AppendMessage writes the service-level error envelope {error}.
func AppendMessage(b []byte, msg string) []byte {
	return appendStr(appendStr(appendMapLen(b, 1), "error"), msg)
}

// AppendRegistered writes the /register success body.
func AppendRegistered(b []byte, instanceID string) []byte {
	b = appendMapLen(b, 2)
	b = appendStr(appendStr(b, "status"), "registered successfully")
	return appendStr(appendStr(b, "instance_id"), instanceID)
}

// AppendUnregistered writes the /unregister success body.
func AppendUnregistered(b []byte, keys ...registry.ServiceKey) []byte {
	b = appendMapLen(b, 2)
	b = appendStr(appendStr(b, "status"), "unregistered successfully")
	b = appendArrayLen(appendStr(b, "removed_instances"), len(keys))
	for _, k := range keys {
		b = appendStr(b, string(k))
	}
	return b
}

func appendTiers(b []byte, c index.TierCounts) []byte {
	b = appendInt(appendStr(b, "device"), int64(c.Device))
	b = appendInt(appendStr(b, "cpu_local"), int64(c.CPULocal))
	b = appendInt(appendStr(b, "cpu_share"), int64(c.CPUShare))
	return appendInt(appendStr(b, "disk"), int64(c.Disk))
}

// appendRankKey writes a dp rank as the decimal-string map key the contract
// uses, without allocating.
func appendRankKey(b []byte, rank int) []byte {
	var tmp [20]byte
	d := strconv.AppendInt(tmp[:0], int64(rank), 10)
	b = append(b, 0xa0|byte(len(d)))
	return append(b, d...)
}

// AppendQuery writes the /query response for res.
func AppendQuery(b []byte, res *index.QueryResult) []byte {
	b = appendMapLen(appendStr(appendMapLen(b, 1), "instances"), len(res.Instances))
	for i := range res.Instances {
		in := &res.Instances[i]
		b = appendStr(b, in.Instance)
		b = appendMapLen(b, 7)
		b = appendInt(appendStr(b, "longest_matched"), int64(in.Max.Disk))
		b = appendMapLen(appendStr(b, "dp"), len(in.Ranks))
		for _, r := range in.Ranks {
			b = appendInt(appendRankKey(b, r.Rank), int64(r.Device))
		}
		b = appendMapLen(appendStr(b, "rank_matches"), len(in.Ranks))
		for _, r := range in.Ranks {
			b = appendTiers(appendMapLen(appendRankKey(b, r.Rank), 4), r.TierCounts)
		}
		b = appendTiers(b, in.Max)
	}
	return b
}

func appendProfile(b []byte, p *hashing.Profile) []byte {
	if p.IsStandard() {
		// The standard hash has a seed and nothing else: no root, no
		// projection (docs/api.md#hash-profiles).
		b = appendMapLen(b, 3)
		b = appendStr(appendStr(b, "strategy"), p.Strategy)
		b = appendStr(appendStr(b, "algorithm"), p.Algorithm)
		return appendStr(appendStr(b, "seed"), p.Seed)
	}
	b = appendMapLen(b, 5)
	b = appendStr(appendStr(b, "strategy"), p.Strategy)
	b = appendStr(appendStr(b, "algorithm"), p.Algorithm)
	b = appendStr(appendStr(b, "python_hash_seed"), p.PythonHashSeed)
	b = appendStr(appendStr(b, "root_digest"), p.RootDigestHex())
	return appendStr(appendStr(b, "index_projection"), p.IndexProjection)
}

// AppendServices writes the /services body with the contract's PascalCase
// names. withSource adds each source's State, StateDetail,
// PublisherRestarts and StaleRecoveries, for the JSON form people read; the MessagePack body
// keeps the contract's fields only.
func AppendServices(b []byte, svcs []registry.ServiceStatus, withSource bool) []byte {
	b = appendMapLen(b, 2)
	b = appendInt(appendStr(b, "count"), int64(len(svcs)))
	b = appendArrayLen(appendStr(b, "services"), len(svcs))
	for i := range svcs {
		s := &svcs[i].Service
		if withSource {
			b = appendMapLen(b, 15)
		} else {
			b = appendMapLen(b, 11)
		}
		b = appendStr(appendStr(b, "Endpoint"), s.Endpoint)
		b = appendStr(appendStr(b, "ReplayEndpoint"), s.ReplayEndpoint)
		b = appendStr(appendStr(b, "Type"), s.Type.String())
		b = appendStr(appendStr(b, "ModelName"), s.ModelName)
		b = appendStr(appendStr(b, "LoraName"), s.LoraName)
		b = appendStr(appendStr(b, "TenantID"), s.TenantID)
		b = appendStr(appendStr(b, "InstanceID"), s.InstanceID)
		b = appendInt(appendStr(b, "BlockSize"), int64(s.BlockSize))
		b = appendInt(appendStr(b, "DPRank"), int64(s.DPRank))
		b = appendStr(b, "CacheGroup")
		if s.CacheGroup == nil {
			b = appendNil(b)
		} else {
			b = appendInt(b, int64(*s.CacheGroup))
		}
		b = appendProfile(appendStr(b, "HashProfile"), &s.Profile)
		if withSource {
			b = appendStr(appendStr(b, "State"), svcs[i].State)
			b = appendStr(appendStr(b, "StateDetail"), svcs[i].StateDetail)
			b = appendInt(appendStr(b, "PublisherRestarts"), int64(svcs[i].Restarts))
			b = appendInt(appendStr(b, "StaleRecoveries"), int64(svcs[i].StaleRecoveries))
		}
	}
	return b
}

// AppendGlobalView writes the /global_view body.
func AppendGlobalView(b []byte, ctxs []registry.ContextView) []byte {
	b = appendMapLen(b, 2)
	b = appendInt(appendStr(b, "context_count"), int64(len(ctxs)))
	b = appendArrayLen(appendStr(b, "contexts"), len(ctxs))
	for i := range ctxs {
		c := &ctxs[i]
		b = appendMapLen(b, 7)
		b = appendStr(appendStr(b, "model_name"), c.Context.Model)
		b = appendStr(appendStr(b, "lora_name"), c.Context.Lora)
		b = appendInt(appendStr(b, "block_size"), int64(c.Context.BlockSize))
		b = appendStr(appendStr(b, "tenant_id"), c.Context.Tenant)
		b = appendInt(appendStr(b, "prefix_count"), int64(c.PrefixCount))
		b = appendProfile(appendStr(b, "hash_profile"), &c.Profile)
		b = appendMapLen(appendStr(b, "instances"), len(c.Instances))
		for _, id := range sortedKeys(c.Instances) {
			ranks := c.Instances[id]
			b = appendArrayLen(appendStr(b, id), len(ranks))
			for _, r := range ranks {
				b = appendInt(b, int64(r))
			}
		}
	}
	return b
}

func sortedKeys(m map[string][]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// AppendStatus writes the health bodies {status[, stale_sources]}; stale < 0
// omits the count.
func AppendStatus(b []byte, status string, stale int) []byte {
	n := 1
	if stale >= 0 {
		n = 2
	}
	b = appendStr(appendStr(appendMapLen(b, n), "status"), status)
	if stale >= 0 {
		b = appendInt(appendStr(b, "stale_sources"), int64(stale))
	}
	return b
}

// AppendExplain writes the /debug/explain body: whether the context is
// known, each block (key, prompt tokens its end covers, whether it is
// indexed, how many engine owners hold it, its shared tiers) and each
// owner (instance, rank, the four cumulative counts /query reports, the
// block its run stopped at and why).
func AppendExplain(b []byte, known bool, blocks []index.ExplainedBlock, owners []index.OwnerRun) []byte {
	b = appendMapLen(b, 3)
	b = appendBool(appendStr(b, "context_known"), known)
	b = appendArrayLen(appendStr(b, "blocks"), len(blocks))
	for i := range blocks {
		k := &blocks[i]
		b = appendMapLen(b, 5)
		b = appendUint(appendStr(b, "key"), k.Key)
		b = appendInt(appendStr(b, "tokens"), int64(k.Tokens))
		b = appendBool(appendStr(b, "indexed"), k.Indexed)
		b = appendInt(appendStr(b, "engine_holders"), int64(k.EngineHolders))
		n := 0
		for _, t := range []index.Tier{index.CPUShare, index.Disk} {
			if k.Shared&(1<<t) != 0 {
				n++
			}
		}
		b = appendArrayLen(appendStr(b, "shared"), n)
		if k.Shared&(1<<index.CPUShare) != 0 {
			b = appendStr(b, "cpu_share")
		}
		if k.Shared&(1<<index.Disk) != 0 {
			b = appendStr(b, "disk")
		}
	}
	b = appendArrayLen(appendStr(b, "owners"), len(owners))
	for i := range owners {
		o := &owners[i]
		if o.Hybrid != nil {
			b = appendMapLen(b, 7)
		} else {
			b = appendMapLen(b, 5)
		}
		b = appendStr(appendStr(b, "instance_id"), o.Instance)
		b = appendInt(appendStr(b, "dp_rank"), int64(o.Rank))
		b = appendTiers(appendMapLen(appendStr(b, "matched"), 4), o.Counts)
		b = appendInt(appendStr(b, "stopped_at_block"), int64(o.StopBlock))
		b = appendStr(appendStr(b, "reason"), o.Reason.String())
		if h := o.Hybrid; h != nil {
			b = appendStr(b, "stopped_by_group")
			if h.StopGroup < 0 {
				b = appendNil(b)
			} else {
				b = appendInt(b, int64(h.StopGroup))
			}
			b = appendLayout(appendStr(b, "kv_cache_groups"), &h.Layout)
		}
	}
	return b
}

// appendLayout writes a hybrid owner's layout for /debug/explain: whether
// it was declared at registration, and per group index its kind (the rule
// family; "unreported" for a group not heard from yet), block size and
// window or chunk.
func appendLayout(b []byte, l *index.Layout) []byte {
	b = appendMapLen(b, 3)
	b = appendBool(appendStr(b, "declared"), l.Declared)
	b = appendBool(appendStr(b, "too_many_groups"), l.Overflow)
	b = appendArrayLen(appendStr(b, "groups"), len(l.Groups))
	for _, g := range l.Groups {
		n := 2
		if g.SlidingWindow != 0 {
			n++
		}
		if g.ChunkSize != 0 {
			n++
		}
		b = appendMapLen(b, n)
		b = appendStr(appendStr(b, "kind"), g.Kind.String())
		b = appendInt(appendStr(b, "block_size"), int64(g.BlockSize))
		if g.SlidingWindow != 0 {
			b = appendInt(appendStr(b, "sliding_window"), int64(g.SlidingWindow))
		}
		if g.ChunkSize != 0 {
			b = appendInt(appendStr(b, "chunk_size"), int64(g.ChunkSize))
		}
	}
	return b
}
