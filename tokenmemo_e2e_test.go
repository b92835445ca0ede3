package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	pb "github.com/mooncake-conductor-go/conductor/internal/inferencecache/proto/inferencecache/v1alpha1"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// postCompact posts body to path packed as Python's packer writes it (each
// integer in its smallest format), the MessagePack form the token memo
// derives for ids the gRPC door learned.
func (e *e2e) postCompact(path string, body map[string]any) (int, map[string]any) {
	e.t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(body); err != nil {
		e.t.Fatal(err)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.base + path)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/msgpack")
	req.SetBody(buf.Bytes())
	if err := e.c.DoTimeout(req, resp, 10*time.Second); err != nil {
		e.t.Fatal(err)
	}
	var out map[string]any
	if err := msgpack.Unmarshal(resp.Body(), &out); err != nil {
		e.t.Fatalf("%s: %v", path, err)
	}
	return resp.StatusCode(), out
}

// TestOneTokenMemoServesBothDoors: the service has one token memo. Once
// both doors have looked token ids up, a prompt /query decoded is a hit for
// LookupRoute (every id copied, none decoded), and one LookupRoute decoded
// is a hit for /query; the answers are those
// the other door gives and those a lookup the memo misses gives. Both
// doors' ids are counted in the one conductor_token_memo_tokens_total.
func TestOneTokenMemoServesBothDoors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Ids past 127: three bytes each in MessagePack, two as varints, so
	// the doors' bytes differ.
	e, client, tokens, ids := memoFixture(t, 7000, 3, 40)

	memo := e.app.tokenMemo
	query := func() int64 {
		t.Helper()
		status, out := e.postCompact("/query", map[string]any{"model": "deepseek", "block_size": 16, "token_ids": tokens})
		if status != 200 {
			t.Fatalf("query: %d %v", status, out)
		}
		n, _ := msgpackInt(out["instances"].(map[string]any)["p0"].(map[string]any)["device"])
		return n
	}
	lookup := func() *pb.LookupRouteResponse {
		t.Helper()
		resp, err := client.LookupRoute(ctx, &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme, TokenIds: ids})
		if err != nil || resp.ReasonCode != "PREFIX_MATCH" || len(resp.ReplicaScores) != 1 {
			t.Fatalf("lookup: %v %v", resp, err)
		}
		return resp
	}
	// expect runs step and checks the memo's counts moved by hits and
	// misses ids.
	expect := func(what string, hits, misses uint64, step func()) {
		t.Helper()
		h0, m0 := memo.Stats()
		step()
		if h, m := memo.Stats(); h-h0 != hits || m-m0 != misses {
			t.Fatalf("%s: %d ids copied and %d decoded, want %d and %d", what, h-h0, m-m0, hits, misses)
		}
	}
	same := cmp.Options{protocmp.Transform(), protocmp.IgnoreFields(&pb.LookupRouteResponse{}, "lookup_latency_us")}

	// Until the gRPC door has looked token ids up, entries carry no
	// varint form: its first lookup decodes.
	memo.Reset()
	var httpDevice int64
	expect("/query, memo empty", 0, 1024, func() { httpDevice = query() })
	expect("LookupRoute, the door's first", 0, 1024, func() { lookup() })
	// From then on /query teaches, LookupRoute finds.
	memo.Reset()
	expect("/query, memo empty, both doors in use", 0, 1024, func() { httpDevice = query() })
	var hit *pb.LookupRouteResponse
	expect("LookupRoute after /query", 1024, 0, func() { hit = lookup() })
	if got := hit.ReplicaScores[0].MatchedTokens; int64(got) != httpDevice || httpDevice != 640 {
		t.Fatalf("LookupRoute matched %d, /query %d, want 640", got, httpDevice)
	}
	memo.Reset()
	var miss *pb.LookupRouteResponse
	expect("LookupRoute, memo empty", 0, 1024, func() { miss = lookup() })
	if diff := cmp.Diff(miss, hit, same); diff != "" {
		t.Fatalf("LookupRoute answers differ with the memo's ids (-decoded +copied):\n%s", diff)
	}
	// LookupRoute taught (just above), /query finds.
	expect("/query after LookupRoute", 1024, 0, func() {
		if got := query(); got != httpDevice {
			t.Fatalf("/query with LookupRoute's ids: %d, decoded: %d", got, httpDevice)
		}
	})
	// The response is the same message either way, byte for byte once the
	// latency is cleared.
	hit.LookupLatencyUs, miss.LookupLatencyUs = 0, 0
	if a, b := mustMarshal(t, hit), mustMarshal(t, miss); !bytes.Equal(a, b) {
		t.Fatal("the encoded answers differ")
	}
	if m := e.scrape(); !bytes.Contains([]byte(m), []byte(`conductor_token_memo_tokens_total{result="hit"}`)) {
		t.Fatal("conductor_token_memo_tokens_total missing")
	}
}

// TestTokenMemoSharesIdsNotAnswers: the memo holds ids, never answers, so
// what changes an answer (the cache salt, the instance filter, the model,
// the block size and hash profile a context has, the hash scheme a lookup
// names) is applied after it: the same ids asked with other parameters
// share the memo's entry, and each answer is the one the memo off gives.
func TestTokenMemoSharesIdsNotAnswers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, client, tokens, ids := memoFixture(t, 9000, 5, 32)

	memo := e.app.tokenMemo
	device := func(body map[string]any) int64 {
		t.Helper()
		body["token_ids"] = tokens
		status, out := e.postCompact("/query", body)
		if status != 200 {
			t.Fatalf("query %v: %d %v", body, status, out)
		}
		in, ok := out["instances"].(map[string]any)["p0"].(map[string]any)
		if !ok {
			return 0
		}
		n, _ := msgpackInt(in["device"])
		return n
	}
	httpCases := []struct {
		name string
		body map[string]any
		want int64
	}{
		{"plain", map[string]any{"model": "deepseek", "block_size": 16}, 512},
		{"salted", map[string]any{"model": "deepseek", "block_size": 16, "cache_salt": "tenant-a"}, 0},
		{"other instance", map[string]any{"model": "deepseek", "block_size": 16, "instance_id": "p9"}, 0},
		{"other model", map[string]any{"model": "llama", "block_size": 16}, 0},
	}
	grpcCases := []struct {
		name   string
		req    *pb.LookupRouteRequest
		reason string
	}{
		{"conductor scheme", &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: conductorScheme}, "PREFIX_MATCH"},
		{"other block size", &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: "conductor/vllm_v1/sha256_cbor/0/32"}, ""},
		{"other hash seed", &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: "conductor/vllm_v1/sha256_cbor/1/16"}, ""},
		{"producer scheme", &pb.LookupRouteRequest{TenantId: "default", ModelId: "deepseek", HashScheme: "vllm"}, ""},
	}
	answers := func() (http []int64, grpc []*pb.LookupRouteResponse) {
		t.Helper()
		for _, c := range httpCases {
			b := map[string]any{}
			for k, v := range c.body {
				b[k] = v
			}
			http = append(http, device(b))
		}
		for _, c := range grpcCases {
			req := proto.Clone(c.req).(*pb.LookupRouteRequest)
			req.TokenIds = ids
			resp, err := client.LookupRoute(ctx, req)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			grpc = append(grpc, resp)
		}
		return http, grpc
	}
	// Every request after the first finds the ids the first decoded.
	memo.Reset()
	h0, _ := memo.Stats()
	httpWarm, grpcWarm := answers()
	h1, _ := memo.Stats()
	if h1-h0 < uint64(len(httpCases)-1)*1024 {
		t.Fatalf("the ids were copied for %d ids in all, want every request after the first", h1-h0)
	}
	// The same requests, each decoding its ids itself.
	var httpCold []int64
	var grpcCold []*pb.LookupRouteResponse
	for i := range httpCases {
		memo.Reset()
		b := map[string]any{}
		for k, v := range httpCases[i].body {
			b[k] = v
		}
		httpCold = append(httpCold, device(b))
	}
	for _, c := range grpcCases {
		memo.Reset()
		req := proto.Clone(c.req).(*pb.LookupRouteRequest)
		req.TokenIds = ids
		resp, err := client.LookupRoute(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		grpcCold = append(grpcCold, resp)
	}
	for i, c := range httpCases {
		if httpWarm[i] != c.want || httpCold[i] != c.want {
			t.Errorf("/query %s: %d with the memo, %d without, want %d", c.name, httpWarm[i], httpCold[i], c.want)
		}
	}
	same := cmp.Options{protocmp.Transform(), protocmp.IgnoreFields(&pb.LookupRouteResponse{}, "lookup_latency_us")}
	for i, c := range grpcCases {
		if diff := cmp.Diff(grpcCold[i], grpcWarm[i], same); diff != "" {
			t.Errorf("LookupRoute %s differs with the memo (-without +with):\n%s", c.name, diff)
		}
		if c.reason != "" && grpcWarm[i].ReasonCode != c.reason {
			t.Errorf("LookupRoute %s: %v", c.name, grpcWarm[i])
		}
	}
	if got := grpcWarm[0].GetReplicaScores(); len(got) != 1 || got[0].MatchedTokens != 512 {
		t.Errorf("LookupRoute under the context's scheme: %v", got)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// memoFixture starts the service with both doors and one vLLM publisher,
// p0, and stores the first blocks (16 tokens each) of a 1024-token prompt
// whose ids run from base by stride; it returns the prompt as /query and
// as gRPC ids.
func memoFixture(t *testing.T, base, stride, blocks int) (*e2e, pb.InferenceCacheClient, []int32, []uint32) {
	t.Helper()
	e, client, _ := startAppWithDoor(t)
	p := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("p0", p.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	tokens := make([]int32, 1024)
	ids := make([]uint32, len(tokens))
	for i := range tokens {
		tokens[i] = int32(base + stride*i)
		ids[i] = uint32(tokens[i])
	}
	keys := vllmKeys(t, tokens)
	stored := map[string]any{"type": "BlockStored", "block_hashes": keys[:blocks], "parent_block_hash": nil,
		"token_ids": tokens[:16*blocks], "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	eventtest.Eventually(t, "p0's blocks", func() bool { p.send(0, stored); return e.deviceHits("p0", tokens) == int64(16*blocks) })
	return e, client, tokens, ids
}
