package server

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// gptOSS is gpt-oss's layout: group 0 sliding window 128, group 1 full
// attention, both at block size 16 (docs/hybrid.md).
var gptOSS = []index.GroupSpec{
	{Kind: index.KindSliding, BlockSize: 16, SlidingWindow: 128},
	{Kind: index.KindFull, BlockSize: 16},
}

// hybridFixture is queryFixture with every owner given gpt-oss's layout
// and the prompt stored in both of its groups.
func hybridFixture(tb testing.TB, instances, ranks, n int, warm bool) (*Server, []byte) {
	tb.Helper()
	s, body := queryFixture(tb, instances, ranks, n, warm)
	c := s.opts.Contexts.Get(index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16})
	tbl := c.Table
	var q struct {
		Tokens []int32 `msgpack:"token_ids"`
	}
	if err := msgpack.Unmarshal(body, &q); err != nil {
		tb.Fatal(err)
	}
	var owners []index.OwnerID
	for i := 0; i < instances; i++ {
		for r := 0; r < ranks; r++ {
			id := tbl.AddEngineOwner("inst-"+itoa(i), r)
			tbl.SetLayout(id, gptOSS)
			owners = append(owners, id)
		}
	}
	ch := hashing.AcquireChain()
	ch.Reset(&c.Profile, 16, q.Tokens, "", "")
	for {
		k, _, ok := ch.Next()
		if !ok {
			break
		}
		for _, id := range owners {
			tbl.Store(id, index.Put{Key: k, Tier: index.Device, Group: 1})
		}
	}
	hashing.ReleaseChain(ch)
	return s, body
}

// BenchmarkQueryHybrid compares a /query through the handler for gpt-oss's
// two-group layout with a dense model's query of the same fully cached
// prompt (BENCHMARKS.md: the hybrid target is at most 1.5×).
func BenchmarkQueryHybrid(b *testing.B) {
	for _, shape := range [][2]int{{1, 1}, {8, 2}} {
		for _, warm := range []bool{false, true} {
			for _, layout := range []string{"dense", "gpt-oss"} {
				name := "owners=" + itoa(shape[0]) + "x" + itoa(shape[1]) + "/memo=" + map[bool]string{false: "off", true: "warm"}[warm] + "/layout=" + layout
				b.Run(name, func(b *testing.B) {
					fix := queryFixture
					if layout == "gpt-oss" {
						fix = hybridFixture
					}
					s, body := fix(b, shape[0], shape[1], 8192, warm)
					ctx := queryCtx(body)
					s.Handle(ctx)
					if ctx.Response.StatusCode() != 200 {
						b.Fatalf("status %d", ctx.Response.StatusCode())
					}
					b.ReportAllocs()
					for b.Loop() {
						ctx.Response.Reset()
						s.Handle(ctx)
					}
				})
			}
		}
	}
}
