package main

import (
	"strconv"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/vmihailenco/msgpack/v5"
)

// The standard hash's vectors (block size 16, seed 1337), tokens 1..64.
var stdVectors = []uint64{16863443419780771464, 12466389667045779788, 960926348267535642, 4923844688253642376}

func seqTokens(from, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(from + i)
	}
	return t
}

func stdRegistration(typ, instance, endpoint string) map[string]any {
	return map[string]any{"endpoint": endpoint, "type": typ, "modelname": "std", "instance_id": instance,
		"block_size": 16, "dp_rank": 0, "hash_profile": map[string]any{"strategy": "rfc1527", "algorithm": "xxh3_64"}}
}

// stdTier is one instance's count in a tier for a prompt, by /query, and
// /query_by_hash with the prompt's standard keys must say the same.
func (e *e2e) stdTier(instance, tier string, tokens []int32) int64 {
	e.t.Helper()
	q := func() int64 {
		st, a := e.post("/query", map[string]any{"model": "std", "block_size": 16, "token_ids": tokens})
		if st != 200 {
			e.t.Fatalf("query: %d %v", st, a)
		}
		return tierCount(a, instance, tier)
	}
	got := q()
	if len(tokens) == 64 && tokens[0] == 1 && tokens[63] == 64 {
		st, b := e.post("/query_by_hash", map[string]any{"model": "std", "block_size": 16, "seq_hashes": stdVectors})
		// Events may land between the two lookups: compared when the
		// index did not move around the hash lookup.
		if again := q(); st != 200 || (again == got && tierCount(b, instance, tier) != got) {
			e.t.Fatalf("/query_by_hash %d %v differs from /query's %d", st, b, got)
		}
	}
	return got
}

// Engines registered with the standard hash: the blocks are keyed by H
// recomputed from token ids and the parent's H, whatever the engine's own
// hashes are (here arbitrary numbers, as a vLLM with another
// PYTHONHASHSEED would publish); removals by engine hash find them; a
// block whose parent is unknown is rejected and counted; a salted block is
// unreachable; SGLang's signed hashes work the same; unregistering
// releases the map. Real ZMQ and HTTP.
func TestStandardHashEnginesEndToEnd(t *testing.T) {
	e := startApp(t)
	pub := newPublisher(t)
	if st, out := e.post("/register", stdRegistration("vLLM", "std-v", pub.endpoint)); st != 200 {
		t.Fatalf("register: %d %v", st, out)
	}
	tokens := seqTokens(1, 64)
	stored := func(hashes []uint64, parent any, toks []int32, extra any) map[string]any {
		return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
			"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": extra}
	}
	eventtest.Eventually(t, "the first two blocks", func() bool {
		pub.send(0, stored([]uint64{1001, 1002}, nil, tokens[:32], []any{nil, nil}))
		return e.stdTier("std-v", "device", tokens) == 32
	})
	pub.send(0, stored([]uint64{1003}, uint64(1002), tokens[32:48], []any{nil}))
	eventtest.Eventually(t, "a child by its parent's engine hash", func() bool { return e.stdTier("std-v", "device", tokens) == 48 })

	rejected := func(reason string) float64 {
		return max(metricValue(e.scrape(), `conductor_events_rejected_total{reason="`+reason+`",source_type="vLLM"}`), 0)
	}
	before := rejected("unknown_parent")
	pub.send(0, stored([]uint64{1004}, uint64(999), tokens[48:64], []any{nil}))
	eventtest.Eventually(t, "the unknown parent counted", func() bool { return rejected("unknown_parent") == before+1 })
	if got := e.stdTier("std-v", "device", tokens); got != 48 {
		t.Errorf("after an orphan block: %d, want 48 (never guessed)", got)
	}

	// A salted chain: the standard has no salt, so it is unreachable.
	salted := seqTokens(500, 32)
	pub.send(0, stored([]uint64{2001, 2002}, nil, salted, []any{[]any{map[string]any{"type": "cache_salt", "salt": "s"}}, nil}))
	pub.send(0, stored([]uint64{1005}, uint64(1003), tokens[48:64], []any{nil})) // a marker after it
	eventtest.Eventually(t, "the batch after the salted one", func() bool { return e.stdTier("std-v", "device", tokens) == 64 })
	if got := e.stdTier("std-v", "device", salted); got != 0 {
		t.Errorf("salted blocks reachable by a plain query: %d", got)
	}

	pub.send(0, map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{1002}, "medium": "GPU"})
	eventtest.Eventually(t, "removal by the engine's hash", func() bool { return e.stdTier("std-v", "device", tokens) == 16 })

	// SGLang: signed int64 hashes, its own medium names.
	spub := newPublisher(t)
	if st, out := e.post("/register", stdRegistration("SGLang", "std-s", spub.endpoint)); st != 200 {
		t.Fatalf("register sglang: %d %v", st, out)
	}
	sstored := map[string]any{"type": "BlockStored", "block_hashes": []int64{-5, -6}, "parent_block_hash": nil, "token_ids": tokens[:32],
		"block_size": 16, "lora_id": nil, "medium": "GPU"}
	eventtest.Eventually(t, "SGLang blocks", func() bool {
		spub.send(0, sstored)
		return e.stdTier("std-s", "device", tokens) == 32
	})
	spub.send(0, map[string]any{"type": "BlockRemoved", "block_hashes": []int64{-5}, "medium": "GPU"})
	eventtest.Eventually(t, "SGLang removal", func() bool { return e.stdTier("std-s", "device", tokens) == 0 })

	if g := metricValue(e.scrape(), "conductor_stale_sources"); g != 0 {
		t.Errorf("stale sources %v", g)
	}
	for _, inst := range []string{"std-v", "std-s"} {
		if st, out := e.post("/unregister", map[string]any{"instance_id": inst, "dp_rank": 0}); st != 200 {
			t.Fatalf("unregister: %d %v", st, out)
		}
	}
}

// The master and generic RFC #1527 streams under the standard hash: keys
// from seq_hashes (a value ≥ 2^63 arrives negative in the legacy
// block_hashes, which is not read), decimal and 0x object keys, a
// multi-block stored run with base_block_idx and parent_hash, a key that is
// no u64 refused and counted with the source live, removals as before.
func TestStandardHashMooncakeEndToEnd(t *testing.T) {
	e := startApp(t)
	engine := newPublisher(t)
	if st, out := e.post("/register", stdRegistration("vLLM", "std-e", engine.endpoint)); st != 200 {
		t.Fatalf("register engine: %d %v", st, out)
	}
	m := newMaster(t)
	if st, out := e.post("/register", stdRegistration("Mooncake", "std-pool", m.endpoint)); st != 200 {
		t.Fatalf("register master: %d %v", st, out)
	}
	id := 0
	event := func(kind string, key any, seq []uint64, more ...any) map[string]any {
		id++
		if seq == nil {
			seq = []uint64{}
		}
		legacy := []any{}
		for _, h := range seq {
			legacy = append(legacy, int64(h))
		}
		ev := map[string]any{"event_id": id, "timestamp": 1789095808500, "event_type": kind, "model_name": "std",
			"block_size": 16, "additional_salt": nil, "lora_name": nil, "tenant_id": "default", "backend_id": "pool",
			"medium": "cpu", "dp_rank": 0, "group_id": nil, "seq_hashes": seq, "block_hashes": legacy, "base_block_idx": nil}
		if key != nil {
			ev["object_key"] = key
		}
		if kind == "stored" {
			ev["base_block_idx"], ev["parent_hash"], ev["token_ids"] = 0, nil, nil
		}
		for i := 0; i+1 < len(more); i += 2 {
			ev[more[i].(string)] = more[i+1]
		}
		return ev
	}
	send := func(evs ...map[string]any) {
		t.Helper()
		payload, err := msgpack.Marshal([]any{uint64(1789095808500), evs, 0})
		if err != nil {
			t.Fatal(err)
		}
		m.sendPayload(payload)
	}
	tokens := seqTokens(1, 64)
	rejected := func(reason string) float64 {
		return max(metricValue(e.scrape(), `conductor_events_rejected_total{reason="`+reason+`",source_type="Mooncake"}`), 0)
	}
	m.awaitSubscription()
	send(event("stored", strconv.FormatUint(stdVectors[0], 10), stdVectors[:1]),
		event("stored", "0x"+strconv.FormatUint(stdVectors[1], 16), stdVectors[1:2]))
	eventtest.Eventually(t, "decimal and 0x keys", func() bool { return e.stdTier("std-e", "cpu_share", tokens) == 32 })

	badKey, badChain := rejected("object_key"), rejected("seq_hashes")
	send(event("stored", "dep@std@tp_rank:0@abc", nil),
		event("stored", nil, stdVectors[2:4], "base_block_idx", 2), // no parent_hash for a run not at 0
		event("stored", nil, stdVectors[2:4], "base_block_idx", 2, "parent_hash", stdVectors[1]))
	eventtest.Eventually(t, "the multi-block run", func() bool { return e.stdTier("std-e", "cpu_share", tokens) == 64 })
	if got := rejected("object_key") - badKey; got != 1 {
		t.Errorf("object_key rejections %v, want 1", got)
	}
	if got := rejected("seq_hashes") - badChain; got != 1 {
		t.Errorf("seq_hashes rejections %v, want 1", got)
	}
	send(event("removed", strconv.FormatUint(stdVectors[1], 10), stdVectors[1:2]))
	eventtest.Eventually(t, "removal", func() bool { return e.stdTier("std-e", "cpu_share", tokens) == 16 })
	if g := metricValue(e.scrape(), "conductor_stale_sources"); g != 0 {
		t.Errorf("stale sources %v, want 0", g)
	}
}
