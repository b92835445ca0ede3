package main

import (
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// sendArrays publishes one batch whose events are already shaped, such as
// the tagged arrays of engines before map-encoded events.
func (p *publisher) sendArrays(dpRank int, events ...any) {
	p.t.Helper()
	p.sendBatch(dpRank, events)
}

// TestEndToEndArrayEncodedVLLM: a vLLM release before v0.26.0 publishes
// its events as tagged arrays (docs/events.md#array-encoded-events) over a
// real ZMQ socket; /query sees what they store and remove, whatever the
// release's layout (docs/engines.md#event-layouts), and the service's own
// rejected and ignored counters, exported at zero from registration, count
// what it sent and go with its unregistration.
func TestEndToEndArrayEncodedVLLM(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("a0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	const (
		wrongType = `conductor_service_events_rejected_total{reason="wrong_type",service="a0|default|0",type="vLLM"}`
		medium    = `conductor_service_events_ignored_total{reason="medium",service="a0|default|0",type="vLLM"}`
	)
	text := e.scrape()
	if metricValue(text, wrongType) != 0 || metricValue(text, medium) != 0 {
		t.Fatalf("per-service series not exported at zero on registration: %v %v", metricValue(text, wrongType), metricValue(text, medium))
	}
	tokens := make([]int32, 40)
	for i := range tokens {
		tokens[i] = int32(3000 + i)
	}
	keys := vllmKeys(t, tokens)
	// the layout of PR #19737 (medium, no lora_name): trailing fields absent
	stored := []any{"BlockStored", keys, nil, tokens[:32], 16, nil, "GPU"}
	eventtest.Eventually(t, "an array-encoded BlockStored to reach /query", func() bool {
		pub.sendArrays(0, stored)
		return e.deviceHits("a0", tokens) == 32
	})
	pub.sendArrays(0, []any{"BlockRemoved", keys[1:], "GPU"})
	eventtest.Eventually(t, "an array-encoded BlockRemoved", func() bool { return e.deviceHits("a0", tokens) == 16 })

	// One batch: a wrong type at the block_size position (rejected), a
	// CPU-pool store (ignored), the newest array layout storing block 2.
	pub.sendArrays(0,
		[]any{"BlockStored", keys[1:], keys[0], tokens[16:32], "16", nil, "GPU"},
		[]any{"BlockStored", keys[1:], keys[0], tokens[16:32], 16, nil, "CPU"},
		[]any{"BlockStored", keys[1:], keys[0], tokens[16:32], 16, nil, "GPU", nil, []any{nil}, 0, "full_attention", nil})
	eventtest.Eventually(t, "the newest layout's store", func() bool { return e.deviceHits("a0", tokens) == 32 })
	text = e.scrape()
	if got := metricValue(text, wrongType); got != 1 {
		t.Errorf("%s = %v, want 1", wrongType, got)
	}
	if got := metricValue(text, medium); got != 1 {
		t.Errorf("%s = %v, want 1", medium, got)
	}
	if got := metricValue(text, `conductor_events_rejected_total{reason="wrong_type",source_type="vLLM"}`); got < 1 {
		t.Errorf("rejections by source type: %v", got)
	}

	// A release before medium existed: its clear and its stores, GPU only.
	pub.sendArrays(0, []any{"AllBlocksCleared"})
	eventtest.Eventually(t, "an array-encoded AllBlocksCleared", func() bool { return e.deviceHits("a0", tokens) == 0 })
	pub.sendArrays(0, []any{"BlockStored", keys[:1], nil, tokens[:16], 16, nil})
	eventtest.Eventually(t, "a store without a medium position", func() bool { return e.deviceHits("a0", tokens) == 16 })

	if status, out := e.post("/unregister", map[string]any{"instance_id": "a0", "tenant_id": "default", "dp_rank": 0}); status != 200 {
		t.Fatalf("unregister: %d %v", status, out)
	}
	if text := e.scrape(); strings.Contains(text, `service="a0|default|0"`) {
		t.Errorf("per-service series left after unregistration")
	}
}

// TestEndToEndArrayEncodedSGLang: SGLang 0.5.18 and earlier publish tagged
// arrays (a 6-field store from before medium, a salted store with its
// metadata map at position 7); one batch may mix them with map events.
// Registered under the standard hash, so the engine's hashes only name
// blocks and /query finds them by their tokens.
func TestEndToEndArrayEncodedSGLang(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if st, out := e.post("/register", stdRegistration("SGLang", "arr-s", pub.endpoint)); st != 200 {
		t.Fatalf("register: %d %v", st, out)
	}
	tokens := seqTokens(7, 48)
	eventtest.Eventually(t, "an array-encoded SGLang store", func() bool {
		pub.sendArrays(0, []any{"BlockStored", []int64{-5, -6}, nil, tokens[:32], 16, nil})
		return e.stdTier("arr-s", "device", tokens) == 32
	})
	// the PR #30827 layout: medium always sent, metadata after it
	pub.sendArrays(0,
		[]any{"BlockStored", []int64{-7}, int64(-6), tokens[32:48], 16, nil, nil, map[string]any{"cache_salt": ""}},
		map[string]any{"type": "BlockRemoved", "block_hashes": []int64{-5}, "medium": "CPU_PINNED"})
	eventtest.Eventually(t, "the store with a metadata map", func() bool { return e.stdTier("arr-s", "device", tokens) == 48 })
	pub.sendArrays(0, []any{"BlockRemoved", []int64{-6}, nil})
	eventtest.Eventually(t, "an array-encoded removal", func() bool { return e.stdTier("arr-s", "device", tokens) == 16 })
	pub.sendArrays(0, []any{"AllBlocksCleared"})
	eventtest.Eventually(t, "an array-encoded clear", func() bool { return e.stdTier("arr-s", "device", tokens) == 0 })
	text := e.scrape()
	if got := metricSum(text, `conductor_service_events_rejected_total{`); got != 0 {
		t.Errorf("rejected events: %v", got)
	}
}
