package registry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// TestKVCacheGroupsRules covers every rule of a declared layout; each
// failure names kv_cache_groups and is an invalid_value.
func TestKVCacheGroupsRules(t *testing.T) {
	fa := func(b int) registry.GroupDecl { return registry.GroupDecl{Kind: "full_attention", BlockSize: b} }
	swa := func(b, w int) registry.GroupDecl {
		return registry.GroupDecl{Kind: "sliding_window", BlockSize: b, SlidingWindow: w}
	}
	many := make([]registry.GroupDecl, index.MaxGroups+1)
	for i := range many {
		many[i] = fa(16)
	}
	tests := []struct {
		name   string
		typ    string
		groups []registry.GroupDecl
		ok     bool
	}{
		{"gpt-oss", "vLLM", []registry.GroupDecl{swa(16, 128), fa(16)}, true},
		{"Gemma 4: hash block 16, alignment 32", "vLLM", []registry.GroupDecl{swa(32, 512), fa(16)}, true},
		{"Llama 4", "vLLM", []registry.GroupDecl{{Kind: "chunked_local_attention", BlockSize: 16, ChunkSize: 8192}, fa(16)}, true},
		{"Qwen3.5", "vLLM", []registry.GroupDecl{{Kind: "mamba", BlockSize: 16}, fa(16)}, true},
		{"cross attention beside", "vLLM", []registry.GroupDecl{fa(16), {Kind: "cross_attention", BlockSize: 48}}, true},
		{"SGLang", "SGLang", []registry.GroupDecl{fa(16)}, false},
		{"empty", "vLLM", []registry.GroupDecl{}, false},
		{"too many", "vLLM", many, false},
		{"unknown kind", "vLLM", []registry.GroupDecl{{Kind: "flash", BlockSize: 16}}, false},
		{"zero block", "vLLM", []registry.GroupDecl{fa(0)}, false},
		{"not a multiple", "vLLM", []registry.GroupDecl{fa(24)}, false},
		{"gcd above the hash block", "vLLM", []registry.GroupDecl{fa(32), swa(64, 128)}, false},
		{"window missing", "vLLM", []registry.GroupDecl{swa(16, 0), fa(16)}, false},
		{"window on full attention", "vLLM", []registry.GroupDecl{{Kind: "full_attention", BlockSize: 16, SlidingWindow: 4}}, false},
		{"chunk missing", "vLLM", []registry.GroupDecl{{Kind: "chunked_local_attention", BlockSize: 16}}, false},
		{"chunk not a multiple", "vLLM", []registry.GroupDecl{{Kind: "chunked_local_attention", BlockSize: 16, ChunkSize: 20}}, false},
		{"chunk on mamba", "vLLM", []registry.GroupDecl{{Kind: "mamba", BlockSize: 16, ChunkSize: 32}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := validRegistration()
			r.Type = tc.typ
			if tc.typ == "SGLang" {
				r.HashProfile.Strategy, r.HashProfile.Algorithm, r.HashProfile.IndexProjection, r.HashProfile.PythonHashSeed = "sglang", "sha256_raw", "first64_be", nil
			}
			r.KVCacheGroups = tc.groups
			svc, err := registry.NewService(r)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.groups, svc.Groups.Decls()); diff != "" {
					t.Errorf("declaration (-sent +kept):\n%s", diff)
				}
				return
			}
			re, isRule := err.(*registry.RuleError)
			if !isRule || re.Field != "kv_cache_groups" || re.Missing {
				t.Fatalf("error %#v, want a kv_cache_groups rule error", err)
			}
		})
	}
}

// TestKVCacheGroupsMakeConfigsDiffer: a registration that changes only its
// declaration is a different configuration, not an idempotent repeat.
func TestKVCacheGroupsMakeConfigsDiffer(t *testing.T) {
	r := validRegistration()
	a, err := registry.NewService(r)
	if err != nil {
		t.Fatal(err)
	}
	r.KVCacheGroups = []registry.GroupDecl{{Kind: "full_attention", BlockSize: 16}}
	b, err := registry.NewService(r)
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Error("declaring a layout left the service equal")
	}
	if got := b.Groups.Specs(); len(got) != 1 || got[0] != (index.GroupSpec{Kind: index.KindFull, BlockSize: 16}) {
		t.Errorf("specs %+v", got)
	}
}
