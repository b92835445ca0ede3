package grpcapi

import (
	"context"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/query"
)

// indexState is what a lookup must leave unchanged.
type indexState struct {
	Tables []tableState
}

type tableState struct {
	Ctx      index.ContextKey
	Scope    index.ScopeKey
	Prefixes int
	Tiers    [4]int
	Owners   int
}

func snapshot(ix *index.Index) indexState {
	var st indexState
	for _, t := range append(ix.Tables(), ix.Scopes()...) {
		st.Tables = append(st.Tables, tableState{t.Context(), t.ScopeKey(), t.PrefixCount(), t.TierBlocks(), t.OwnerCount()})
	}
	return st
}

// FuzzHandlers drives random producer updates, events and lookups (each a
// protobuf message decoded from the fuzzer's bytes) through the handlers:
// nothing panics, LookupRoute never answers with an error status, and a
// lookup leaves the index as it found it.
func FuzzHandlers(f *testing.F) {
	prof := vllmProfile(f)
	ix := index.New(index.Options{Stripes: 4})
	cat := contexts.New(ix)
	prod := producer.New(producer.Options{Index: ix})
	s, err := New(Options{Contexts: cat, Producer: prod, Logger: zerolog.New(io.Discard), Engine: query.New(query.Options{Contexts: cat, Memo: hashing.NewMemo(1 << 20)})})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Stop)
	tbl := cat.Ensure(index.ContextKey{Tenant: "t", Model: "m", BlockSize: 16}, prof).Table
	owner := tbl.AddEngineOwner("i", 0)
	ids := make([]int32, 64)
	for i := range ids {
		ids[i] = int32(i)
	}
	for k := range chainKeys(&prof, 16, ids, "", nil) {
		tbl.Store(owner, index.Put{Key: k, Tier: index.Device})
	}

	add := func(u *pb.CacheStateUpdate, e *pb.CacheEvent, r *pb.LookupRouteRequest) {
		ub, _ := proto.Marshal(u)
		eb, _ := proto.Marshal(e)
		rb, _ := proto.Marshal(r)
		f.Add(ub, eb, rb)
	}
	add(update("a", chainEntry(t1, 16, 1, 2, 3, 4)), &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "a", TenantId: "t", ModelId: "m", PrefixHash: key8(3)},
		chainReq("vllm", 16, 1, 2, 3, 4))
	add(update("b", &pb.PrefixEntry{PrefixHash: []byte("xyz"), TokenCount: 99}), &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: "a", TenantId: "t", ModelId: "m"},
		&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "conductor/vllm_v1/sha256_cbor/0/16", TokenIds: []uint32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}})
	add(&pb.CacheStateUpdate{}, &pb.CacheEvent{}, &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: make([]uint32, 40), Slo: &pb.SLO{TtftMs: 10}})
	add(&pb.CacheStateUpdate{}, &pb.CacheEvent{}, &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "conductor/vllm_v1/sha256_cbor/0/16", BlockHashes: [][]byte{make([]byte, 32)}, BlockTokenCounts: []int32{16}})

	f.Fuzz(func(t *testing.T, ub, eb, rb []byte) {
		var u pb.CacheStateUpdate
		if proto.Unmarshal(ub, &u) == nil {
			s.applyUpdate(&u)
		}
		var e pb.CacheEvent
		if proto.Unmarshal(eb, &e) == nil {
			if ack, err := s.PublishEvent(context.Background(), &e); err != nil || !ack.Accepted {
				t.Fatalf("PublishEvent: %v %v", ack, err)
			}
		}
		var r pb.LookupRouteRequest
		if proto.Unmarshal(rb, &r) != nil {
			return
		}
		before := snapshot(ix)
		resp, err := s.LookupRoute(context.Background(), &r)
		if err != nil {
			t.Fatalf("LookupRoute error status: %v", err)
		}
		if resp.ReasonCode == "" {
			t.Fatal("no reason code")
		}
		// An affinity hint names exactly one replica; otherwise scores
		// come with a prefix match and only with it.
		if resp.ReasonCode == AffinityHint {
			if len(resp.ReplicaScores) != 1 {
				t.Fatalf("reason %s with %d scores", resp.ReasonCode, len(resp.ReplicaScores))
			}
		} else if (resp.ReasonCode == PrefixMatch) != (len(resp.ReplicaScores) > 0) {
			t.Fatalf("reason %s with %d scores", resp.ReasonCode, len(resp.ReplicaScores))
		}
		if diff := cmp.Diff(before, snapshot(ix)); diff != "" {
			t.Fatalf("a lookup changed the index:\n%s", diff)
		}
	})
}
