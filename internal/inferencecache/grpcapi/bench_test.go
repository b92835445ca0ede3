package grpcapi

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/memostore"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/server"
)

// benchServersWith builds one index with a vLLM context in which instance
// i of 8 holds the first (i+1)/8 of an n-token prompt on device, and both
// front doors over it: the HTTP server (for /query) and the gRPC one. memos
// gives both the prefix memo (and each door its token memo).
func benchServersWith(b testing.TB, n int, memos bool) (*server.Server, *Server, []byte, []byte) {
	b.Helper()
	prof := vllmProfile(b)
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	tbl := cat.Ensure(index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}, prof).Table
	tokens := make([]int32, n)
	ids := make([]uint32, n)
	for i := range tokens {
		tokens[i] = int32((i*7919)%150000 + 1)
		ids[i] = uint32(tokens[i])
	}
	keys := slices.Collect(chainKeys(&prof, 16, tokens, "", nil))
	for i := range 8 {
		id := tbl.AddEngineOwner(fmt.Sprintf("inst-%d", i), 0)
		for _, k := range keys[:len(keys)*(i+1)/8] {
			tbl.Store(id, index.Put{Key: k, Tier: index.Device})
		}
	}
	var memo *hashing.Memo
	var tokenMemo *tokenmemo.Memo
	if memos {
		memo, tokenMemo = hashing.NewMemo(64<<20), tokenmemo.New(64<<20)
	}
	engine := query.New(query.Options{Contexts: cat, Memo: memo})
	hs := server.New(server.Options{Contexts: cat, Engine: engine, TokenMemo: tokenMemo, Logger: zerolog.New(io.Discard)})
	// One token memo for both doors, as the service has it.
	gs, err := New(Options{Contexts: cat, Producer: producer.New(producer.Options{Index: ix}), Engine: engine, TokenMemo: tokenMemo, LookupTimeout: time.Minute, Logger: zerolog.New(io.Discard)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(gs.Stop)
	body, err := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "token_ids": tokens})
	if err != nil {
		b.Fatal(err)
	}
	req, err := proto.Marshal(&pb.LookupRouteRequest{TenantId: "default", ModelId: "m", HashScheme: "conductor/vllm_v1/sha256_cbor/0/16", TokenIds: ids})
	if err != nil {
		b.Fatal(err)
	}
	return hs, gs, body, req
}

// lookupOnce is the server's work for one LookupRoute call without the
// transport: the server's handler (decoding with the server's codec into
// a pooled call, the interceptor, the answer), then the server's codec
// encoding the response.
func lookupOnce(b testing.TB, s *Server, raw []byte, out []byte) []byte {
	in := mem.BufferSlice{mem.SliceBuffer(raw)}
	r, err := lookupRouteHandler(s, context.Background(), func(v any) error { return s.codec.Unmarshal(in, v) }, s.unaryInterceptor)
	resp, _ := r.(*pb.LookupRouteResponse)
	if err != nil || resp.GetReasonCode() != PrefixMatch {
		b.Fatalf("%v %v", resp, err)
	}
	data, err := s.codec.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	out = out[:0]
	for _, buf := range data {
		out = append(out, buf.ReadOnlyData()...)
	}
	data.Free()
	return out
}

// BenchmarkLookupVsQuery runs /query's handler and LookupRoute's (decode,
// answer, encode; no transport) side by side on the same index and 8K-token
// prompt: with the memos (the service's defaults) and without.
func BenchmarkLookupVsQuery(b *testing.B) {
	for _, mode := range []string{"memos", "no-memos"} {
		hs, gs, body, req := benchServersWith(b, 8192, mode != "no-memos")
		name := mode
		b.Run(name+"/query", func(b *testing.B) {
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI("/query")
			ctx.Request.Header.SetContentType("application/msgpack")
			for b.Loop() {
				ctx.Request.SetBody(body)
				ctx.Response.Reset()
				hs.Handle(&ctx)
				if ctx.Response.StatusCode() != 200 {
					b.Fatal(ctx.Response.StatusCode())
				}
			}
		})
		b.Run(name+"/lookup", func(b *testing.B) {
			var out []byte
			for b.Loop() {
				out = lookupOnce(b, gs, req, out)
			}
		})
	}
}

// producerDoor is a door over an empty index fed by producers only,
// stopped when the test ends.
func producerDoor(tb testing.TB) *Server {
	tb.Helper()
	ix := index.New(index.Options{})
	s, err := New(Options{Contexts: contexts.New(ix), Producer: producer.New(producer.Options{Index: ix}), LookupTimeout: time.Minute, Logger: zerolog.New(io.Discard)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// chain512 is the 512-block chain figure's setup: a producer-fed scope
// where 4 replicas hold the chain to 128, 256, 384 and 512 blocks, and the
// encoded LookupRoute request for the whole chain (8-byte hashes).
func chain512(tb testing.TB) (*Server, []byte) {
	tb.Helper()
	s := producerDoor(tb)
	keys := make([]uint64, 512)
	for i := range keys {
		keys[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	for r := range 4 {
		s.applyUpdate(update(fmt.Sprintf("r%d", r), chainEntry(t1, 16, keys[:128*(r+1)]...)))
	}
	raw, err := proto.Marshal(chainReq("vllm", 16, keys...))
	if err != nil {
		tb.Fatal(err)
	}
	return s, raw
}

// BenchmarkLookupChain512: a 512-block chain (8-byte hashes) against a
// producer-fed scope where 4 replicas hold it to different depths.
func BenchmarkLookupChain512(b *testing.B) {
	s, raw := chain512(b)
	var out []byte
	for b.Loop() {
		out = lookupOnce(b, s, raw, out)
	}
}

// BenchmarkReportIngest: decoding and applying CacheStateUpdates of 1,024
// chain blocks each, 64 replicas in turn; reports blocks/s.
func BenchmarkReportIngest(b *testing.B) {
	s := producerDoor(b)
	const perUpdate = 1024
	var raws [][]byte
	for r := range 64 {
		keys := make([]uint64, perUpdate)
		for i := range keys {
			keys[i] = uint64(r*perUpdate+i)*0x9e3779b97f4a7c15 + 1
		}
		raw, err := proto.Marshal(update(fmt.Sprintf("r%d", r), chainEntry(t1, 16, keys...)))
		if err != nil {
			b.Fatal(err)
		}
		raws = append(raws, raw)
	}
	i := 0
	for b.Loop() {
		var u pb.CacheStateUpdate
		if err := proto.Unmarshal(raws[i%len(raws)], &u); err != nil {
			b.Fatal(err)
		}
		s.applyUpdate(&u)
		i++
	}
	b.ReportMetric(float64(b.N*perUpdate)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkTokenMemoDecode: the token memo decoding an 8K-id packed run
// (every id three bytes) it has never seen (miss: the run differs in its
// first fingerprinted window, so nothing is found), one sharing its first
// half with a remembered run (half), and one it holds whole (hit). A miss
// and a half are remembered, as the server does for a known context; with
// /query using the memo too (miss-both-doors), remembering also packs the
// ids in MessagePack.
func BenchmarkTokenMemoDecode(b *testing.B) {
	const n = 8192
	run := make([]byte, 0, 3*n)
	for i := range n {
		run = protowire.AppendVarint(run, uint64(1<<14+(i*7919)%(1<<20)))
	}
	// patch writes v (below 2^20) as the three-byte varint of id j.
	patch := func(j, v int) {
		v += 1 << 14
		run[3*j], run[3*j+1], run[3*j+2] = byte(v)|0x80, byte(v>>7)|0x80, byte(v>>14)
	}
	for _, mode := range []string{"miss", "half", "hit", "miss-both-doors"} {
		b.Run(mode, func(b *testing.B) {
			m := tokenmemo.New(memostore.MinBytes)
			m.Use(tokenmemo.Varint)
			if mode == "miss-both-doors" {
				// Remembering also packs the ids for /query.
				m.Use(tokenmemo.MsgPack)
			}
			dst := make([]uint32, 0, n)
			door := tokenmemo.Door{Memo: m, Format: tokenmemo.Varint, Transient: true}
			var s tokenmemo.Session
			i := 0
			for b.Loop() {
				switch mode {
				case "miss", "miss-both-doors": // ids 0 and 70 (bytes 210-212, inside the first window)
					patch(0, i&(1<<20-1))
					patch(70, i>>20)
				case "half":
					patch(n/2, i&(1<<20-1))
					patch(n/2+1, i>>20)
				}
				i++
				s.Begin(&door)
				if _, _, _, ok := decodeRun(&s, dst[:0], run); !ok {
					b.Fatal("decode failed")
				}
				s.Teach()
			}
			b.ReportMetric(float64(hitsOf(m))/float64(b.N), "reused/op")
		})
	}
}

// BenchmarkLookupColdAffinity: a Conductor token_ids lookup of a prompt
// nobody holds (so it is answered with an affinity hint), new every time:
// a 6K-token system prompt shared by every call, then a 2K-token tail of
// its own. Memos as the service has them.
func BenchmarkLookupColdAffinity(b *testing.B) {
	const n, shared = 8192, 6144
	_, gs, _, _ := benchServersWith(b, n, true)
	var run []byte
	for i := range n {
		// Three-byte ids, none of the indexed prompt's (all below 2^20).
		run = protowire.AppendVarint(run, uint64(1<<20+(i*7919)%(1<<20)))
	}
	req, err := proto.Marshal(&pb.LookupRouteRequest{TenantId: "default", ModelId: "m", HashScheme: "conductor/vllm_v1/sha256_cbor/0/16"})
	if err != nil {
		b.Fatal(err)
	}
	req = protowire.AppendTag(req, 9, protowire.BytesType)
	req = protowire.AppendBytes(req, run)
	// The tail's first and last ids tell one call's prompt from another's.
	first, last := len(req)-len(run)+3*shared, len(req)-3
	i := 0
	for b.Loop() {
		v := 1<<20 + i
		for _, at := range []int{first, last} {
			req[at], req[at+1], req[at+2] = byte(v)|0x80, byte(v>>7)|0x80, byte(v>>14)
		}
		i++
		in := mem.BufferSlice{mem.SliceBuffer(req)}
		r, err := lookupRouteHandler(gs, context.Background(), func(v any) error { return gs.codec.Unmarshal(in, v) }, gs.unaryInterceptor)
		if resp, _ := r.(*pb.LookupRouteResponse); err != nil || resp.GetReasonCode() != AffinityHint {
			b.Fatalf("%v %v", resp, err)
		}
	}
	hits, misses := gs.query.Memo().Stats()
	b.ReportMetric(float64(hits)/float64(b.N), "memo-hits/op")
	b.ReportMetric(float64(misses)/float64(b.N), "hashed/op")
}
