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
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got pb.LookupRouteRequest
		werr := proto.Unmarshal(b, &want)
		gerr := newLookupCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Unmarshal: %v, decodeLookup: %v", werr, gerr)
		}
		if werr != nil {
			return
		}
		if diff := cmp.Diff(&want, &got, protocmp.Transform(), protocmp.IgnoreUnknown()); diff != "" {
			t.Fatalf("(-proto +decodeLookup):\n%s", diff)
		}
	})
}
