package codec

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/registry"
)

// TestDecodeKVCacheGroups: kv_cache_groups' schema errors carry the
// contract's reasons and name the offending group by index.
func TestDecodeKVCacheGroups(t *testing.T) {
	g := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	ok := g("kind", "full_attention", "block_size", 16)
	tests := []struct {
		name   string
		groups any
		want   *errKey
	}{
		{"valid", []any{g("kind", "sliding_window", "block_size", 16, "sliding_window", 128), ok}, nil},
		{"nil optional members", []any{g("kind", "mamba", "block_size", 16, "sliding_window", nil, "chunk_size", nil)}, nil},
		{"not an array", ok, &errKey{InvalidType, "kv_cache_groups", NoIndex}},
		{"element not a map", []any{ok, 3}, &errKey{InvalidType, "kv_cache_groups", 1}},
		{"unknown member", []any{ok, g("kind", "mamba", "block_size", 16, "dtype", "bf16")}, &errKey{UnknownField, "kv_cache_groups.dtype", 1}},
		{"kind missing", []any{g("block_size", 16)}, &errKey{Missing, "kv_cache_groups.kind", 0}},
		{"block size missing", []any{ok, ok, g("kind", "mamba")}, &errKey{Missing, "kv_cache_groups.block_size", 2}},
		{"kind not a string", []any{g("kind", 1, "block_size", 16)}, &errKey{InvalidType, "kv_cache_groups.kind", 0}},
		{"zero block size", []any{g("kind", "mamba", "block_size", 0)}, &errKey{OutOfRange, "kv_cache_groups.block_size", 0}},
		{"window not an integer", []any{g("kind", "sliding_window", "block_size", 16, "sliding_window", "128")}, &errKey{InvalidType, "kv_cache_groups.sliding_window", 0}},
		{"too many", []any{ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok}, &errKey{OutOfRange, "kv_cache_groups", NoIndex}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, e := DecodeRegister(pack(t, with(validRegister(), "kv_cache_groups", tc.groups)), DefaultLimits())
			var got *errKey
			if e != nil {
				got = &errKey{e.Reason, e.Field, e.Index}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s (%v)", diff, e)
			}
		})
	}
	r, e := DecodeRegister(pack(t, with(validRegister(), "kv_cache_groups", []any{g("kind", "sliding_window", "block_size", 16, "sliding_window", 128), ok})), DefaultLimits())
	if e != nil {
		t.Fatal(e)
	}
	want := []registry.GroupDecl{{Kind: "sliding_window", BlockSize: 16, SlidingWindow: 128}, {Kind: "full_attention", BlockSize: 16}}
	if diff := cmp.Diff(want, r.KVCacheGroups); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
}
