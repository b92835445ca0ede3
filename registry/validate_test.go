package registry_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/registry"
)

func validRegistration() registry.Registration {
	seed := "0"
	return registry.Registration{
		Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5558", Type: "vLLM",
		ModelName: "deepseek", InstanceID: "vllm-prefill-node1", BlockSize: 16,
		HashProfile: hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed},
	}
}

// TestNewServiceRules covers every rule a decoded registration must pass,
// and which member each failure names.
func TestNewServiceRules(t *testing.T) {
	str := func(s string) *string { return &s }
	one := 1
	tests := []struct {
		name string
		edit func(*registry.Registration)
		want *registry.RuleError // Msg not compared
	}{
		{"valid", func(*registry.Registration) {}, nil},
		{"bad type", func(r *registry.Registration) { r.Type = "vllm" }, &registry.RuleError{Field: "type"}},
		{"empty instance", func(r *registry.Registration) { r.InstanceID = "" }, &registry.RuleError{Field: "instance_id"}},
		{"empty modelname", func(r *registry.Registration) { r.ModelName = "" }, &registry.RuleError{Field: "modelname"}},
		{"zero block size", func(r *registry.Registration) { r.BlockSize = 0 }, &registry.RuleError{Field: "block_size"}},
		{"negative dp rank", func(r *registry.Registration) { r.DPRank = -1 }, &registry.RuleError{Field: "dp_rank"}},
		{"cache group 1", func(r *registry.Registration) { r.CacheGroup = &one }, &registry.RuleError{Field: "cache_group"}},
		{"wildcard endpoint", func(r *registry.Registration) { r.Endpoint = "tcp://*:5557" }, &registry.RuleError{Field: "endpoint"}},
		{"no port", func(r *registry.Registration) { r.Endpoint = "tcp://127.0.0.1" }, &registry.RuleError{Field: "endpoint"}},
		{"http endpoint", func(r *registry.Registration) { r.Endpoint = "http://x:1" }, &registry.RuleError{Field: "endpoint"}},
		{"port zero", func(r *registry.Registration) { r.Endpoint = "tcp://h:0" }, &registry.RuleError{Field: "endpoint"}},
		{"ipc endpoint", func(r *registry.Registration) { r.Endpoint = "ipc:///tmp/x.sock" }, nil},
		{"bad replay endpoint", func(r *registry.Registration) { r.ReplayEndpoint = "tcp://" }, &registry.RuleError{Field: "replay_endpoint"}},
		{"empty replay endpoint", func(r *registry.Registration) { r.ReplayEndpoint = "" }, nil},
		{"bad strategy", func(r *registry.Registration) { r.HashProfile.Strategy = "vllm_v2" }, &registry.RuleError{Field: "strategy"}},
		{"bad algorithm", func(r *registry.Registration) { r.HashProfile.Algorithm = "md5" }, &registry.RuleError{Field: "algorithm"}},
		{"bad projection", func(r *registry.Registration) { r.HashProfile.IndexProjection = "first64_be" }, &registry.RuleError{Field: "index_projection"}},
		{"bad seed", func(r *registry.Registration) { r.HashProfile.PythonHashSeed = str("-1") }, &registry.RuleError{Field: "python_hash_seed"}},
		{"seed too large", func(r *registry.Registration) { r.HashProfile.PythonHashSeed = str("4294967296") }, &registry.RuleError{Field: "python_hash_seed"}},
		{"seed missing for vllm", func(r *registry.Registration) { r.HashProfile.PythonHashSeed = nil }, &registry.RuleError{Field: "python_hash_seed", Missing: true}},
		{"vLLM defaults", func(r *registry.Registration) {
			r.HashProfile.Algorithm, r.HashProfile.PythonHashSeed = "sha256", str("vllm-none-hash")
		}, nil},
		{"xxhash", func(r *registry.Registration) { r.HashProfile.Algorithm = "xxhash" }, nil},
		{"xxhash_cbor random", func(r *registry.Registration) {
			r.HashProfile.Algorithm, r.HashProfile.PythonHashSeed = "xxhash_cbor", str("random")
		}, nil},
		{"xxhash without PYTHONHASHSEED", func(r *registry.Registration) {
			r.HashProfile.Algorithm, r.HashProfile.PythonHashSeed = "xxhash", str("vllm-none-hash")
		}, &registry.RuleError{Field: "python_hash_seed"}},
		{"vLLM with sglang profile", func(r *registry.Registration) {
			r.HashProfile = hashing.Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"}
		}, &registry.RuleError{Field: "strategy"}},
		{"SGLang with vllm profile", func(r *registry.Registration) { r.Type = "SGLang" }, &registry.RuleError{Field: "strategy"}},
		{"SGLang profile", func(r *registry.Registration) {
			r.Type = "SGLang"
			r.HashProfile = hashing.Spec{Strategy: "sglang_bigram", Algorithm: "sha256_raw", IndexProjection: "first64_be"}
		}, nil},
		{"type checked before endpoint", func(r *registry.Registration) { r.Type, r.Endpoint = "x", "bad" }, &registry.RuleError{Field: "type"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := validRegistration()
			tc.edit(&r)
			_, err := registry.NewService(r)
			var got *registry.RuleError
			if err != nil {
				var ok bool
				if got, ok = err.(*registry.RuleError); !ok {
					t.Fatalf("error %T %v, want *RuleError", err, err)
				}
				if got.Msg == "" {
					t.Error("rule error without a message")
				}
				got = &registry.RuleError{Field: got.Field, Missing: got.Missing}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("rule error (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNewServiceValues checks what a valid registration becomes: the
// default tenant and the resolved profile.
func TestNewServiceValues(t *testing.T) {
	svc, err := registry.NewService(validRegistration())
	if err != nil {
		t.Fatal(err)
	}
	if svc.TenantID != registry.DefaultTenant || svc.BlockSize != 16 || svc.InstanceID != "vllm-prefill-node1" {
		t.Errorf("service %+v", svc)
	}
	if got := svc.Profile.RootDigestHex(); got != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Errorf("root digest %s", got)
	}
}
