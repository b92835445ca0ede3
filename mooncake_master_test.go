package main

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// sendPayload publishes one payload as the master does: an empty topic,
// the next sequence number, the payload.
func (m *master) sendPayload(payload []byte) {
	m.t.Helper()
	m.seq++
	if _, err := m.pub.SendMessage("", seqBytes(m.seq), payload); err != nil {
		m.t.Fatal(err)
	}
}

// The Mooncake Store master as released (v0.3.12, main) stamps no context
// on its events. Driven over real ZMQ with the fixtures' bytes of that
// publisher, a Mooncake registration supplies the context: the objects
// reach the shared tiers of the engine context it names (memory replicas
// cpu_share, disk replicas disk), unparsable keys are rejected and counted
// while the source stays live, and an object's one removal releases it in
// both tiers.
func TestReleasedMooncakeMasterEndToEnd(t *testing.T) {
	e := startApp(t)
	fx := eventtest.LoadManifest(t)
	payload := func(id string) []byte { return eventtest.Payload(t, fx.Fixture(t, id)) }

	engine := newPublisher(t)
	profile := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}
	if status, out := e.post("/register", map[string]any{
		"endpoint": engine.endpoint, "type": "vLLM", "modelname": "test-model", "instance_id": "vllm-a",
		"block_size": 4, "dp_rank": 0, "hash_profile": profile,
	}); status != 200 {
		t.Fatalf("register engine: %d %v", status, out)
	}
	m := newMaster(t)
	if status, out := e.post("/register", map[string]any{
		"endpoint": m.endpoint, "type": "Mooncake", "modelname": "test-model", "instance_id": "pool-r-sub",
		"block_size": 4, "dp_rank": 0, "hash_profile": profile,
	}); status != 200 {
		t.Fatalf("register master: %d %v", status, out)
	}
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8} // the manifest's vllm_tokens: two blocks
	tiers := func() (cpuShare, disk int64) {
		status, a := e.post("/query", map[string]any{"model": "test-model", "block_size": 4, "token_ids": tokens})
		if status != 200 {
			t.Fatalf("query: %d %v", status, a)
		}
		return tierCount(a, "vllm-a", "cpu_share"), tierCount(a, "vllm-a", "disk")
	}
	rejected := func(reason string) float64 {
		return metricValue(e.scrape(), `conductor_events_rejected_total{reason="`+reason+`",source_type="Mooncake"}`)
	}

	applied := func() float64 {
		return metricValue(e.scrape(), `conductor_events_applied_total{reason="",source_type="Mooncake"}`)
	}
	// A /query tier counts the blocks held there or in a faster tier, so
	// disk alone shows only where cpu_share has a gap.
	want := func(what string, cpuShare, disk int64) {
		t.Helper()
		eventtest.Eventually(t, what, func() bool {
			c, d := tiers()
			return c == cpuShare && d == disk
		})
	}

	m.awaitSubscription()
	m.sendPayload(payload("mooncake_released_stored_cpu_disk")) // block 1 in memory and on disk
	want("block 1 in cpu_share and disk", 4, 4)
	m.sendPayload(payload("mooncake_released_stored_no_legacy")) // block 2 on disk, legacy fields off
	want("block 2 on disk", 4, 8)

	// Unparsable keys: rejected and counted; the batch's last event
	// (block 2 in memory) and the source go on.
	before := max(rejected("object_key"), 0)
	m.sendPayload(payload("mooncake_released_bad_keys"))
	want("the good event after the rejected keys", 8, 8)
	if got := rejected("object_key") - before; got != 4 {
		t.Errorf("object_key rejections = %v, want 4", got)
	}

	// The object's one removal (medium cpu) releases it on disk too.
	m.sendPayload(payload("mooncake_released_removed_cpu_disk"))
	want("block 1 gone from both tiers", 0, 0)

	// TP ranks are separate objects: block 1 stays while one is stored.
	m.sendPayload(payload("mooncake_released_stored_tp_ranks"))
	want("block 1 from two TP ranks", 8, 8)
	n := applied()
	m.sendPayload(payload("mooncake_released_removed_tp0"))
	eventtest.Eventually(t, "the TP 0 removal applied", func() bool { return applied() == n+1 })
	if c, d := tiers(); c != 8 || d != 8 {
		t.Errorf("after TP 0's removal: cpu_share %d, disk %d; want 8, 8 (TP 1's object holds block 1)", c, d)
	}
	text := e.scrape()
	if got := metricValue(text, "conductor_stale_sources"); got != 0 {
		t.Errorf("stale sources %v, want 0", got)
	}
	if got := metricValue(text, `conductor_events_rejected_total{reason="dp_rank",source_type="Mooncake"}`); got > 0 {
		t.Errorf("dp_rank rejections %v, want none", got)
	}
}
