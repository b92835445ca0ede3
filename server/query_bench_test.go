package server

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// queryFixture registers instances×ranks in one vLLM context and stores a
// fully matched prompt of n tokens on device for every owner. warm gives
// the server both memos (prefix and token), empty until the first query.
func queryFixture(tb testing.TB, instances, ranks, n int, warm bool) (*Server, []byte) {
	memoBytes := 0
	if warm {
		memoBytes = 64 << 20
	}
	s, bodies := queryFixtureN(tb, instances, ranks, n, 1, memoBytes)
	return s, bodies[0]
}

// queryFixtureN is queryFixture for the given number of distinct prompts
// (the first is queryFixture's), with memos of memoBytes each (0: none).
func queryFixtureN(tb testing.TB, instances, ranks, n, prompts, memoBytes int) (*Server, [][]byte) {
	tb.Helper()
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		tb.Fatal(err)
	}
	port := 20000
	for i := 0; i < instances; i++ {
		for r := 0; r < ranks; r++ {
			port++
			svc := registry.Service{Endpoint: "tcp://127.0.0.1:" + itoa(port), Type: sourcetype.VLLM, ModelName: "m", TenantID: "default",
				InstanceID: "inst-" + itoa(i), BlockSize: 16, DPRank: r, Profile: p}
			if _, err := reg.Register(svc); err != nil {
				tb.Fatal(err)
			}
		}
	}
	c := cat.Get(index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16})
	tbl := c.Table
	var owners []index.OwnerID
	for i := 0; i < instances; i++ {
		for r := 0; r < ranks; r++ {
			owners = append(owners, tbl.AddEngineOwner("inst-"+itoa(i), r))
		}
	}
	var bodies [][]byte
	for p := range prompts {
		tokens := make([]int32, n)
		for i := range tokens {
			tokens[i] = int32((i*7919+p*104729)%150000 + 1)
		}
		ch := hashing.AcquireChain()
		ch.Reset(&c.Profile, 16, tokens, "", "")
		for {
			k, _, ok := ch.Next()
			if !ok {
				break
			}
			for _, id := range owners {
				tbl.Store(id, index.Put{Key: k, Tier: index.Device})
			}
		}
		hashing.ReleaseChain(ch)
		body, err := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "token_ids": tokens})
		if err != nil {
			tb.Fatal(err)
		}
		bodies = append(bodies, body)
	}
	opts := Options{Registry: reg, Contexts: cat, Engine: query.New(query.Options{Contexts: cat, Memo: hashing.NewMemo(memoBytes)}), TokenMemo: tokenmemo.New(memoBytes)}
	return New(opts), bodies
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

func queryCtx(body []byte) *fasthttp.RequestCtx {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/query")
	ctx.Request.Header.SetContentType("application/msgpack")
	ctx.Request.SetBody(body)
	return &ctx
}

// TestQueryHandlerAllocations pins the hot path: a repeated /query through
// the handler (decode, hash chain, walk, encode) allocates nothing, with the
// memos or without.
func TestQueryHandlerAllocations(t *testing.T) {
	if testing.Short() || racebuild.Enabled {
		t.Skip("allocation counts need a normal build")
	}
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "memos"}[warm], func(t *testing.T) {
			testQueryHandlerAllocations(t, warm)
		})
	}
}

func testQueryHandlerAllocations(t *testing.T, warm bool) {
	s, body := queryFixture(t, 8, 2, 1024, warm)
	ctx := queryCtx(body)
	s.Handle(ctx)
	if ctx.Response.StatusCode() != 200 {
		t.Fatalf("status %d: %q", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var got struct {
		Instances map[string]struct {
			LongestMatched int `msgpack:"longest_matched"`
		} `msgpack:"instances"`
	}
	if err := msgpack.Unmarshal(ctx.Response.Body(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Instances) != 8 || got.Instances["inst-3"].LongestMatched != 1024 {
		t.Fatalf("answer %+v", got)
	}
	allocs := testing.AllocsPerRun(50, func() {
		ctx.Response.Reset()
		s.Handle(ctx)
	})
	// sync.Pool may drop an item under GC; allow a fraction, not a
	// per-block or per-instance cost.
	if allocs > 1 {
		t.Errorf("warm /query allocates %.1f times per request, want 0", allocs)
	}
}

// BenchmarkQueryHandler measures server CPU per /query without the network:
// 8 instances × 2 ranks, fully matched prompt of the given length.
func BenchmarkQueryHandler(b *testing.B) {
	for _, n := range []int{8192, 32768} {
		b.Run("tokens="+itoa(n), func(b *testing.B) {
			s, body := queryFixture(b, 8, 2, n, false)
			ctx := queryCtx(body)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				s.Handle(ctx)
			}
		})
		b.Run("tokens="+itoa(n)+"-warm-memo", func(b *testing.B) {
			s, body := queryFixture(b, 8, 2, n, true)
			ctx := queryCtx(body)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				s.Handle(ctx)
			}
		})
	}
}

// BenchmarkQueryVsChain is issue 7's target shape, measured in one run: an
// 8K-token prompt fully matched on 4 instances, through the handler cold (no
// memos), warm (memos holding the prompt), cold-512 (see benchColdMany;
// with memos=on the service's real cold cost, with memos=off the same walk
// without them), and the bare sha256_cbor chain of the same prompt that all
// are judged against. Bodies are packed the way
// Python's msgpack packs a list of ints (smallest format per value), which
// is what a Conductor router sends, and as Go packs []int32 (int32 format).
func BenchmarkQueryVsChain(b *testing.B) {
	const n = 8192
	for _, enc := range []string{"python", "int32"} {
		for _, warm := range []bool{false, true} {
			name := "handler=cold/enc=" + enc
			if warm {
				name = "handler=warm/enc=" + enc
			}
			b.Run(name, func(b *testing.B) { benchRepeated(b, n, enc, warm) })
		}
		// The stretch goal's shape: a warm 32K-token prompt.
		b.Run("handler=warm-32k/enc="+enc, func(b *testing.B) { benchRepeated(b, 4*n, enc, true) })
		for _, memos := range []bool{false, true} {
			b.Run("handler=cold-512/memos="+map[bool]string{false: "off", true: "on"}[memos]+"/enc="+enc, func(b *testing.B) {
				benchColdMany(b, enc, memos)
			})
		}
	}
	b.Run("bare-chain", func(b *testing.B) {
		seed := "0"
		p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
		if err != nil {
			b.Fatal(err)
		}
		tokens := make([]int32, n)
		for i := range tokens {
			tokens[i] = int32(i*7919%150000 + 1)
		}
		b.ReportAllocs()
		for b.Loop() {
			ch := hashing.AcquireChain()
			ch.Reset(&p, 16, tokens, "", "")
			for {
				if _, _, ok := ch.Next(); !ok {
					break
				}
			}
			hashing.ReleaseChain(ch)
		}
	})
}

// benchRepeated sends the same fully matched n-token prompt, packed as enc
// says, to 4 instances again and again, with the memos when warm.
func benchRepeated(b *testing.B, n int, enc string, warm bool) {
	s, body := queryFixture(b, 4, 1, n, warm)
	if enc == "python" {
		body = compactBody(b, body)
	}
	ctx := queryCtx(body)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		s.Handle(ctx)
	}
}

// benchColdMany cycles 512 distinct prompts, all stored on 4 instances
// (a table of 1 M entries, so the walk leaves the CPU caches). With memos,
// they have the smallest budget (64 KiB a shard, about one 8K prompt), so
// each prompt is evicted long before it comes round again: every query
// looks up, misses and is learned, the service's real cold cost.
func benchColdMany(b *testing.B, enc string, memos bool) {
	const n, prompts = 8192, 512
	memoBytes := 0
	if memos {
		memoBytes = 1
	}
	s, bodies := queryFixtureN(b, 4, 1, n, prompts, memoBytes)
	ctxs := make([]*fasthttp.RequestCtx, prompts)
	for i, body := range bodies {
		if enc == "python" {
			body = compactBody(b, body)
		}
		ctxs[i] = queryCtx(body)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ctx := ctxs[i%prompts]
		i++
		ctx.Response.Reset()
		s.Handle(ctx)
	}
	hits, _ := s.query.Memo().Stats()
	tokHits, _ := s.opts.TokenMemo.Stats()
	b.ReportMetric(float64(hits+tokHits)/float64(b.N), "memo-hits/op")
}

// compactBody re-packs a /query body with every integer in its smallest
// format, as Python's msgpack does.
func compactBody(tb testing.TB, body []byte) []byte {
	var v map[string]any
	if err := msgpack.Unmarshal(body, &v); err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(v); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// TestTokenMemoLearnsOnlyAnsweredQueries: a query for a model with no
// context is decoded through the token memo but not remembered, so traffic
// after the last unregistration cannot refill a memo that was just emptied;
// a query with a context is remembered, and its repeat copies every token.
func TestTokenMemoLearnsOnlyAnsweredQueries(t *testing.T) {
	s, body := queryFixture(t, 2, 1, 1024, true)
	var m map[string]any
	if err := msgpack.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	m["model"] = "unregistered"
	other, err := msgpack.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s.Handle(queryCtx(other))
	}
	if b := s.opts.TokenMemo.Bytes(); b != 0 {
		t.Errorf("queries without a context left %d bytes in the token memo", b)
	}
	for range 2 {
		s.Handle(queryCtx(body))
	}
	if hits, _ := s.opts.TokenMemo.Stats(); s.opts.TokenMemo.Bytes() == 0 || hits != 1024 {
		t.Errorf("answered queries: %d bytes remembered, %d tokens copied", s.opts.TokenMemo.Bytes(), hits)
	}
}
