package subscriber

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// TestRejectedEventLogNamesTheValues: a rejected event's WARN names the
// value the rule judged and what the registration expected, not only the
// reason: block_size 32 against 16 registered on a dense event, a group's
// block size that is no multiple, a group index past the limit; an
// array-encoded event's line says so (its positions were judged).
func TestRejectedEventLogNamesTheValues(t *testing.T) {
	seed := "0"
	prof := mustResolve(t, hashing.StrategyVLLMV1, hashing.AlgorithmSHA256CBOR, "low64_be", &seed)
	logs := &eventtest.LogBuffer{}
	ctx := eventtest.ContextOf(eventtest.Registration{Modelname: "test-model", BlockSize: 16})
	pub := newPublisher(t, ipcEndpoint(t, "pub"))
	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "rej|default|0", Type: sourcetype.VLLM, Endpoint: pub.endpoint},
		Index:     IndexConfig{Context: ctx, Profile: prof, Engine: &eventtest.Recorder{}, Owner: eventtest.Owner},
		Report:    ReportConfig{Logger: zerolog.New(logs)},
		Resources: NewResources(ResourcesOptions{Counters: NewCounters()}),
	})
	defer s.Stop()
	pub.waitSubscribed()
	stored := func(extra map[string]any) map[string]any {
		m := map[string]any{"type": "BlockStored", "block_hashes": []uint64{7}, "parent_block_hash": nil,
			"token_ids": make([]int32, 16), "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	p, err := msgpack.Marshal([]any{1789095808.5, []any{
		stored(map[string]any{"block_size": 32}),
		stored(map[string]any{"block_size": 24, "group_idx": 1, "kv_cache_spec_kind": "full_attention"}),
		stored(map[string]any{"group_idx": 12, "kv_cache_spec_kind": "full_attention"}),
		[]any{"BlockStored", []uint64{7}, nil, make([]int32, 16), 32, nil, "GPU"},
	}, nil})
	if err != nil {
		t.Fatal(err)
	}
	pub.send(1, p)
	waitSeq(t, s, 1)
	var got []map[string]any
	for _, l := range logs.Lines(t) {
		if l["message"] == "event rejected" {
			delete(l, "time")
			delete(l, "endpoint")
			got = append(got, l)
		}
	}
	base := map[string]any{"level": "warn", "message": "event rejected", "service": "rej|default|0", "type": "vLLM", "seq": 1.0}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	want := []map[string]any{
		with("event", 0.0, "reason", "block_size", "block_size", 32.0, "registered_block_size", 16.0,
			"rule", "an event without group fields has the registered block_size"),
		with("event", 1.0, "reason", "block_size", "group", 1.0, "block_size", 24.0, "registered_block_size", 16.0,
			"rule", "a group's block_size is a positive multiple of the registered (hash) block size"),
		with("event", 2.0, "reason", "group", "group_idx", 12.0, "max_groups", 10.0),
		with("event", 3.0, "reason", "block_size", "encoding", "array", "block_size", 32.0, "registered_block_size", 16.0,
			"rule", "an event without group fields has the registered block_size"),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rejection lines (-want +got):\n%s\n%s", diff, logs)
	}
}

// TestConnectWatchSaysItOnce: the warning is due once the wait has passed
// while still not connected, and never again; a connection before the wait
// means no warning at all.
func TestConnectWatchSaysItOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w := connectWatch{since: t0, after: 30 * time.Second}
	if w.due(t0.Add(29*time.Second), false) {
		t.Fatal("due before the wait")
	}
	if at := w.wakeAt(false); !at.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("wake at %v", at)
	}
	if !w.due(t0.Add(30*time.Second), false) {
		t.Fatal("not due after the wait")
	}
	for i := range 100 {
		if w.due(t0.Add(time.Duration(31+i)*time.Second), false) {
			t.Fatalf("due again at +%d s", 31+i)
		}
	}
	if at := w.wakeAt(false); !at.IsZero() {
		t.Fatalf("still waking at %v after the warning", at)
	}
	c := connectWatch{since: t0, after: 30 * time.Second}
	if c.due(t0.Add(time.Hour), true) || !c.wakeAt(true).IsZero() {
		t.Fatal("a connected source is warned about")
	}
}

// TestStuckConnectingWarnsOnce: an endpoint whose host does not resolve
// stays connecting; after the wait one WARN names it, and no other
// follows while the subscriber keeps trying.
func TestStuckConnectingWarnsOnce(t *testing.T) {
	seed := "0"
	prof := mustResolve(t, hashing.StrategyVLLMV1, hashing.AlgorithmSHA256CBOR, "low64_be", &seed)
	logs := &eventtest.LogBuffer{}
	const ep = "tcp://no-such-host.invalid:5557"
	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "stuck|default|0", Type: sourcetype.VLLM, Endpoint: ep},
		Index:     IndexConfig{Context: eventtest.ContextOf(eventtest.Registration{Modelname: "test-model", BlockSize: 16}), Profile: prof, Engine: &eventtest.Recorder{}, Owner: eventtest.Owner},
		Session:   SessionConfig{WatchConnection: true},
		Tuning:    Tuning{ConnectWarnAfter: 100 * time.Millisecond},
		Report:    ReportConfig{Logger: zerolog.New(logs)},
		Resources: NewResources(ResourcesOptions{Counters: NewCounters()}),
	})
	stuck := func() []map[string]any {
		var out []map[string]any
		for _, l := range logs.Lines(t) {
			if l["level"] == "warn" && strings.HasPrefix(fmt.Sprint(l["message"]), "still not connected") {
				out = append(out, l)
			}
		}
		return out
	}
	eventtest.WaitFor(t, "the stuck-connecting warning", 10*time.Second, func() bool { return len(stuck()) > 0 })
	if st := s.State(); st != Connecting {
		t.Errorf("state %v, want connecting", st)
	}
	// the loop goes on waking (monitor events, the poll interval)
	// meanwhile; whatever it did, the warning is not repeated
	s.Stop()
	got := stuck()
	if len(got) != 1 || got[0]["endpoint"] != ep || got[0]["service"] != "stuck|default|0" {
		t.Errorf("warnings %v\n%s", got, logs)
	}
}
