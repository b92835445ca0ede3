package main

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestLinksEndToEnd: through the running app, a vLLM BlockStored with
// token ids over real ZMQ is verified into links, a /query takes its
// blocks' digests from them (and answers as it would by hashing), and the
// links are emptied when the last context is unregistered.
func TestLinksEndToEnd(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("p0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	tokens := make([]int32, 8*16)
	for i := range tokens {
		tokens[i] = int32(3000 + i)
	}
	keys := vllmKeys(t, tokens)
	stored := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil, "token_ids": tokens,
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	eventtest.Eventually(t, "BlockStored to reach the links", func() bool {
		pub.send(0, stored)
		return metricValue(e.scrape(), "conductor_link_memo_recorded_total") >= 8
	})
	if got := e.deviceHits("p0", tokens); got != int64(len(tokens)) {
		t.Fatalf("device hits %d, want %d", got, len(tokens))
	}
	m := e.scrape()
	if hits := metricValue(m, "conductor_link_memo_hits_total"); hits < 8 {
		t.Errorf("the query took %v blocks from links, want all 8", hits)
	}
	if b := metricValue(m, "conductor_link_memo_bytes"); b <= 0 {
		t.Errorf("links hold %v bytes", b)
	}
	if status, out := e.post("/unregister", map[string]any{"instance_id": "p0", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister: %d %v", status, out)
	}
	eventtest.Eventually(t, "the links emptied", func() bool { return metricValue(e.scrape(), "conductor_link_memo_bytes") == 0 })
}
