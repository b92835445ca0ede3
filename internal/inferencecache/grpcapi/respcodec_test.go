package grpcapi

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// TestMarshalLookupResponse: the hand-written encoder gives proto.Marshal's
// bytes for every response, edge values and random ones alike, and leaves
// to the generic encoder what it does not write.
func TestMarshalLookupResponse(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	cases := []*pb.LookupRouteResponse{
		{},
		{ReasonCode: NoHint},
		{ReasonCode: AffinityHint, ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "r"}}, AdapterId: "lora"},
		{ReplicaScores: []*pb.ReplicaScore{{}, {Score: negZero, EstimatedCacheHitProb: float32(math.NaN())}}},
		{ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "é", Score: 80, MatchedTokens: -1, EstimatedCacheHitProb: 1, Tier: pb.CacheTier_CACHE_TIER_T3}},
			ReasonCode: PrefixMatch, LookupLatencyUs: -5, TokenIds: []uint32{0, 1, 127, 128, 1 << 31, math.MaxUint32}},
		{LookupLatencyUs: math.MaxInt64, ReplicaScores: []*pb.ReplicaScore{{MatchedTokens: math.MaxInt32, Tier: pb.CacheTier(-3)}}},
		{ReplicaScores: []*pb.ReplicaScore{{ReplicaId: string(make([]byte, 300))}}}, // a two-byte length
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		r := &pb.LookupRouteResponse{ReasonCode: allReasons[rng.IntN(len(allReasons))], LookupLatencyUs: rng.Int64N(1 << 40)}
		for range rng.IntN(40) {
			r.ReplicaScores = append(r.ReplicaScores, &pb.ReplicaScore{ReplicaId: string(rune('a' + rng.IntN(26))),
				Score: rng.Float32() * 1e5, MatchedTokens: rng.Int32N(1 << 20), EstimatedCacheHitProb: rng.Float32(), Tier: pb.CacheTier(rng.IntN(4))})
		}
		if rng.IntN(2) == 0 {
			r.AdapterId = "adapter"
		}
		cases = append(cases, r)
	}
	for i, r := range cases {
		want, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		data, ok := marshalLookupResponse(r)
		if !ok {
			t.Fatalf("case %d: left to the generic encoder", i)
		}
		got := data.Materialize()
		data.Free()
		if !bytes.Equal(got, want) {
			t.Fatalf("case %d: %x, proto.Marshal gives %x", i, got, want)
		}
	}

	scoreUnknown := &pb.ReplicaScore{ReplicaId: "r"}
	scoreUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 77, protowire.VarintType), 1))
	withUnknown := &pb.LookupRouteResponse{ReasonCode: NoHint}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendTag(nil, 99, protowire.VarintType))
	withUnknown.ProtoReflect().SetUnknown(append(withUnknown.ProtoReflect().GetUnknown(), 1))
	for name, r := range map[string]*pb.LookupRouteResponse{
		"unknown fields":     withUnknown,
		"nil score":          {ReplicaScores: []*pb.ReplicaScore{nil}},
		"unknown in a score": {ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "a"}, scoreUnknown}},
		"bad UTF-8":          {ReasonCode: "\xff"},
		"bad replica id":     {ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "\xfe"}}},
	} {
		if _, ok := marshalLookupResponse(r); ok {
			t.Errorf("%s: encoded by hand", name)
		}
	}
	// Through the codec, those still encode (or fail) as proto.Marshal does.
	c := newLookupCodec(nil)
	data, err := c.Marshal(withUnknown)
	want, _ := proto.Marshal(withUnknown)
	if err != nil || !bytes.Equal(data.Materialize(), want) {
		t.Fatalf("codec with unknown fields: %v", err)
	}
	if _, err := c.Marshal(&pb.LookupRouteResponse{ReasonCode: "\xff"}); err == nil {
		t.Fatal("codec encoded invalid UTF-8")
	}
}

// BenchmarkMarshalLookupResponse: the hand-written encoder on a typical
// answer of a few replica scores (the unknown-fields check included).
func BenchmarkMarshalLookupResponse(b *testing.B) {
	r := &pb.LookupRouteResponse{ReasonCode: PrefixMatch, LookupLatencyUs: 1234}
	for i := range 8 {
		r.ReplicaScores = append(r.ReplicaScores, &pb.ReplicaScore{ReplicaId: string(rune('a' + i)), Score: float32(i) * 10,
			MatchedTokens: int32(i * 100), EstimatedCacheHitProb: 0.5, Tier: pb.CacheTier_CACHE_TIER_T1})
	}
	b.ReportAllocs()
	for b.Loop() {
		data, ok := marshalLookupResponse(r)
		if !ok {
			b.Fatal("left to the generic encoder")
		}
		data.Free()
	}
}
