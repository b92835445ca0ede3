package eventtest

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// PrefixTable returns an index whose table for ctx (vllm_v1, sha256_cbor,
// PYTHONHASHSEED 0) has owner (a, 0) holding the first 3 blocks of tokens
// on device and owner (b, 1) the first one: the lookup fixture that the
// query engine's tests and the /query handler's share.
func PrefixTable(t testing.TB, ctx index.ContextKey, tokens []int32) *index.Index {
	t.Helper()
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{})
	tbl := ix.EnsureTable(ctx, p)
	a, b := tbl.AddEngineOwner("a", 0), tbl.AddEngineOwner("b", 1)
	ch := hashing.AcquireChain()
	defer hashing.ReleaseChain(ch)
	ch.Reset(tbl.Profile(), ctx.BlockSize, tokens, "", "")
	for i := range 3 {
		k, _, ok := ch.Next()
		if !ok {
			t.Fatal("prompt too short")
		}
		tbl.Store(a, index.Device, k)
		if i == 0 {
			tbl.Store(b, index.Device, k)
		}
	}
	return ix
}
