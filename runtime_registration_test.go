package main

import (
	"testing"
)

// TestRuntimeRegistrationConnectedAndChecked: a service registered at run
// time (POST /register, not the config file) reports connected as soon as
// its publisher's connection is up, before any batch, and its BlockStored
// events reach the hash checker: blocks hashed as the registered profile
// does count as matches, none as mismatches.
func TestRuntimeRegistrationConnectedAndChecked(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("rt0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	state := func(s string) string {
		return `conductor_subscriber_state{service="rt0|default|0",state="` + s + `",type="vLLM"}`
	}
	eventually(t, "state connected", func() bool { return metricValue(e.scrape(), state("connected")) == 1 })
	if got := metricValue(e.scrape(), state("connecting")); got != 0 {
		t.Fatalf("connecting = %v while connected", got)
	}

	tokens := make([]int32, 32)
	for i := range tokens {
		tokens[i] = int32(2000 + 3*i)
	}
	keys := vllmKeys(t, tokens)
	stored := map[string]any{"type": "BlockStored", "block_hashes": keys, "parent_block_hash": nil, "token_ids": tokens,
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": []any{nil, nil}}
	// A PUB drops what it sends before the subscription arrives: resend
	// until the source is live.
	match := `conductor_hash_check_total{result="match",service="rt0|default|0"}`
	eventually(t, "blocks checked", func() bool {
		pub.send(0, stored)
		return metricValue(e.scrape(), match) >= 2
	})
	text := e.scrape()
	if got := metricValue(text, state("live")); got != 1 {
		t.Errorf("live = %v after batches", got)
	}
	if got := metricValue(text, `conductor_hash_check_total{result="mismatch",service="rt0|default|0"}`); got != 0 {
		t.Errorf("mismatches = %v, want 0", got)
	}
}
