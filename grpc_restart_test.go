package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
)

// startWithDoor runs the binary with the gRPC door on a free loopback
// port and returns a client to the door.
func startWithDoor(t *testing.T, dir, grpcAddr string) (*proc, pb.InferenceCacheClient) {
	t.Helper()
	p := startConductor(t, dir, "--snapshot-interval", "0", "--grpc-addr", grpcAddr)
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return p, pb.NewInferenceCacheClient(conn)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestGracefulRestartKeepsProducerScopes: producer-fed scopes (entries in
// both tiers, token counts, several replicas and adapters, an eviction,
// statistics) survive a graceful restart: every LookupRoute and
// GetCacheState answers as before. Scores and hit probabilities carry the
// replicas' freshness, which moves with the clock by a hair between the
// two runs, so floats compare to within 0.1%; everything else exactly.
func TestGracefulRestartKeepsProducerScopes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	addr := freeAddr(t)
	p, client := startWithDoor(t, dir, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ids := make([]uint32, 16*12)
	for i := range ids {
		ids[i] = uint32(900 + 7*i)
	}
	fps := fingerprint.Chain(nil, ids, fingerprint.DefaultBlockSize, nil)
	chain := func(n int) ([][]byte, []int32) {
		var hs [][]byte
		var cs []int32
		for i := range n {
			hs = append(hs, fingerprint.Wire(fps[i]))
			cs = append(cs, int32(fingerprint.DefaultBlockSize))
		}
		return hs, cs
	}
	report := func(u *pb.CacheStateUpdate) {
		t.Helper()
		reportState(t, ctx, client, u)
	}
	h10, c10 := chain(10)
	h6, c6 := chain(6)
	h3, c3 := chain(3)
	report(&pb.CacheStateUpdate{ReplicaId: "r0", TenantId: "acme", ModelId: "llama", HashScheme: "vllm",
		Stats:    &pb.ReplicaStats{CacheMemoryBytes: 1 << 30, HitRate: 0.4, Pressure: 0.2, ClientVersion: "sidecar/1"},
		Prefixes: []*pb.PrefixEntry{{BlockHashes: h10, BlockTokenCounts: c10, Tier: pb.CacheTier_CACHE_TIER_T1}, {PrefixHash: []byte("system-prompt"), TokenCount: 333}}})
	report(&pb.CacheStateUpdate{ReplicaId: "r1", TenantId: "acme", ModelId: "llama", HashScheme: "vllm",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: h6, BlockTokenCounts: c6, Tier: pb.CacheTier_CACHE_TIER_T2}}})
	report(&pb.CacheStateUpdate{ReplicaId: "r2", TenantId: "acme", ModelId: "llama", HashScheme: "vllm", AdapterId: "lora-a",
		Prefixes: []*pb.PrefixEntry{{BlockHashes: h3, BlockTokenCounts: c3}}})
	// r0 loses block 8: its run stops at 8 blocks.
	if _, err := client.PublishEvent(ctx, &pb.CacheEvent{Type: pb.CacheEvent_PREFIX_EVICTED, ReplicaId: "r0", TenantId: "acme", ModelId: "llama", PrefixHash: h10[8]}); err != nil {
		t.Fatal(err)
	}

	lookups := []*pb.LookupRouteRequest{
		{TenantId: "acme", ModelId: "llama", HashScheme: "vllm", BlockHashes: h10, BlockTokenCounts: c10},
		{TenantId: "acme", ModelId: "llama", HashScheme: "vllm", TokenIds: ids},
		{TenantId: "acme", ModelId: "llama", HashScheme: "vllm", PrefixHash: []byte("system-prompt")},
		{TenantId: "acme", ModelId: "llama", HashScheme: "vllm", AdapterId: "lora-a", BlockHashes: h10, BlockTokenCounts: c10},
		{TenantId: "acme", ModelId: "llama", HashScheme: "sglang", TokenIds: ids},
		{TenantId: "other", ModelId: "llama", HashScheme: "vllm", TokenIds: ids},
	}
	answers := func() []any {
		t.Helper()
		var out []any
		for _, req := range lookups {
			resp, err := client.LookupRoute(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, resp)
		}
		st, err := client.GetCacheState(ctx, &pb.GetCacheStateRequest{TenantId: "acme", ModelId: "llama"})
		if err != nil {
			t.Fatal(err)
		}
		return append(out, st)
	}
	before := answers()
	// The answers are the interesting ones, so the comparison means
	// something: the chain matched r0 for 8 blocks, r1 for 6 in T2.
	first := before[0].(*pb.LookupRouteResponse)
	if first.ReasonCode != "PREFIX_MATCH" || len(first.ReplicaScores) != 2 || first.ReplicaScores[0].ReplicaId != "r0" ||
		first.ReplicaScores[0].MatchedTokens != 128 || first.ReplicaScores[1].MatchedTokens != 96 || first.ReplicaScores[1].Tier != pb.CacheTier_CACHE_TIER_T2 {
		t.Fatalf("chain lookup before the restart: %v", first)
	}
	if exact := before[2].(*pb.LookupRouteResponse); len(exact.ReplicaScores) != 1 || exact.ReplicaScores[0].MatchedTokens != 333 {
		t.Fatalf("prefix_hash lookup before the restart: %v", exact)
	}
	p.stop()

	p2, client := startWithDoor(t, dir, addr)
	after := answers()
	opts := cmp.Options{protocmp.Transform(), protocmp.IgnoreFields(&pb.LookupRouteResponse{}, "lookup_latency_us"), cmpopts.EquateApprox(1e-3, 0)}
	if diff := cmp.Diff(before, after, opts); diff != "" {
		t.Errorf("answers after a graceful restart (-before +after):\n%s", diff)
	}
	p2.stop()

	// Damage one byte inside a scope section (in its scheme name): the
	// whole snapshot is refused and moved aside, nothing of it is used.
	file := filepath.Join(dir, "index.snapshot")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(data, []byte("lora-a"))
	if at < 0 {
		t.Fatal("no scope section for lora-a in the snapshot")
	}
	data[at] ^= 0x20
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p3, client := startWithDoor(t, dir, addr)
	if !strings.Contains(p3.logText(), "checksum mismatch") {
		t.Errorf("no error naming the damaged section")
	}
	if aside, _ := filepath.Glob(file + ".corrupt-*"); len(aside) != 1 {
		t.Errorf("moved aside: %v", aside)
	}
	resp, err := client.LookupRoute(ctx, lookups[0])
	if err != nil || len(resp.ReplicaScores) != 0 {
		t.Errorf("after a damaged snapshot: %v %v, want no replicas", resp, err)
	}
}
