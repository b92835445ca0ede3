package grpcapi

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

const (
	t1 = pb.CacheTier_CACHE_TIER_T1
	t2 = pb.CacheTier_CACHE_TIER_T2
	t3 = pb.CacheTier_CACHE_TIER_T3
)

func score(id string, s float64, matched int32, prob float64, tier pb.CacheTier) *pb.ReplicaScore {
	return &pb.ReplicaScore{ReplicaId: id, Score: float32(s), MatchedTokens: matched, EstimatedCacheHitProb: float32(prob), Tier: tier}
}

var approx = cmp.Options{protocmp.Transform(), cmpopts.EquateApprox(0, 1e-4), protocmp.IgnoreFields(&pb.LookupRouteResponse{}, "lookup_latency_us")}

func check(t *testing.T, what string, got *pb.LookupRouteResponse, want *pb.LookupRouteResponse) {
	t.Helper()
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

// TestChainRankingAndOrder: three replicas of the scheme, two matching
// the chain to different depths: scores follow matched × distinguishing
// power, ordered by score.
func TestChainRankingAndOrder(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(
		update("a", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6, 7, 8)),
		update("b", chainEntry(t1, 16, 1, 2, 3, 4)),
		update("c", chainEntry(t1, 16, 100)),
	)
	got := f.lookup(chainReq("vllm", 16, 1, 2, 3, 4, 5, 6, 7, 8, 9))
	check(t, "chain lookup", got, &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{
		score("a", 128*(1-1.0/3), 128, 1, t1),
		score("b", 64*(1-2.0/3), 64, 1, t1),
	}})
	// matched_tokens sums the request's own counts over the run.
	req := chainReq("vllm", 16, 1, 2, 3, 4, 5)
	req.BlockTokenCounts = []int32{10, 20, 30, 40, 50}
	got = f.lookup(req)
	check(t, "uneven counts", got, &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{
		score("a", 150*(1-1.0/3), 150, 1, t1),
		score("b", 100*(1-2.0/3), 100, 1, t1),
	}})
	// b now as deep as a: equal scores order by replica id.
	f.mustReport(update("b", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6, 7, 8)))
	req = chainReq("vllm", 16, 1, 2, 3, 4, 5, 6, 7, 8)
	check(t, "two equal", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{
		score("a", 128*(1-2.0/3), 128, 1, t1), score("b", 128*(1-2.0/3), 128, 1, t1),
	}})
	// Every replica of the scheme holds it all: the match distinguishes
	// nobody, the answer is empty, and affinity picks one.
	f.mustReport(update("c", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6, 7, 8)))
	got = f.lookup(req)
	want := wantPick(chainSeed(req.BlockHashes), []string{"a", "b", "c"})
	check(t, "no distinguishing power", got, &pb.LookupRouteResponse{ReasonCode: AffinityHint, ReplicaScores: []*pb.ReplicaScore{{ReplicaId: want}}})
	// A fourth replica elsewhere restores some distinguishing power.
	f.mustReport(update("d", chainEntry(t1, 16, 200)))
	got = f.lookup(req)
	check(t, "ties", got, &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{
		score("a", 128*(1-3.0/4), 128, 1, t1), score("b", 128*(1-3.0/4), 128, 1, t1), score("c", 128*(1-3.0/4), 128, 1, t1),
	}})
}

// TestDemotionFreshnessPressureSLO: a re-report moves blocks to T2; age,
// pressure and a tight TTFT change the score as the formula says.
func TestDemotionFreshnessPressureSLO(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6)))
	req := chainReq("vllm", 16, 1, 2, 3, 4, 5, 6)
	check(t, "T1", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96, 96, 1, t1)}})
	f.mustReport(update("a", chainEntry(t2, 16, 5, 6)))
	check(t, "demoted tail", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96, 96, 1, t2)}})
	f.mustReport(update("a", chainEntry(t3, 16, 6)))
	check(t, "last block on disk", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96, 96, 1, t3)}})
	f.mustReport(update("a", chainEntry(t1, 16, 5, 6)))
	check(t, "promoted again", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96, 96, 1, t1)}})

	u := update("a")
	u.Stats = &pb.ReplicaStats{Pressure: 0.25, HitRate: 0.5}
	f.mustReport(u)
	f.clock.Add(15 * time.Minute) // freshness 0.5
	check(t, "aged and pressed", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96*0.5*0.75, 96, 0.5, t1)}})
	req.Slo = &pb.SLO{TtftMs: 150}
	check(t, "fast SLO", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96*0.5*0.75*1.5, 96, 0.5, t1)}})
	req.Slo = &pb.SLO{TtftMs: 200}
	check(t, "SLO at the bound", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 96*0.5*0.75, 96, 0.5, t1)}})
}

// TestTokenIDsAndExactUnderVLLM: token_ids are fingerprinted as IC's
// sidecars do; prefix_hash matches one stored entry with its token count.
func TestTokenIDsAndExactUnderVLLM(t *testing.T) {
	f := newFixture(t, nil)
	ids := make([]uint32, 100) // 6 full blocks and a 4-id tail
	for i := range ids {
		ids[i] = uint32(i*31 + 7)
	}
	keys := fingerprint.Chain(nil, ids, 16, nil)
	f.mustReport(update("a", chainEntry(t1, 16, keys[:5]...)))
	f.mustReport(&pb.CacheStateUpdate{ReplicaId: "b", TenantId: "t", ModelId: "m", HashScheme: "sglang",
		Prefixes: []*pb.PrefixEntry{chainEntry(t2, 16, keys...)}})
	req := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: ids}
	check(t, "vllm token_ids", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 80, 80, 1, t1)}})
	req.HashScheme = "sglang"
	check(t, "sglang token_ids", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("b", 96, 96, 1, t2)}})

	f.mustReport(update("c", &pb.PrefixEntry{PrefixHash: []byte("an opaque 21-byte key"), TokenCount: 300, Tier: pb.CacheTier_CACHE_TIER_UNSPECIFIED}))
	exact := &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PrefixHash: []byte("an opaque 21-byte key")}
	check(t, "exact", f.lookup(exact), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("c", 300*(1-1.0/2), 300, 1, t1)}})
	// A chain block is also an exact entry with its cumulative count.
	exact.PrefixHash = key8(keys[4])
	check(t, "exact chain block", f.lookup(exact), &pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 80*(1-1.0/2), 80, 1, t1)}})
	// Block 2 covers 48 tokens, under the 64-token minimum: nothing
	// qualifies; a and c are the scheme's replicas.
	exact.PrefixHash = key8(keys[2])
	check(t, "under the minimum", f.lookup(exact), &pb.LookupRouteResponse{ReasonCode: AffinityHint,
		ReplicaScores: []*pb.ReplicaScore{{ReplicaId: wantPick(exact.PrefixHash, []string{"a", "c"})}}})
}

// TestEvictionClearAndExpiry: PublishEvent evictions (all schemes, or one
// adapter), ALL_CLEARED, and a replica expiring after the TTL.
func TestEvictionClearAndExpiry(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6)))
	lora := update("a", chainEntry(t1, 16, 1, 2, 3, 4, 5, 6))
	lora.AdapterId = "lora1"
	f.mustReport(lora)
	f.mustReport(update("z", chainEntry(t1, 16, 50)))
	req := chainReq("vllm", 16, 1, 2, 3, 4, 5, 6)
	loraReq := chainReq("vllm", 16, 1, 2, 3, 4, 5, 6)
	loraReq.AdapterId = "lora1"
	full := func(adapter string, matched int32) *pb.LookupRouteResponse {
		return &pb.LookupRouteResponse{ReasonCode: PrefixMatch, AdapterId: adapter,
			ReplicaScores: []*pb.ReplicaScore{score("a", float64(matched)/2, matched, 1, t1)}}
	}
	check(t, "base", f.lookup(req), full("", 96))
	check(t, "adapter", f.lookup(loraReq), full("lora1", 96))

	publish := func(e *pb.CacheEvent) {
		t.Helper()
		ack, err := f.client.PublishEvent(ctx(t), e)
		if err != nil || !ack.GetAccepted() {
			t.Fatalf("PublishEvent: %v %v", ack, err)
		}
	}
	publish(&pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "a", TenantId: "t", ModelId: "m", PrefixHash: key8(6), AdapterId: "lora1"})
	check(t, "base untouched by an adapter eviction", f.lookup(req), full("", 96))
	check(t, "adapter evicted", f.lookup(loraReq), full("lora1", 80))
	publish(&pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "a", TenantId: "t", ModelId: "m", PrefixHash: key8(5)})
	check(t, "base evicted", f.lookup(req), full("", 64))
	check(t, "adapter evicted too", f.lookup(loraReq), full("lora1", 64))
	publish(&pb.CacheEvent{Type: pb.CacheEvent_PREFIX_ADDED, ReplicaId: "a", TenantId: "t", ModelId: "m", PrefixHash: key8(5)})
	check(t, "PREFIX_ADDED changes nothing", f.lookup(req), full("", 64))

	publish(&pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: "a", TenantId: "t", ModelId: "m"})
	got := f.lookup(req)
	check(t, "cleared", got, &pb.LookupRouteResponse{ReasonCode: AffinityHint, ReplicaScores: []*pb.ReplicaScore{{ReplicaId: "z"}}})

	// z is heard from by REPLICA_UPDATED at 20 min, then silent: it
	// expires 30 min later, not before.
	f.clock.Add(20 * time.Minute)
	publish(&pb.CacheEvent{Type: pb.CacheEvent_REPLICA_UPDATED, ReplicaId: "z", TenantId: "t", ModelId: "m"})
	f.clock.Add(29 * time.Minute)
	if n := f.prod.Sweep(); n != 0 {
		t.Fatalf("swept %d before the TTL", n)
	}
	f.clock.Add(2 * time.Minute)
	if n := f.prod.Sweep(); n != 1 {
		t.Fatalf("swept %d at the TTL", n)
	}
	check(t, "expired", f.lookup(req), &pb.LookupRouteResponse{ReasonCode: UnknownTenant})
	if n := len(f.ix.Scopes()); n != 0 {
		t.Fatalf("%d scopes left after expiry", n)
	}
}

// TestBadEntriesDropped: a bad entry is dropped and counted, the rest of
// the update applies.
func TestBadEntriesDropped(t *testing.T) {
	f := newFixture(t, nil)
	bad := []*pb.PrefixEntry{
		{BlockHashes: [][]byte{key8(1)}, BlockTokenCounts: []int32{16, 16}}, // unequal
		{BlockHashes: [][]byte{{}}, BlockTokenCounts: []int32{16}},          // empty hash
		{BlockHashes: [][]byte{key8(1)}, BlockTokenCounts: []int32{-1}},     // negative
		{PrefixHash: key8(9), TokenCount: 16, Tier: 7},                      // unknown tier
		{}, // nothing
	}
	good := chainEntry(t1, 16, 1, 2, 3, 4)
	f.mustReport(update("a", append(bad, good)...))
	noScheme := update("b", chainEntry(t1, 16, 1, 2, 3, 4))
	noScheme.HashScheme = ""
	noScheme.Stats = &pb.ReplicaStats{HitRate: 0.7}
	f.mustReport(noScheme)
	check(t, "good entry applied", f.lookup(chainReq("vllm", 16, 1, 2, 3, 4)),
		&pb.LookupRouteResponse{ReasonCode: PrefixMatch, ReplicaScores: []*pb.ReplicaScore{score("a", 64, 64, 1, t1)}})
	for reason, want := range map[string]float64{dropUnequal: 1, dropEmptyHash: 1, dropTokenCount: 1, dropTier: 1, dropEmptyEntry: 1, dropNoScheme: 1} {
		if got := counterValue(t, f.reg, "conductor_grpc_producer_entries_dropped_total", "reason", reason); got != want {
			t.Errorf("dropped{%s} = %v, want %v", reason, got, want)
		}
	}
	if got := counterValue(t, f.reg, "conductor_grpc_producer_blocks_applied_total", "", ""); got != 4 {
		t.Errorf("applied = %v", got)
	}
	// b's stats were kept although its prefixes went.
	st, err := f.client.GetCacheState(ctx(t), &pb.GetCacheStateRequest{TenantId: "t", ModelId: "m"})
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.GetCacheStateResponse{
		Replicas: []*pb.ReplicaStats{{ReplicaId: "b", HitRate: 0.7}},
		Summary:  &pb.CacheSummary{TotalPrefixes: 4},
	}
	if diff := cmp.Diff(want, st, protocmp.Transform()); diff != "" {
		t.Errorf("GetCacheState (-want +got):\n%s", diff)
	}
}
