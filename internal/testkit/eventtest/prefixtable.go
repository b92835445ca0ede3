package eventtest

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
)

// PrefixTable returns a catalogue whose context ctx (vllm_v1, sha256_cbor,
// PYTHONHASHSEED 0) has owner (a, 0) holding the first 3 blocks of tokens
// on device and owner (b, 1) the first one: the lookup fixture that the
// query engine's tests and the /query handler's share.
func PrefixTable(t testing.TB, ctx index.ContextKey, tokens []int32) *contexts.Catalogue {
	t.Helper()
	cat := contexts.New(index.New(index.Options{}))
	c := cat.Ensure(ctx, VLLMProfile(t))
	tbl := c.Table
	a, b := tbl.AddEngineOwner("a", 0), tbl.AddEngineOwner("b", 1)
	keys := ChainKeys(&c.Profile, ctx.BlockSize, tokens)
	if len(keys) < 3 {
		t.Fatal("prompt too short")
	}
	for i, k := range keys[:3] {
		tbl.Store(a, index.Put{Key: k, Tier: index.Device})
		if i == 0 {
			tbl.Store(b, index.Put{Key: k, Tier: index.Device})
		}
	}
	return cat
}
