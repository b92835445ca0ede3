package main

import (
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
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
	eventtest.Eventually(t, "state connected", func() bool { return metricValue(e.scrape(), state("connected")) == 1 })
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
	eventtest.Eventually(t, "blocks checked", func() bool {
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

// A vLLM BlockStored without extra_keys cannot be re-hashed (a salt or a
// multimodal key may have entered it): its blocks are counted as skipped,
// with the reason, instead of leaving match and mismatch silently at zero.
func TestHashCheckCountsSkippedBlocks(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if status, out := e.post("/register", vllmRegistration("sk0", pub.endpoint)); status != 200 {
		t.Fatalf("register: %d %v", status, out)
	}
	series := func(name, labels string) string { return name + `{` + labels + `,service="sk0|default|0"}` }
	text := e.scrape()
	if got := metricValue(text, series("conductor_hash_check_total", `result="skipped"`)); got != 0 {
		t.Fatalf("skipped = %v before any event, want an exported 0", got)
	}
	if !strings.Contains(text, series("conductor_hash_check_skipped_total", `reason="no_extra_keys"`)+" 0") {
		t.Fatalf("no zero no_extra_keys series:\n%s", grepLines(text, "hash_check"))
	}
	tokens := make([]int32, 32)
	for i := range tokens {
		tokens[i] = int32(5000 + i)
	}
	stored := map[string]any{"type": "BlockStored", "block_hashes": vllmKeys(t, tokens), "parent_block_hash": nil,
		"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
	defer func() {
		if t.Failed() {
			t.Log(grepLines(e.scrape(), "sk0"), grepLines(e.scrape(), "events_"))
		}
	}()
	eventtest.Eventually(t, "blocks skipped", func() bool {
		pub.send(0, stored)
		return metricValue(e.scrape(), series("conductor_hash_check_skipped_total", `reason="no_extra_keys"`)) >= 2
	})
	text = e.scrape()
	for _, r := range []string{"match", "mismatch"} {
		if got := metricValue(text, series("conductor_hash_check_total", `result="`+r+`"`)); got != 0 {
			t.Errorf("%s = %v for blocks without extra_keys", r, got)
		}
	}
	if got, want := metricValue(text, series("conductor_hash_check_total", `result="skipped"`)),
		metricValue(text, series("conductor_hash_check_skipped_total", `reason="no_extra_keys"`)); got != want || got < 2 {
		t.Errorf("skipped total %v, by reason %v", got, want)
	}
}
