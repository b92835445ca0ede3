package grpcapi

import (
	"math"
	"unicode/utf8"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// Field numbers of LookupRouteResponse and ReplicaScore.
const (
	respScores  = 1
	respReason  = 2
	respLatency = 3
	respTokens  = 4
	respAdapter = 5

	scoreReplica = 1
	scoreScore   = 2
	scoreMatched = 3
	scoreProb    = 4
	scoreTier    = 5
)

// marshalLookupResponse encodes r exactly as proto.Marshal does (fields in
// number order, zero values left out, the same bytes), without its
// generic machinery: a size pass, then one pass writing into a buffer of
// that size. That was a twentieth of a warm 8K-token lookup. ok is false
// for what it leaves to the generic encoder: unknown fields, a nil score,
// or a string that is not UTF-8 (an error there).
func marshalLookupResponse(r *pb.LookupRouteResponse) (mem.BufferSlice, bool) {
	if !plainLookupResponse(r) {
		return nil, false
	}
	size := lookupResponseSize(r)
	// As the generic codec does: a small answer in a slice of its own
	// (gRPC pools nothing below its threshold), a large one pooled.
	if mem.IsBelowBufferPoolingThreshold(size) {
		return mem.BufferSlice{mem.SliceBuffer(appendLookupResponse(make([]byte, 0, size), r))}, true
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = appendLookupResponse((*buf)[:0], r)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, true
}

// hasUnknown reports whether m carries unknown fields, through the
// protobuf runtime's public reflection (no reading of the generated
// struct's private fields, so a protobuf upgrade cannot silently change
// what this sees).
func hasUnknown(m protoreflect.ProtoMessage) bool {
	return len(m.ProtoReflect().GetUnknown()) > 0
}

// plainLookupResponse reports whether r holds only what
// appendLookupResponse writes.
func plainLookupResponse(r *pb.LookupRouteResponse) bool {
	if hasUnknown(r) || !utf8.ValidString(r.ReasonCode) || !utf8.ValidString(r.AdapterId) {
		return false
	}
	for _, s := range r.ReplicaScores {
		if s == nil || hasUnknown(s) || !utf8.ValidString(s.ReplicaId) {
			return false
		}
	}
	return true
}

// scoreSize is the encoded size of one ReplicaScore's fields.
func scoreSize(s *pb.ReplicaScore) int {
	n := 0
	if s.ReplicaId != "" {
		n += 1 + protowire.SizeBytes(len(s.ReplicaId))
	}
	if math.Float32bits(s.Score) != 0 {
		n += 1 + 4
	}
	if s.MatchedTokens != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(s.MatchedTokens)))
	}
	if math.Float32bits(s.EstimatedCacheHitProb) != 0 {
		n += 1 + 4
	}
	if s.Tier != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(s.Tier)))
	}
	return n
}

func lookupResponseSize(r *pb.LookupRouteResponse) int {
	n := 0
	for _, s := range r.ReplicaScores {
		n += 1 + protowire.SizeBytes(scoreSize(s))
	}
	if r.ReasonCode != "" {
		n += 1 + protowire.SizeBytes(len(r.ReasonCode))
	}
	if r.LookupLatencyUs != 0 {
		n += 1 + protowire.SizeVarint(uint64(r.LookupLatencyUs))
	}
	if len(r.TokenIds) > 0 {
		n += 1 + protowire.SizeBytes(packedSize(r.TokenIds))
	}
	if r.AdapterId != "" {
		n += 1 + protowire.SizeBytes(len(r.AdapterId))
	}
	return n
}

func packedSize(ids []uint32) int {
	n := 0
	for _, id := range ids {
		n += protowire.SizeVarint(uint64(id))
	}
	return n
}

func appendLookupResponse(b []byte, r *pb.LookupRouteResponse) []byte {
	for _, s := range r.ReplicaScores {
		b = protowire.AppendTag(b, respScores, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(scoreSize(s)))
		if s.ReplicaId != "" {
			b = protowire.AppendTag(b, scoreReplica, protowire.BytesType)
			b = protowire.AppendString(b, s.ReplicaId)
		}
		if math.Float32bits(s.Score) != 0 {
			b = protowire.AppendTag(b, scoreScore, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, math.Float32bits(s.Score))
		}
		if s.MatchedTokens != 0 {
			b = protowire.AppendTag(b, scoreMatched, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(s.MatchedTokens)))
		}
		if math.Float32bits(s.EstimatedCacheHitProb) != 0 {
			b = protowire.AppendTag(b, scoreProb, protowire.Fixed32Type)
			b = protowire.AppendFixed32(b, math.Float32bits(s.EstimatedCacheHitProb))
		}
		if s.Tier != 0 {
			b = protowire.AppendTag(b, scoreTier, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(s.Tier)))
		}
	}
	if r.ReasonCode != "" {
		b = protowire.AppendTag(b, respReason, protowire.BytesType)
		b = protowire.AppendString(b, r.ReasonCode)
	}
	if r.LookupLatencyUs != 0 {
		b = protowire.AppendTag(b, respLatency, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.LookupLatencyUs))
	}
	if len(r.TokenIds) > 0 {
		b = protowire.AppendTag(b, respTokens, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(packedSize(r.TokenIds)))
		for _, id := range r.TokenIds {
			b = protowire.AppendVarint(b, uint64(id))
		}
	}
	if r.AdapterId != "" {
		b = protowire.AppendTag(b, respAdapter, protowire.BytesType)
		b = protowire.AppendString(b, r.AdapterId)
	}
	return b
}
