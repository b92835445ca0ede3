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

// registerTable is a /register body's members, at their bits; a string
// member's slot is its bit. The strings are copied: a registration
// outlives its body. hash_profile, cache_group and kv_cache_groups have
// rules of their own.
var registerTable = reqfields.NewTable("", true, []reqfields.Spec{
	regEndpoint:       {Name: "endpoint", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regEndpoint},
	regReplayEndpoint: {Name: "replay_endpoint", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regReplayEndpoint},
	regType:           {Name: "type", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regType},
	regModelName:      {Name: "modelname", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regModelName},
	regLoraName:       {Name: "lora_name", Shape: reqfields.Str, Limit: reqfields.NameBytes, Slot: regLoraName},
	regTenantID:       {Name: "tenant_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regTenantID},
	regInstanceID:     {Name: "instance_id", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: regInstanceID},
	regBlockSize:      {Name: "block_size", Shape: reqfields.BlockSize, Slot: 0},
	regDPRank:         {Name: "dp_rank", Shape: reqfields.Int, Min: 0, Max: reqfields.MaxInt32, Slot: 1},
	regHashProfile:    {Name: "hash_profile", Shape: reqfields.Own},
	regCacheGroup:     {Name: "cache_group", Shape: reqfields.Own},
	regKVCacheGroups:  {Name: "kv_cache_groups", Shape: reqfields.Own},
})

// byteLimits are lim as a table reads them.
func byteLimits(lim Limits) reqfields.ByteLimits {
	return reqfields.ByteLimits{reqfields.IdentityBytes: lim.MaxIdentityBytes, reqfields.NameBytes: lim.MaxNameBytes}
}

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
	var v reqfields.Values
	lims := byteLimits(lim)
	for {
		id, e := registerTable.Next(&c, &n, &seen, &v, &lims)
		if e != nil {
			return r, e
		}
		if id == reqfields.Done {
			break
		}
		if e = seen.Mark(id, registerTable.Field(id)); e == nil {
			switch id {
			case regHashProfile:
				r.HashProfile, e = decodeSpec(&c, lim)
			case regCacheGroup:
				r.CacheGroup, e = cacheGroup(&c)
			case regKVCacheGroups:
				r.KVCacheGroups, e = decodeGroups(&c, lim)
			}
		}
		if e != nil {
			return r, e
		}
	}
	r.Endpoint, r.ReplayEndpoint, r.Type = v.Str[regEndpoint], v.Str[regReplayEndpoint], v.Str[regType]
	r.ModelName, r.LoraName, r.TenantID, r.InstanceID = v.Str[regModelName], v.Str[regLoraName], v.Str[regTenantID], v.Str[regInstanceID]
	r.BlockSize, r.DPRank = int(v.Int[0]), int(v.Int[1])
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

// specTable is hash_profile's members, at their bits; a member's slot is
// its bit. python_hash_seed may be nil (no seed); rfc1527's seed
// (docs/hashing.md#standard-hash-rfc1527) is a member of that strategy
// only, checked once the strategy is known.
var specTable = reqfields.NewTable("hash_profile.", true, []reqfields.Spec{
	hpStrategy:   {Name: "strategy", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: hpStrategy},
	hpAlgorithm:  {Name: "algorithm", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: hpAlgorithm},
	hpProjection: {Name: "index_projection", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: hpProjection},
	hpSeed:       {Name: "python_hash_seed", Shape: reqfields.OptStr, Limit: reqfields.IdentityBytes, Slot: hpSeed},
	hpStdSeed:    {Name: "seed", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: hpStdSeed},
})

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
	var v reqfields.Values
	lims := byteLimits(lim)
	if _, e := specTable.Next(c, &n, &seen, &v, &lims); e != nil {
		return s, e // no member has rules of its own: Next reads them all
	}
	s.Strategy, s.Algorithm, s.IndexProjection = v.Str[hpStrategy], v.Str[hpAlgorithm], v.Str[hpProjection]
	if v.Given.Has(hpSeed) {
		seed := v.Str[hpSeed]
		s.PythonHashSeed = &seed
	}
	if seen.Has(hpStdSeed) {
		seed := v.Str[hpStdSeed]
		s.Seed = &seed
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

// groupsTable is a group's members, at their bits; an integer member's
// slot is its bit. sliding_window and chunk_size may be nil (not given).
var groupsTable = reqfields.NewTable(groupsField+".", true, []reqfields.Spec{
	kgKind:      {Name: "kind", Shape: reqfields.Str, Limit: reqfields.IdentityBytes, Slot: 0},
	kgBlockSize: {Name: "block_size", Shape: reqfields.Int, Min: 1, Max: registry.MaxGroupTokens, Slot: kgBlockSize},
	kgWindow:    {Name: "sliding_window", Shape: reqfields.OptInt, Min: 1, Max: registry.MaxGroupTokens, Slot: kgWindow},
	kgChunk:     {Name: "chunk_size", Shape: reqfields.OptInt, Min: 1, Max: registry.MaxGroupTokens, Slot: kgChunk},
})

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
	lims := byteLimits(lim)
	for i := range out {
		if k := c.Kind(); k != msgp.Map {
			return nil, reqfields.ElemErrorf(reqfields.InvalidType, groupsField, i, "a group must be a map, got %s", k)
		}
		m, err := c.MapLen()
		if err != nil {
			return nil, reqfields.ErrUnchecked
		}
		var seen reqfields.FieldSet
		var v reqfields.Values
		if _, e := groupsTable.Next(c, &m, &seen, &v, &lims); e != nil {
			e.Index = i // no member has rules of its own: Next reads them all
			return nil, e
		}
		out[i] = registry.GroupDecl{Kind: v.Str[0], BlockSize: int(v.Int[kgBlockSize]), SlidingWindow: int(v.Int[kgWindow]), ChunkSize: int(v.Int[kgChunk])}
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
