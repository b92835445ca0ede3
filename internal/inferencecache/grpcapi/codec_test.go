package grpcapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
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
	// Runs of block hashes of one length, broken by other lengths, an
	// empty hash, one past a one-byte length, and another field.
	mixed := &pb.LookupRouteRequest{TenantId: "t"}
	for _, l := range []int{8, 8, 8, 3, 3, 8, 0, 0, 200, 8, 127, 127} {
		mixed.BlockHashes = append(mixed.BlockHashes, make([]byte, l))
	}
	b3, _ := proto.Marshal(mixed)
	f.Add(b3)
	f.Add(b3[:len(b3)-5]) // a hash cut short
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
	memo := newLookupCodec(tokenmemo.New(1 << 20)) // shared across inputs, so later ones hit
	// One pooled call per codec, reused by every input as the server
	// reuses them: whatever an earlier request left in its buffers must
	// not show through.
	calls := []*lookupCall{new(lookupCall), new(lookupCall), new(lookupCall)}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want pb.LookupRouteRequest
		werr := proto.Unmarshal(b, &want)
		for i, c := range []lookupCodec{plain, memo, memo} {
			for _, pooled := range []bool{false, true} {
				var got *pb.LookupRouteRequest
				var gerr error
				if pooled {
					gerr = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, calls[i])
					got = &calls[i].req
					if gerr == nil {
						// As the server does for a lookup with a context.
						calls[i].bufs.memo.Teach()
					}
				} else {
					got = new(pb.LookupRouteRequest)
					gerr = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got)
				}
				if (werr == nil) != (gerr == nil) {
					t.Fatalf("proto.Unmarshal: %v, decodeLookup (memo %v, pooled %v): %v", werr, c.memo.Memo != nil, pooled, gerr)
				}
				if werr != nil {
					continue
				}
				if pooled && calls[i].bufs.idsNarrow && !fitInt32(got.TokenIds) {
					t.Fatalf("ids past MaxInt32 reported narrow (memo %v)", c.memo.Memo != nil)
				}
				if diff := cmp.Diff(&want, got, protocmp.Transform(), protocmp.IgnoreUnknown()); diff != "" {
					t.Fatalf("(-proto +decodeLookup, memo %v, pooled %v):\n%s", c.memo.Memo != nil, pooled, diff)
				}
			}
			calls[i].release()
			calls[i] = lookupCalls.Get().(*lookupCall)
		}
	})
}

// TestTokenMemoReuses: a repeated run is copied whole, a run sharing a
// prefix reuses the chunks inside the shared bytes, and both decode as
// proto.Unmarshal does.
func TestTokenMemoReuses(t *testing.T) {
	c := newLookupCodec(tokenmemo.New(1 << 20))
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
	if h, m := c.memo.Memo.Stats(); h != 0 || m != 1000 {
		t.Fatalf("first decode: %d hits %d misses", h, m)
	}
	decode(ids)
	if h := hitsOf(c.memo.Memo); h != 1000 {
		t.Fatalf("repeat: %d hits", h)
	}
	other := append([]uint32(nil), ids...)
	other[700] = 99
	decode(other)
	if h := hitsOf(c.memo.Memo) - 1000; h != 640 {
		t.Fatalf("shared prefix of 700 ids reused %d (want 10 chunks of 64)", h)
	}
}

// TestFitInt32: every id past MaxInt32 is found, whatever its position,
// the slice's length and its alignment in memory.
func TestFitInt32(t *testing.T) {
	backing := make([]uint32, 80)
	for i := range backing {
		backing[i] = uint32(i) * 0x01000193 & 0x7fffffff
	}
	for off := range 3 {
		for n := range 40 {
			ids := backing[off : off+n]
			if !fitInt32(ids) {
				t.Fatalf("offset %d, %d ids: reported an id past MaxInt32", off, n)
			}
			for i := range ids {
				for _, big := range []uint32{1 << 31, 1<<32 - 1} {
					keep := ids[i]
					ids[i] = big
					if fitInt32(ids) {
						t.Fatalf("offset %d, %d ids: missed %#x at %d", off, n, big, i)
					}
					ids[i] = keep
				}
			}
			// A big id just outside the slice is not its business.
			if off > 0 {
				keep := backing[off-1]
				backing[off-1] = 1 << 31
				if !fitInt32(ids) {
					t.Fatalf("offset %d, %d ids: read before the slice", off, n)
				}
				backing[off-1] = keep
			}
			if off+n < len(backing) {
				keep := backing[off+n]
				backing[off+n] = 1 << 31
				if !fitInt32(ids) {
					t.Fatalf("offset %d, %d ids: read past the slice", off, n)
				}
				backing[off+n] = keep
			}
		}
	}
}

func TestParseConductorScheme(t *testing.T) {
	for _, c := range []struct {
		in         string
		family, ok bool
		want       conductorScheme
	}{
		{"conductor/vllm_v1/sha256_cbor/0/16", true, true, conductorScheme{"vllm_v1", "sha256_cbor", "0", 16}},
		{"conductor/sglang/sha256_raw/-/64", true, true, conductorScheme{"sglang", "sha256_raw", "-", 64}},
		{"vllm", false, false, conductorScheme{}},
		{"conductor/", true, false, conductorScheme{}},
		{"conductor/a/b/c", true, false, conductorScheme{}},
		{"conductor/a/b/c/16/x", true, false, conductorScheme{}},
		{"conductor/a//c/16", true, false, conductorScheme{}},
		{"conductor//b/c/16", true, false, conductorScheme{}},
		{"conductor/a/b//16", true, false, conductorScheme{}},
		{"conductor/a/b/c/016", true, false, conductorScheme{}},
		{"conductor/a/b/c/0", true, false, conductorScheme{}},
		{"conductor/a/b/c/-16", true, false, conductorScheme{}},
		{"conductor/a/b/c/", true, false, conductorScheme{}},
	} {
		got, family, ok := parseConductorScheme(c.in)
		if family != c.family || ok != c.ok || (ok && got != c.want) {
			t.Errorf("%q: %+v family %v ok %v, want %+v %v %v", c.in, got, family, ok, c.want, c.family, c.ok)
		}
	}
}

// hitsOf is the memo's hit count (ids reused).
func hitsOf(m *tokenmemo.Memo) uint64 {
	h, _ := m.Stats()
	return h
}
