package contexts_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// TestSchemeFiling: every context is found under the scheme keys the gRPC
// door's schemes spell its profile with (a vLLM seed as registered, the
// standard hash's seed, an SGLang context under "-" and its registered
// text), by its tenant's model and by its tenant, and under none of them
// once dropped.
func TestSchemeFiling(t *testing.T) {
	vllm := hashing.Profile{Strategy: hashing.StrategyVLLMV1, Algorithm: "sha256", PythonHashSeed: "vllm-none-hash"}
	sglang := hashing.Profile{Strategy: hashing.StrategySGLang, Algorithm: "sha256_raw", PythonHashSeed: "0"}
	std := hashing.Profile{Strategy: hashing.StrategyRFC1527, Algorithm: "xxh3_64", Seed: "7"}
	ctx := func(model, lora string, bs int) index.ContextKey {
		return index.ContextKey{Tenant: "t", Model: model, Lora: lora, BlockSize: bs}
	}
	for _, tc := range []struct {
		name  string
		prof  hashing.Profile
		seeds []string
	}{
		{"vLLM: its seed text", vllm, []string{"vllm-none-hash"}},
		{"SGLang: no seed, or the text it registered", sglang, []string{"-", "0"}},
		{"rfc1527: the standard hash's seed", std, []string{"7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.seeds, contexts.SchemeSeeds(&tc.prof)); diff != "" {
				t.Fatalf("seeds (-want +got):\n%s", diff)
			}
			cat := contexts.New(index.New(index.Options{}))
			base := cat.Ensure(ctx("m", "", 16), tc.prof)
			lora := cat.Ensure(ctx("m", "adapter", 16), tc.prof)
			other := cat.Ensure(ctx("m", "", 32), tc.prof)
			elsewhere := cat.Ensure(ctx("n", "", 16), tc.prof)
			key := func(seed string, bs int) contexts.SchemeKey {
				return contexts.SchemeKey{Tenant: "t", Model: "m", Strategy: tc.prof.Strategy, Algorithm: tc.prof.Algorithm, Seed: seed, BlockSize: bs}
			}
			for _, seed := range tc.seeds {
				if got := set(cat.ByScheme(key(seed, 16))); !cmp.Equal(got, set([]*contexts.Entry{base, lora})) {
					t.Errorf("seed %q, block size 16: %d contexts, want the model's two LoRA names", seed, len(got))
				}
				if got := cat.ByScheme(key(seed, 32)); len(got) != 1 || got[0] != other {
					t.Errorf("seed %q, block size 32: %v, want its one context", seed, got)
				}
			}
			if got := cat.ByScheme(key("another", 16)); len(got) != 0 {
				t.Errorf("another seed finds %d contexts", len(got))
			}
			if got := len(cat.ByModel("t", "m")); got != 3 {
				t.Errorf("ByModel: %d contexts, want 3", got)
			}
			if got := len(cat.ByTenant("t")); got != 4 || cat.ByTenant("u") != nil {
				t.Errorf("ByTenant: %d contexts, want 4 (and none for another tenant)", got)
			}
			for _, k := range []index.ContextKey{ctx("m", "", 16), ctx("m", "adapter", 16), ctx("m", "", 32)} {
				cat.Drop(k)
			}
			if got := cat.ByScheme(key(tc.seeds[0], 16)); len(got) != 0 || len(cat.ByModel("t", "m")) != 0 {
				t.Errorf("dropped contexts still filed: %d", len(got))
			}
			if got := cat.ByTenant("t"); len(got) != 1 || got[0] != elsewhere {
				t.Errorf("ByTenant after the drops: %v, want the other model's context", got)
			}
		})
	}
}

func set(es []*contexts.Entry) map[*contexts.Entry]bool {
	m := map[*contexts.Entry]bool{}
	for _, e := range es {
		m[e] = true
	}
	return m
}
