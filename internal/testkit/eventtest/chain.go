package eventtest

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// VLLMProfile is the hash profile the tests' vLLM engines use: vllm_v1,
// sha256_cbor, PYTHONHASHSEED 0, keys the digests' low 64 bits.
func VLLMProfile(t testing.TB) hashing.Profile {
	t.Helper()
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ChainKeys are the index keys of tokens' whole blocks of bs tokens under
// p, with no LoRA name or salt: what an engine with that profile
// publishes for the prompt.
func ChainKeys(p *hashing.Profile, bs int, tokens []int32) []uint64 {
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	ch.Reset(p, bs, tokens, "", "")
	var keys []uint64
	for {
		k, _, ok := ch.Next()
		if !ok {
			return keys
		}
		keys = append(keys, k)
	}
}
