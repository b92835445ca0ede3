package grpcapi

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// TestReasonCodes reaches every reason code of the contract over a real
// connection, and checks the adapter echo rule.
func TestReasonCodes(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4, 5)))
	f.mustReport(update("b", chainEntry(t1, 16, 9)))
	hot := &pb.CacheStateUpdate{ReplicaId: "h", TenantId: "hot", ModelId: "m", HashScheme: "vllm",
		Prefixes: []*pb.PrefixEntry{chainEntry(t1, 16, 70)}, Stats: &pb.ReplicaStats{HitRate: 0.4}}
	f.mustReport(hot)
	good := func() *pb.LookupRouteRequest { return chainReq("vllm", 16, 1, 2, 3, 4, 5) }
	with := func(edit func(r *pb.LookupRouteRequest)) *pb.LookupRouteRequest {
		r := good()
		edit(r)
		return r
	}
	tokens := func(n int) []uint32 { return make([]uint32, n) }
	cases := []struct {
		name    string
		req     *pb.LookupRouteRequest
		reason  string
		adapter string // echoed adapter
		scores  int
	}{
		{"match", with(func(r *pb.LookupRouteRequest) { r.AdapterId = "" }), PrefixMatch, "", 1},
		{"empty tenant", with(func(r *pb.LookupRouteRequest) { r.TenantId = "" }), NoHint, "", 0},
		{"empty model", with(func(r *pb.LookupRouteRequest) { r.ModelId = "" }), NoHint, "", 0},
		{"empty scheme", with(func(r *pb.LookupRouteRequest) { r.HashScheme = "" }), NoHint, "", 0},
		{"unequal chain", with(func(r *pb.LookupRouteRequest) { r.BlockTokenCounts = r.BlockTokenCounts[1:]; r.AdapterId = "x" }), NoHint, "", 0},
		{"counts without hashes", with(func(r *pb.LookupRouteRequest) { r.BlockHashes = nil; r.PrefixHash = key8(1) }), NoHint, "", 0},
		{"empty block hash", with(func(r *pb.LookupRouteRequest) { r.BlockHashes[2] = nil }), NoHint, "", 0},
		{"negative count", with(func(r *pb.LookupRouteRequest) { r.BlockTokenCounts[0] = -1 }), NoHint, "", 0},
		{"oversize chain", chainReq("vllm", 16, make([]uint64, MaxChainBlocks+1)...), NoHint, "", 0},
		{"oversize tokens", &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: tokens(MaxTokenIDs + 1)}, NoHint, "", 0},
		{"tokens shorter than a block", &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: tokens(15), AdapterId: "x"}, NoHint, "x", 0},
		{"tokens under another producer scheme", &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "other", TokenIds: tokens(64)}, NoHint, "", 0},
		{"prompt text", &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PromptText: "hello", AdapterId: "x"}, NoHint, "x", 0},
		{"no input", &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm"}, NoHint, "", 0},
		{"probe tenant", with(func(r *pb.LookupRouteRequest) { r.TenantId = ProbeTenant }), NoHint, "", 0},
		{"unknown tenant", with(func(r *pb.LookupRouteRequest) { r.TenantId = "nobody"; r.AdapterId = "x" }), UnknownTenant, "x", 0},
		{"unknown model", with(func(r *pb.LookupRouteRequest) { r.ModelId = "other" }), UnknownModel, "", 0},
		{"unknown scheme", with(func(r *pb.LookupRouteRequest) { r.HashScheme = "sglang" }), UnknownHashScheme, "", 0},
		{"unknown conductor scheme", with(func(r *pb.LookupRouteRequest) { r.HashScheme = "conductor/vllm_v1/sha256_cbor/0/16" }), UnknownHashScheme, "", 0},
		{"unparsable conductor scheme", with(func(r *pb.LookupRouteRequest) { r.HashScheme = "conductor/x" }), UnknownHashScheme, "", 0},
		{"affinity", chainReq("vllm", 16, 40, 41, 42, 43), AffinityHint, "", 1},
		{"affinity for an unknown adapter", with(func(r *pb.LookupRouteRequest) { r.AdapterId = "lora" }), AffinityHint, "lora", 1},
		{"tenant hot", &pb.LookupRouteRequest{TenantId: "hot", ModelId: "m", HashScheme: "vllm", PrefixHash: key8(71)}, TenantHot, "", 0},
		{"chain in a hot tenant", &pb.LookupRouteRequest{TenantId: "hot", ModelId: "m", HashScheme: "vllm", BlockHashes: [][]byte{key8(71)}, BlockTokenCounts: []int32{16}}, AffinityHint, "", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := f.lookup(c.req)
			if got.ReasonCode != c.reason || got.AdapterId != c.adapter || len(got.ReplicaScores) != c.scores {
				t.Fatalf("got %v, want %s adapter %q with %d scores", got, c.reason, c.adapter, c.scores)
			}
			if c.reason == AffinityHint {
				s := got.ReplicaScores[0]
				if s.Score != 0 || s.MatchedTokens != 0 || s.EstimatedCacheHitProb != 0 {
					t.Fatalf("affinity score carries values: %v", s)
				}
			}
			if c.name == "probe tenant" && got.LookupLatencyUs != 0 {
				t.Fatalf("probe latency %d", got.LookupLatencyUs)
			}
		})
	}
	for _, r := range []string{PrefixMatch, NoHint, UnknownTenant, UnknownModel, UnknownHashScheme, AffinityHint, TenantHot} {
		if counterValue(t, f.reg, "conductor_grpc_lookup_reasons_total", "reason", r) == 0 {
			t.Errorf("reason %s not counted", r)
		}
	}
}

// TestAffinityOffAndMinimumOff: configurable affinity and filters.
func TestAffinityOffAndMinimumOff(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.NoAffinity, o.MinMatchedTokens, o.ScoreFloor = true, -1, -1 })
	f.mustReport(update("a", chainEntry(t1, 16, 1)))
	f.mustReport(update("b", chainEntry(t1, 16, 2)))
	if got := f.lookup(chainReq("vllm", 16, 1)); got.ReasonCode != PrefixMatch || len(got.ReplicaScores) != 1 || got.ReplicaScores[0].MatchedTokens != 16 {
		t.Fatalf("16 tokens without a minimum: %v", got)
	}
	if got := f.lookup(chainReq("vllm", 16, 3)); got.ReasonCode != NoHint || len(got.ReplicaScores) != 0 {
		t.Fatalf("miss without affinity: %v", got)
	}
}

func TestPolicyRequiresChain(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.RequireChain = true })
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	got := f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", PrefixHash: key8(4), AdapterId: "x"})
	if got.ReasonCode != PolicyRequiresChain || got.AdapterId != "" {
		t.Fatalf("%v", got)
	}
	if got := f.lookup(chainReq("vllm", 16, 1, 2, 3, 4)); got.ReasonCode != PrefixMatch {
		t.Fatalf("chain under the policy: %v", got)
	}
}

// TestTimeout: the server's lookup timeout passed (over the wire), and a
// caller's deadline passed on arrival (in process: over the wire the
// client's own deadline answers first).
func TestTimeout(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.LookupTimeout = time.Nanosecond })
	f.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	req := chainReq("vllm", 16, 1, 2, 3, 4)
	req.AdapterId = "x"
	if got := f.lookup(req); got.ReasonCode != Timeout || len(got.ReplicaScores) != 0 || got.AdapterId != "" {
		t.Fatalf("server timeout: %v", got)
	}
	g := newFixture(t, nil)
	g.mustReport(update("a", chainEntry(t1, 16, 1, 2, 3, 4)))
	dead, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	got, err := g.srv.LookupRoute(dead, req)
	if err != nil || got.ReasonCode != Timeout {
		t.Fatalf("expired deadline: %v %v", got, err)
	}
}

// TestAffinityForTokenIDs: the token_ids path seeds affinity with the
// derived chain, each key as an 8-byte hash with its length before it.
func TestAffinityForTokenIDs(t *testing.T) {
	f := newFixture(t, nil)
	f.mustReport(update("a", chainEntry(t1, 16, 1)), update("b", chainEntry(t1, 16, 2)), update("c", chainEntry(t1, 16, 3)))
	ids := make([]uint32, 40)
	for i := range ids {
		ids[i] = uint32(i + 500)
	}
	got := f.lookup(&pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: ids})
	var hashes [][]byte
	for _, k := range fingerprint.Chain(nil, ids, 16, nil) {
		hashes = append(hashes, key8(k))
	}
	want := wantPick(chainSeed(hashes), []string{"a", "b", "c"})
	if got.ReasonCode != AffinityHint || len(got.ReplicaScores) != 1 || got.ReplicaScores[0].ReplicaId != want {
		t.Fatalf("got %v, want affinity for %s", got, want)
	}
}

// TestOversizeMessage: a message over the limit is refused with a status.
func TestOversizeMessage(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.MaxMsgBytes = 4096 })
	_, err := f.client.LookupRoute(ctx(t), &pb.LookupRouteRequest{TenantId: "t", ModelId: "m", HashScheme: "vllm", TokenIds: make([]uint32, 8192)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversize message: %v", err)
	}
	if got := f.lookup(chainReq("vllm", 16, 1)); got.ReasonCode == "" {
		t.Fatal("the server stopped answering")
	}
}
