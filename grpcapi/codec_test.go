package grpcapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/mooncake-conductor-go/conductor/proto/inferencecache/v1alpha1"
)

// FuzzDecodeLookup: the server's LookupRouteRequest decoder accepts and
// rejects exactly what proto.Unmarshal does and yields the same request
// (unknown fields aside, which it drops).
func FuzzDecodeLookup(f *testing.F) {
	for _, r := range []*pb.LookupRouteRequest{
		chainReq("vllm", 16, 1, 2, 3),
		{TenantId: "t", ModelId: "m", HashScheme: "x", TokenIds: []uint32{0, 1, 1 << 31, 1<<32 - 1}, Slo: &pb.SLO{TtftMs: 5, TbtMs: -1}, AdapterId: "a", PromptText: "p", PrefixHash: []byte{1}, PrefixTokenCount: -7},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	// Unpacked repeated scalars and an unknown field.
	var raw []byte
	raw = protowire.AppendTag(raw, 9, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 300)
	raw = protowire.AppendTag(raw, 8, protowire.VarintType)
	raw = protowire.AppendVarint(raw, 1<<40)
	raw = protowire.AppendTag(raw, 99, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte("zz"))
	f.Add(raw)
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe}) // invalid UTF-8 in model_id
	// Long token runs, so the token memo is consulted: the same ids twice,
	// then with a changed tail.
	long := make([]uint32, 600)
	for i := range long {
		long[i] = uint32(i * 977)
	}
	b1, _ := proto.Marshal(&pb.LookupRouteRequest{TokenIds: long})
	f.Add(b1)
	long[590] = 1 << 31
	b2, _ := proto.Marshal(&pb.LookupRouteRequest{TokenIds: long})
	f.Add(b2)
	plain := newLookupCodec(nil)
	memo := newLookupCodec(newTokenMemo(1 << 20)) // shared across inputs, so later ones hit
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.LookupRouteRequest
		werr := proto.Unmarshal(b, &want)
		for _, c := range []lookupCodec{plain, memo, memo} {
			var got pb.LookupRouteRequest
			gerr := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got)
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("proto.Unmarshal: %v, decodeLookup (memo %v): %v", werr, c.memo != nil, gerr)
			}
			if werr != nil {
				continue
			}
			if diff := cmp.Diff(&want, &got, protocmp.Transform(), protocmp.IgnoreUnknown()); diff != "" {
				t.Fatalf("(-proto +decodeLookup, memo %v):\n%s", c.memo != nil, diff)
			}
		}
	})
}

// TestTokenMemoReuses: a repeated run is copied whole, a run sharing a
// prefix reuses the chunks inside the shared bytes, and both decode as
// proto.Unmarshal does.
func TestTokenMemoReuses(t *testing.T) {
	c := newLookupCodec(newTokenMemo(1 << 20))
	ids := make([]uint32, 1000)
	for i := range ids {
		ids[i] = uint32(i*7919) % 150000
	}
	decode := func(ids []uint32) {
		t.Helper()
		b, _ := proto.Marshal(&pb.LookupRouteRequest{TokenIds: ids})
		var got pb.LookupRouteRequest
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
			t.Fatal(err)
		}
		if !cmp.Equal(got.TokenIds, ids) {
			t.Fatal("decoded ids differ")
		}
	}
	decode(ids)
	if h, m := c.memo.hits.Load(), c.memo.misses.Load(); h != 0 || m != 1000 {
		t.Fatalf("first decode: %d hits %d misses", h, m)
	}
	decode(ids)
	if h := c.memo.hits.Load(); h != 1000 {
		t.Fatalf("repeat: %d hits", h)
	}
	other := append([]uint32(nil), ids...)
	other[700] = 99
	decode(other)
	if h := c.memo.hits.Load() - 1000; h != 640 {
		t.Fatalf("shared prefix of 700 ids reused %d (want 10 chunks of 64)", h)
	}
}
