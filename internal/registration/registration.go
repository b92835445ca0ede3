// Package registration is the schema of a registration record: the
// members of a /register body, their types, presence and size limits, read
// from MessagePack. The HTTP door decodes /register bodies with it
// (codec.DecodeRegister) and the state store reads its records, which are
// /register bodies, with it too (internal/state/regstore), so the state
// store does not depend on the HTTP codec (docs/architecture.md). What a
// decoded registration must then pass (the type's name, the endpoints, the
// hash profile's resolution) is the registry's (registry.NewService).
package registration

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/reqfields"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// Limits bound the strings a registration may carry; a string over its
// limit is out_of_range, refused before it is copied.
type Limits struct {
	// MaxIdentityBytes bounds endpoints, type, modelname, tenant_id,
	// instance_id and the hash profile's members.
	MaxIdentityBytes int
	// MaxNameBytes bounds lora_name, which enters hashed bytes; engines
	// hash names this long, so the limit is generous.
	MaxNameBytes int
}

// DefaultLimits are the documented defaults (README "Limits").
func DefaultLimits() Limits {
	return Limits{MaxIdentityBytes: 1024, MaxNameBytes: 256 << 10}
}

// The members of a /register body, as FieldSet bits.
const (
	regEndpoint = iota
	regReplayEndpoint
	regType
	regModelName
	regLoraName
	regTenantID
	regInstanceID
	regBlockSize
	regDPRank
	regHashProfile
	regCacheGroup
	regKVCacheGroups
)

// Decode decodes a /register body under its schema: field names, types,
// presence and size limits. The registration rules (the type's name,
// endpoints, the hash profile's resolution) are the registry's, in
// registry.NewService.
func Decode(body []byte, lim Limits) (registry.Registration, *reqfields.Error) {
	var r registry.Registration
	c, n, e := reqfields.Open(body)
	if e != nil {
		return r, e
	}
	var seen reqfields.FieldSet
	for i := 0; i < n; i++ {
		k, e := c.Key("")
		if e != nil {
			return r, e
		}
		switch string(k) {
		case "endpoint":
			if e = seen.Mark(regEndpoint, "endpoint"); e == nil {
				r.Endpoint, e = c.StrCopy("endpoint", lim.MaxIdentityBytes)
			}
		case "replay_endpoint":
			if e = seen.Mark(regReplayEndpoint, "replay_endpoint"); e == nil {
				r.ReplayEndpoint, e = c.StrCopy("replay_endpoint", lim.MaxIdentityBytes)
			}
		case "type":
			if e = seen.Mark(regType, "type"); e == nil {
				r.Type, e = c.StrCopy("type", lim.MaxIdentityBytes)
			}
		case "modelname":
			if e = seen.Mark(regModelName, "modelname"); e == nil {
				r.ModelName, e = c.StrCopy("modelname", lim.MaxIdentityBytes)
			}
		case "lora_name":
			if e = seen.Mark(regLoraName, "lora_name"); e == nil {
				r.LoraName, e = c.StrCopy("lora_name", lim.MaxNameBytes)
			}
		case "tenant_id":
			if e = seen.Mark(regTenantID, "tenant_id"); e == nil {
				r.TenantID, e = c.StrCopy("tenant_id", lim.MaxIdentityBytes)
			}
		case "instance_id":
			if e = seen.Mark(regInstanceID, "instance_id"); e == nil {
				r.InstanceID, e = c.StrCopy("instance_id", lim.MaxIdentityBytes)
			}
		case "block_size":
			if e = seen.Mark(regBlockSize, "block_size"); e == nil {
				r.BlockSize, e = c.BlockSize()
			}
		case "dp_rank":
			if e = seen.Mark(regDPRank, "dp_rank"); e == nil {
				var v int64
				v, e = c.IntField("dp_rank", 0, reqfields.MaxInt32)
				r.DPRank = int(v)
			}
		case "hash_profile":
			if e = seen.Mark(regHashProfile, "hash_profile"); e == nil {
				r.HashProfile, e = decodeSpec(&c, lim)
			}
		case "cache_group":
			if e = seen.Mark(regCacheGroup, "cache_group"); e == nil {
				r.CacheGroup, e = cacheGroup(&c)
			}
		case "kv_cache_groups":
			if e = seen.Mark(regKVCacheGroups, "kv_cache_groups"); e == nil {
				r.KVCacheGroups, e = decodeGroups(&c, lim)
			}
		default:
			return r, reqfields.Errorf(reqfields.UnknownField, string(k), "unknown field %q", string(k))
		}
		if e != nil {
			return r, e
		}
	}
	for _, req := range []struct {
		bit   int
		field string
	}{
		{regEndpoint, "endpoint"}, {regType, "type"}, {regModelName, "modelname"},
		{regInstanceID, "instance_id"}, {regBlockSize, "block_size"}, {regDPRank, "dp_rank"},
		{regHashProfile, "hash_profile"},
	} {
		if !seen.Has(req.bit) {
			return r, reqfields.Errorf(reqfields.Missing, req.field, "%s is required", req.field)
		}
	}
	return r, nil
}

func cacheGroup(c *reqfields.Cursor) (*int, *reqfields.Error) {
	switch k := c.Kind(); k {
	case msgp.Nil:
		return nil, c.NilValue()
	case msgp.Int:
		v, neg := c.Int()
		if neg || v != 0 {
			return nil, reqfields.Errorf(reqfields.Unsupported, "cache_group", "only cache_group 0 is supported")
		}
		zero := 0
		return &zero, nil
	default:
		return nil, reqfields.Errorf(reqfields.InvalidType, "cache_group", "cache_group must be an integer or nil, got %s", k)
	}
}

const (
	hpStrategy = iota
	hpAlgorithm
	hpProjection
	hpSeed
	hpStdSeed
)

// decodeSpec decodes hash_profile. An error about one of its members
// names the member itself in Field ("strategy", "root_digest"), as
// upstream Conductor does, while the message keeps the dotted path for a
// reader; an error about hash_profile as a whole names "hash_profile".
func decodeSpec(c *reqfields.Cursor, lim Limits) (hashing.Spec, *reqfields.Error) {
	s, e := decodeSpecMembers(c, lim)
	if e != nil && strings.HasPrefix(e.Field, "hash_profile.") {
		e.Field = e.Field[len("hash_profile."):]
	}
	return s, e
}

func decodeSpecMembers(c *reqfields.Cursor, lim Limits) (hashing.Spec, *reqfields.Error) {
	var s hashing.Spec
	if k := c.Kind(); k != msgp.Map {
		return s, reqfields.Errorf(reqfields.InvalidType, "hash_profile", "hash_profile must be a map, got %s", k)
	}
	n, err := c.MapLen()
	if err != nil {
		return s, reqfields.ErrUnchecked
	}
	var seen reqfields.FieldSet
	for i := 0; i < n; i++ {
		k, e := c.Key("hash_profile")
		if e != nil {
			return s, e
		}
		switch string(k) {
		case "strategy":
			if e = seen.Mark(hpStrategy, "hash_profile.strategy"); e == nil {
				s.Strategy, e = c.StrCopy("hash_profile.strategy", lim.MaxIdentityBytes)
			}
		case "algorithm":
			if e = seen.Mark(hpAlgorithm, "hash_profile.algorithm"); e == nil {
				s.Algorithm, e = c.StrCopy("hash_profile.algorithm", lim.MaxIdentityBytes)
			}
		case "index_projection":
			if e = seen.Mark(hpProjection, "hash_profile.index_projection"); e == nil {
				s.IndexProjection, e = c.StrCopy("hash_profile.index_projection", lim.MaxIdentityBytes)
			}
		case "python_hash_seed":
			if e = seen.Mark(hpSeed, "hash_profile.python_hash_seed"); e == nil {
				if c.Kind() == msgp.Nil {
					e = c.NilValue()
					break
				}
				var seed string
				seed, e = c.StrCopy("hash_profile.python_hash_seed", lim.MaxIdentityBytes)
				s.PythonHashSeed = &seed
			}
		case "seed":
			// rfc1527's seed (docs/hashing.md#standard-hash-rfc1527): a
			// member of that strategy only, checked once the strategy
			// is known.
			if e = seen.Mark(hpStdSeed, "hash_profile.seed"); e == nil {
				var seed string
				seed, e = c.StrCopy("hash_profile.seed", lim.MaxIdentityBytes)
				s.Seed = &seed
			}
		default:
			f := "hash_profile." + string(k)
			return s, reqfields.Errorf(reqfields.UnknownField, f, "unknown field %q", f)
		}
		if e != nil {
			return s, e
		}
	}
	if seen.Has(hpStrategy) && s.Strategy == hashing.StrategyRFC1527 {
		// The standard hash has no projection and no Python seed: as
		// for any strategy, a member it does not take is unknown.
		for _, m := range []struct {
			bit   int
			field string
		}{{hpProjection, "index_projection"}, {hpSeed, "python_hash_seed"}} {
			if seen.Has(m.bit) {
				return s, reqfields.Errorf(reqfields.UnknownField, "hash_profile."+m.field, "unknown field %q for strategy rfc1527", "hash_profile."+m.field)
			}
		}
		if !seen.Has(hpAlgorithm) {
			return s, reqfields.Errorf(reqfields.Missing, "hash_profile.algorithm", "hash_profile.algorithm is required")
		}
		return s, nil
	}
	if seen.Has(hpStdSeed) {
		return s, reqfields.Errorf(reqfields.UnknownField, "hash_profile.seed", "unknown field %q (only strategy rfc1527 takes a seed)", "hash_profile.seed")
	}
	for _, req := range []struct {
		bit   int
		field string
	}{{hpStrategy, "strategy"}, {hpAlgorithm, "algorithm"}, {hpProjection, "index_projection"}} {
		if !seen.Has(req.bit) {
			return s, reqfields.Errorf(reqfields.Missing, "hash_profile."+req.field, "hash_profile.%s is required", req.field)
		}
	}
	return s, nil
}

// kv_cache_groups is an extension of /register that upstream routers never
// send (docs/hybrid.md#declaration): an array, by group index, of
// {kind, block_size, sliding_window?, chunk_size?}. The schema is checked
// here, with the offending element's index; the rules are the registry's.

const (
	kgKind = iota
	kgBlockSize
	kgWindow
	kgChunk
)

const groupsField = "kv_cache_groups"

func decodeGroups(c *reqfields.Cursor, lim Limits) ([]registry.GroupDecl, *reqfields.Error) {
	if k := c.Kind(); k != msgp.Array {
		return nil, reqfields.Errorf(reqfields.InvalidType, groupsField, "kv_cache_groups must be an array, got %s", k)
	}
	n, err := c.ArrayLen()
	if err != nil {
		return nil, reqfields.ErrUnchecked
	}
	if n > index.MaxGroups {
		return nil, reqfields.Errorf(reqfields.OutOfRange, groupsField, "kv_cache_groups has %d groups, the limit is %d", n, index.MaxGroups)
	}
	out := make([]registry.GroupDecl, n)
	for i := range out {
		if k := c.Kind(); k != msgp.Map {
			return nil, reqfields.ElemErrorf(reqfields.InvalidType, groupsField, i, "a group must be a map, got %s", k)
		}
		m, err := c.MapLen()
		if err != nil {
			return nil, reqfields.ErrUnchecked
		}
		var seen reqfields.FieldSet
		d := &out[i]
		for j := 0; j < m; j++ {
			k, e := c.Key(groupsField)
			if e != nil {
				e.Index = i
				return nil, e
			}
			var v int64
			switch string(k) {
			case "kind":
				if e = seen.Mark(kgKind, groupsField+".kind"); e == nil {
					d.Kind, e = c.StrCopy(groupsField+".kind", lim.MaxIdentityBytes)
				}
			case "block_size":
				if e = seen.Mark(kgBlockSize, groupsField+".block_size"); e == nil {
					v, e = c.IntField(groupsField+".block_size", 1, registry.MaxGroupTokens)
					d.BlockSize = int(v)
				}
			case "sliding_window":
				if e = seen.Mark(kgWindow, groupsField+".sliding_window"); e == nil && !c.SkipNil(&e) {
					v, e = c.IntField(groupsField+".sliding_window", 1, registry.MaxGroupTokens)
					d.SlidingWindow = int(v)
				}
			case "chunk_size":
				if e = seen.Mark(kgChunk, groupsField+".chunk_size"); e == nil && !c.SkipNil(&e) {
					v, e = c.IntField(groupsField+".chunk_size", 1, registry.MaxGroupTokens)
					d.ChunkSize = int(v)
				}
			default:
				f := groupsField + "." + string(k)
				return nil, reqfields.ElemErrorf(reqfields.UnknownField, f, i, "unknown field %q", f)
			}
			if e != nil {
				e.Index = i
				return nil, e
			}
		}
		for _, req := range []struct {
			bit   int
			field string
		}{{kgKind, "kind"}, {kgBlockSize, "block_size"}} {
			if !seen.Has(req.bit) {
				return nil, reqfields.ElemErrorf(reqfields.Missing, groupsField+"."+req.field, i, "%s.%s is required", groupsField, req.field)
			}
		}
	}
	return out, nil
}

// DecodeService reads a registration back from its record (a /register
// body, as Encode writes it), through the schema and the rules /register
// uses, with the default limits.
func DecodeService(b []byte) (registry.Service, error) {
	reg, e := Decode(b, DefaultLimits())
	if e != nil {
		return registry.Service{}, e
	}
	return registry.NewService(reg)
}

// Encode is the record of svc: the /register body that recreates it,
// with its map keys sorted, so equal registrations have equal records
// (the state store and the shared registry compare them).
func Encode(svc *registry.Service) []byte {
	m := map[string]any{
		"endpoint":    svc.Endpoint,
		"type":        svc.Type.String(),
		"modelname":   svc.ModelName,
		"tenant_id":   svc.TenantID,
		"instance_id": svc.InstanceID,
		"block_size":  svc.BlockSize,
		"dp_rank":     svc.DPRank,
		"hash_profile": map[string]any{
			"strategy":         svc.Profile.Strategy,
			"algorithm":        svc.Profile.Algorithm,
			"index_projection": svc.Profile.IndexProjection,
			"python_hash_seed": svc.Profile.PythonHashSeed,
		},
	}
	if svc.Profile.IsStandard() {
		m["hash_profile"] = map[string]any{"strategy": svc.Profile.Strategy, "algorithm": svc.Profile.Algorithm, "seed": svc.Profile.Seed}
	}
	if svc.ReplayEndpoint != "" {
		m["replay_endpoint"] = svc.ReplayEndpoint
	}
	if svc.LoraName != "" {
		m["lora_name"] = svc.LoraName
	}
	if svc.CacheGroup != nil {
		m["cache_group"] = *svc.CacheGroup
	}
	if svc.Groups.N > 0 {
		var gs []any
		for _, d := range svc.Groups.Decls() {
			g := map[string]any{"kind": d.Kind, "block_size": d.BlockSize}
			if d.SlidingWindow != 0 {
				g["sliding_window"] = d.SlidingWindow
			}
			if d.ChunkSize != 0 {
				g["chunk_size"] = d.ChunkSize
			}
			gs = append(gs, g)
		}
		m["kv_cache_groups"] = gs
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(m); err != nil {
		// Strings, ints and maps of them always encode.
		panic(fmt.Sprintf("registration: encode: %v", err))
	}
	return buf.Bytes()
}
