package registry

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// GroupDecl is one entry of a registration's kv_cache_groups, the
// declared layout of a hybrid model's KV-cache groups (docs/hybrid.md#declaration),
// as the client wrote it: 0 stands for an absent sliding_window or
// chunk_size.
type GroupDecl struct {
	Kind          string
	BlockSize     int
	SlidingWindow int
	ChunkSize     int
}

// KVCacheGroups is a validated declaration, by group index. It is an array
// so that Service stays comparable (sameConfig).
type KVCacheGroups struct {
	N      int
	Groups [index.MaxGroups]index.GroupSpec
	// Kinds are the declared kind names, for /debug/explain and for
	// recreating the registration body.
	Kinds [index.MaxGroups]string
}

// Specs returns the declared groups (nil when none were declared).
func (g *KVCacheGroups) Specs() []index.GroupSpec {
	if g.N == 0 {
		return nil
	}
	return g.Groups[:g.N:g.N]
}

// Decls returns the declaration as the client wrote it.
func (g *KVCacheGroups) Decls() []GroupDecl {
	out := make([]GroupDecl, g.N)
	for i := range out {
		s := g.Groups[i]
		out[i] = GroupDecl{Kind: g.Kinds[i], BlockSize: s.BlockSize, SlidingWindow: s.SlidingWindow, ChunkSize: s.ChunkSize}
	}
	return out
}

// knownKinds are the kv_cache_spec_kind names a declaration may use: the
// ones vLLM publishes (docs/hybrid.md#kinds).
var knownKinds = map[string]bool{
	"full_attention": true, "mla_attention": true, "sink_full_attention": true,
	"sliding_window": true, "sliding_window_mla": true, "chunked_local_attention": true,
	"mamba": true, "cross_attention": true, "encoder_only_attention": true,
}

// MaxGroupTokens bounds a declared block size, window or chunk.
const MaxGroupTokens = 1 << 30

// checkGroups validates a declaration against the registration: a vLLM
// engine's, at most index.MaxGroups entries, known kinds, group block sizes
// that are multiples of the registration's block_size (the hash block
// size) whose gcd is that block_size, a window exactly on sliding kinds
// and a chunk exactly on chunked local attention.
func checkGroups(r *Registration, typ sourcetype.Type) (KVCacheGroups, error) {
	var out KVCacheGroups
	if r.KVCacheGroups == nil {
		return out, nil
	}
	const f = "kv_cache_groups"
	switch {
	case typ != sourcetype.VLLM:
		return out, ruleErrorf(f, "kv_cache_groups applies to vLLM registrations only")
	case len(r.KVCacheGroups) == 0:
		return out, ruleErrorf(f, "kv_cache_groups must not be empty")
	case len(r.KVCacheGroups) > index.MaxGroups:
		return out, ruleErrorf(f, "kv_cache_groups has %d groups, the limit is %d", len(r.KVCacheGroups), index.MaxGroups)
	}
	g := 0
	for i, d := range r.KVCacheGroups {
		at := func(format string, args ...any) error {
			return ruleErrorf(f, "group %d: %s", i, fmt.Sprintf(format, args...))
		}
		if !knownKinds[d.Kind] {
			return out, at("unknown kind %q", d.Kind)
		}
		kind := index.KindOf(d.Kind)
		switch {
		case d.BlockSize <= 0 || d.BlockSize > MaxGroupTokens:
			return out, at("block_size must be in 1..%d", MaxGroupTokens)
		case d.BlockSize%r.BlockSize != 0:
			return out, at("block_size %d is not a multiple of the registration's block_size %d (the hash block size)", d.BlockSize, r.BlockSize)
		case kind == index.KindSliding && (d.SlidingWindow <= 0 || d.SlidingWindow > MaxGroupTokens):
			return out, at("a %s group needs sliding_window in 1..%d", d.Kind, MaxGroupTokens)
		case kind != index.KindSliding && d.SlidingWindow != 0:
			return out, at("sliding_window is for sliding-window kinds only")
		case kind == index.KindChunked && (d.ChunkSize <= 0 || d.ChunkSize > MaxGroupTokens || d.ChunkSize%d.BlockSize != 0):
			return out, at("a chunked_local_attention group needs chunk_size, a multiple of its block_size, up to %d", MaxGroupTokens)
		case kind != index.KindChunked && d.ChunkSize != 0:
			return out, at("chunk_size is for chunked_local_attention only")
		}
		if kind != index.KindUncached {
			g = gcdInt(g, d.BlockSize)
		}
		out.Groups[i] = index.GroupSpec{Kind: kind, BlockSize: d.BlockSize, SlidingWindow: d.SlidingWindow, ChunkSize: d.ChunkSize}
		out.Kinds[i] = d.Kind
	}
	if g != 0 && g != r.BlockSize {
		return out, ruleErrorf(f, "the groups' block sizes have gcd %d; the registration's block_size must be that hash block size", g)
	}
	out.N = len(r.KVCacheGroups)
	return out, nil
}

func gcdInt(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
