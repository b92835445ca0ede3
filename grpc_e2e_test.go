package main

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/fingerprint"
	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// startAppWithDoor runs the wired service with the gRPC door on loopback
// and returns a client to it.
func startAppWithDoor(t *testing.T) (*e2e, pb.InferenceCacheClient, *grpc.ClientConn) {
	t.Helper()
	e := startAppWith(t, func(c *config.Config) { c.GRPCAddr, c.HashCheckEvery = "127.0.0.1:0", 0 })
	conn, err := grpc.NewClient(e.app.doorLn.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the connection closes before the app.
	t.Cleanup(func() { conn.Close() })
	return e, pb.NewInferenceCacheClient(conn), conn
}

const conductorScheme = "conductor/vllm_v1/sha256_cbor/0/16"

// TestGRPCLookupMatchesQuery: vLLM events through real ZMQ publishers, then
// LookupRoute (token_ids under the Conductor scheme, and the engine's block
// hashes) gives each instance the longest match /query gives; the event
// stream sees the ZMQ-fed changes.
func TestGRPCLookupMatchesQuery(t *testing.T) {
	e, client, conn := startAppWithDoor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "inferencecache.v1alpha1.InferenceCache"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	events, err := client.StreamCacheEvents(ctx, &pb.StreamEventsRequest{ModelId: "deepseek", Types: []pb.CacheEvent_Type{pb.CacheEvent_PREFIX_ADDED, pb.CacheEvent_ALL_CLEARED}})
	if err != nil {
		t.Fatal(err)
	}

	pubs := map[string]*publisher{"p0": newPublisher(t), "p1": newPublisher(t)}
	for name, p := range pubs {
		if status, out := e.post("/register", vllmRegistration(name, p.endpoint)); status != 200 {
			t.Fatalf("register %s: %d %v", name, status, out)
		}
	}
	tokens := make([]int32, 170) // 10 blocks and a tail
	ids := make([]uint32, len(tokens))
	for i := range tokens {
		tokens[i] = int32(7000 + 3*i)
		ids[i] = uint32(tokens[i])
	}
	keys := vllmKeys(t, tokens)
	stored := func(n int) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": keys[:n], "parent_block_hash": nil,
			"token_ids": tokens[:16*n], "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	}
	eventtest.Eventually(t, "p0's blocks", func() bool { pubs["p0"].send(0, stored(10)); return e.deviceHits("p0", tokens) == 160 })
	eventtest.Eventually(t, "p1's blocks", func() bool { pubs["p1"].send(0, stored(5)); return e.deviceHits("p1", tokens) == 80 })

	byTokens := &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme, TokenIds: ids}
	byHashes := &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme}
	for _, k := range keys {
		byHashes.BlockHashes = append(byHashes.BlockHashes, fingerprint.Wire(k))
		byHashes.BlockTokenCounts = append(byHashes.BlockTokenCounts, 16)
	}
	for name, req := range map[string]*pb.LookupRouteRequest{"token_ids": byTokens, "block_hashes": byHashes} {
		resp, err := client.LookupRoute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ReasonCode != "PREFIX_MATCH" || len(resp.ReplicaScores) != 2 {
			t.Fatalf("%s: %v", name, resp)
		}
		for _, s := range resp.ReplicaScores {
			if want := e.deviceHits(s.ReplicaId, tokens); int64(s.MatchedTokens) != want || s.Tier != pb.CacheTier_CACHE_TIER_T1 {
				t.Errorf("%s: %s matched %d tier %v, /query says %d", name, s.ReplicaId, s.MatchedTokens, s.Tier, want)
			}
		}
		// p0 holds more than p1, so it alone has distinguishing power.
		if resp.ReplicaScores[0].ReplicaId != "p0" || resp.ReplicaScores[0].Score != 80 || resp.ReplicaScores[1].Score != 0 {
			t.Errorf("%s: order and scores %v", name, resp.ReplicaScores)
		}
	}

	// The stream saw p0's and p1's blocks arrive.
	seen := map[string]int{}
	for seen["p0"] < 10 || seen["p1"] < 5 {
		ev, err := events.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == pb.CacheEvent_PREFIX_ADDED && ev.TenantId == "default" && len(ev.PrefixHash) == 8 {
			seen[ev.ReplicaId]++
		}
	}
	pubs["p1"].send(0, map[string]any{"type": "AllBlocksCleared"})
	for {
		ev, err := events.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == pb.CacheEvent_ALL_CLEARED && ev.ReplicaId == "p1" {
			break
		}
	}
	resp, err := client.LookupRoute(ctx, byTokens)
	if err != nil || resp.ReasonCode != "PREFIX_MATCH" || len(resp.ReplicaScores) != 1 || resp.ReplicaScores[0].ReplicaId != "p0" {
		t.Fatalf("after p1 cleared: %v %v", resp, err)
	}
	// ids past int32 cannot be hashed under a Conductor profile.
	bad := &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme, TokenIds: append([]uint32{1 << 31}, ids...)}
	if resp, err := client.LookupRoute(ctx, bad); err != nil || resp.ReasonCode != "NO_HINT" {
		t.Fatalf("out-of-range id: %v %v", resp, err)
	}
	// GetCacheState lists the Conductor instances with zero stats.
	st, err := client.GetCacheState(ctx, &pb.GetCacheStateRequest{TenantId: "default", ModelId: "deepseek"})
	if err != nil || len(st.Replicas) != 2 || st.Replicas[0].ReplicaId != "p0" || st.Summary.TotalPrefixes != 10 {
		t.Fatalf("GetCacheState: %v %v", st, err)
	}
}

// TestGRPCTokenMemoResetWithLastContext: the shared token memo fills with
// a token_ids lookup and is emptied when the last context is dropped, as
// the HTTP memos are; while a context remains it keeps what it holds.
func TestGRPCTokenMemoResetWithLastContext(t *testing.T) {
	e, client, _ := startAppWithDoor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"m0", "m1"} {
		if status, out := e.post("/register", vllmRegistration(name, newPublisher(t).endpoint)); status != 200 {
			t.Fatalf("register %s: %d %v", name, status, out)
		}
	}
	ids := make([]uint32, 1024) // two-byte varints: 2 KiB packed, well past the memo's minimum
	for i := range ids {
		ids[i] = uint32(5000 + i)
	}
	req := &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme, TokenIds: ids}
	if _, err := client.LookupRoute(ctx, req); err != nil {
		t.Fatal(err)
	}
	filled := e.app.tokenMemo.Bytes()
	if filled == 0 {
		t.Fatal("the token memo remembered nothing")
	}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "m0", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister m0: %d %v", status, out)
	}
	// m1 keeps the context: nothing to reset.
	if got := e.app.tokenMemo.Bytes(); got != filled {
		t.Fatalf("memo holds %d bytes with a context left, want %d", got, filled)
	}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "m1", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister m1: %d %v", status, out)
	}
	eventtest.Eventually(t, "the token memo emptied", func() bool { return e.app.tokenMemo.Bytes() == 0 })
}

// TestGRPCTokenMemoResetWithLastScope: a token_ids lookup on a producer
// scheme fills the shared token memo; it is emptied once the last
// producer-fed scope is dropped and no context is left, and kept while a
// scope or a context remains.
func TestGRPCTokenMemoResetWithLastScope(t *testing.T) {
	e, client, _ := startAppWithDoor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := make([]uint32, 1024) // two-byte varints: 2 KiB packed, well past the memo's minimum
	for i := range ids {
		ids[i] = uint32(5000 + i)
	}
	keys := fingerprint.Chain(nil, ids, fingerprint.DefaultBlockSize, nil)
	report := func(replica string) {
		t.Helper()
		u := &pb.CacheStateUpdate{ReplicaId: replica, TenantId: "acme", ModelId: "llama", HashScheme: "vllm",
			Prefixes: []*pb.PrefixEntry{{}}}
		for _, k := range keys {
			u.Prefixes[0].BlockHashes = append(u.Prefixes[0].BlockHashes, fingerprint.Wire(k))
			u.Prefixes[0].BlockTokenCounts = append(u.Prefixes[0].BlockTokenCounts, fingerprint.DefaultBlockSize)
		}
		reportState(t, ctx, client, u)
	}
	clear := func(replica string) {
		t.Helper()
		if _, err := client.PublishEvent(ctx, &pb.CacheEvent{Type: pb.CacheEvent_ALL_CLEARED, ReplicaId: replica, TenantId: "acme", ModelId: "llama"}); err != nil {
			t.Fatal(err)
		}
	}
	fill := func() int {
		t.Helper()
		// Two replicas holding the same run have no distinguishing
		// power (AFFINITY_HINT); either way the ids were decoded.
		resp, err := client.LookupRoute(ctx, &pb.LookupRouteRequest{TenantId: "acme", ModelId: "llama", HashScheme: "vllm", TokenIds: ids})
		if err != nil || (resp.ReasonCode != "PREFIX_MATCH" && resp.ReasonCode != "AFFINITY_HINT") {
			t.Fatalf("lookup: %v %v", resp, err)
		}
		n := e.app.tokenMemo.Bytes()
		if n == 0 {
			t.Fatal("the token memo remembered nothing")
		}
		return n
	}

	// A context and two replicas of one scope.
	if status, out := e.post("/register", vllmRegistration("m0", newPublisher(t).endpoint)); status != 200 {
		t.Fatalf("register m0: %d %v", status, out)
	}
	report("a")
	report("b")
	filled := fill()
	clear("a") // b keeps the scope
	clear("b") // the scope goes, the context stays
	if len(e.app.ix.Scopes()) != 0 {
		t.Fatalf("scopes left: %v", e.app.ix.Scopes())
	}
	if got := e.app.tokenMemo.Bytes(); got != filled {
		t.Fatalf("memo holds %d bytes with a context left, want %d", got, filled)
	}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "m0", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister m0: %d %v", status, out)
	}
	eventtest.Eventually(t, "the token memo emptied with the last context", func() bool { return e.app.tokenMemo.Bytes() == 0 })

	// Producer-fed scopes only: the last one going empties the memo.
	report("c")
	fill()
	clear("c")
	eventtest.Eventually(t, "the token memo emptied with the last scope", func() bool { return e.app.tokenMemo.Bytes() == 0 })
}

// TestGRPCReplicaUpdatedOnSourceState: StreamCacheEvents, through a real
// client, tells REPLICA_UPDATED when a ZMQ-fed engine registers, when its
// source goes live, when it goes stale (after the ALL_CLEARED that retracts
// its blocks), and when a re-registration brings it back.
func TestGRPCReplicaUpdatedOnSourceState(t *testing.T) {
	e, client, _ := startAppWithDoor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := client.StreamCacheEvents(ctx, &pb.StreamEventsRequest{TenantId: "default", ModelId: "deepseek",
		Types: []pb.CacheEvent_Type{pb.CacheEvent_REPLICA_UPDATED, pb.CacheEvent_ALL_CLEARED}})
	if err != nil {
		t.Fatal(err)
	}
	// until reads events until one of type typ for p0 arrives.
	until := func(typ pb.CacheEvent_Type, what string) {
		t.Helper()
		for {
			ev, err := events.Recv()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if ev.Type == typ && ev.ReplicaId == "p0" {
				if ev.TenantId != "default" || ev.ModelId != "deepseek" || len(ev.PrefixHash) != 0 || ev.TimestampUs == 0 {
					t.Fatalf("%s: %v", what, ev)
				}
				return
			}
		}
	}
	// The stream is open once the hub has its watcher: a registration
	// made before that would not be told.
	eventtest.Eventually(t, "the watcher", func() bool { return metricValue(e.scrape(), "conductor_grpc_watchers") == 1 })

	p := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("p0", p.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	until(pb.CacheEvent_REPLICA_UPDATED, "registration")

	tokens := make([]int32, 32)
	for i := range tokens {
		tokens[i] = int32(300 + i)
	}
	keys := vllmKeys(t, tokens)
	stored := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil,
		"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	eventtest.Eventually(t, "p0's blocks", func() bool { p.send(0, stored); return e.deviceHits("p0", tokens) == 32 })
	until(pb.CacheEvent_REPLICA_UPDATED, "the source going live")

	// A sequence gap with no replay endpoint makes the source stale: its
	// blocks are retracted (ALL_CLEARED), then its new state is told.
	p.seq += 5
	p.send(0, stored)
	until(pb.CacheEvent_ALL_CLEARED, "the stale source's retraction")
	until(pb.CacheEvent_REPLICA_UPDATED, "the source going stale")
	if got := e.deviceHits("p0", tokens); got != 0 {
		t.Fatalf("a stale source still has %d tokens", got)
	}

	// Registering again restarts the source; its new states are told.
	if status, out := e.post("/register", vllmRegistration("p0", p.endpoint)); status != 200 {
		t.Fatalf("register again: %d %v", status, out)
	}
	until(pb.CacheEvent_REPLICA_UPDATED, "the restarted source")
	eventtest.Eventually(t, "p0's blocks again", func() bool { p.send(0, stored); return e.deviceHits("p0", tokens) == 32 })
}

// reportState sends u as a one-message ReportCacheState stream and waits
// for the door's acknowledgement.
func reportState(t *testing.T, ctx context.Context, client pb.InferenceCacheClient, u *pb.CacheStateUpdate) {
	t.Helper()
	st, err := client.ReportCacheState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(u); err != nil {
		t.Fatal(err)
	}
	if _, err := st.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}
