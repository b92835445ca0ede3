package metrics

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/registry"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

// scrape gathers the real Prometheus registry and returns every series as
// family -> label set (name=value, sorted by name) -> value.
func scrape(t *testing.T, m *Metrics) map[string]map[string]float64 {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range fams {
		series := map[string]float64{}
		for _, mt := range f.GetMetric() {
			key := ""
			for _, l := range mt.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + ","
			}
			switch {
			case mt.Counter != nil:
				series[key] = mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				series[key] = mt.GetGauge().GetValue()
			default:
				series[key] = 0
			}
		}
		out[f.GetName()] = series
	}
	return out
}

// TestLabelledSeriesExportedAtZero: before any event, every ingest counter
// family exports each reason it counts by, for every source type, at zero,
// and the services gauge every type, so rate() and alerts work from
// start-up. The expectations are written out, not derived from the code
// under test.
func TestLabelledSeriesExportedAtZero(t *testing.T) {
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat, Logger: zerolog.Nop()})
	m := New(Options{Index: ix, Registry: reg, Counters: subscriber.NewCounters()})
	got := scrape(t, m)
	want := map[string][]string{
		"conductor_messages_received_total":  {""},
		"conductor_events_applied_total":     {""},
		"conductor_sequence_gaps_total":      {""},
		"conductor_messages_dropped_total":   {"frame_count", "sequence_length", "sequence_reserved", "receive_error", "stale", "duplicate", "oversize"},
		"conductor_envelopes_rejected_total": {"empty_payload", "invalid_msgpack", "trailing_bytes", "not_array", "length", "timestamp", "events_not_array", "too_many_events", "dp_rank"},
		"conductor_batches_rejected_total":   {"dp_rank_mismatch"},
		"conductor_events_ignored_total":     {"medium", "uncached_group", "unknown_kind", "no_binding"},
		"conductor_events_rejected_total": {"not_map", "non_string_key", "duplicate_key",
			"missing_key", "wrong_type", "unknown_tag", "foreign_key", "hash", "block_size", "lora", "group",
			"attention_kind", "extra_keys", "token_range", "timestamp", "type_conflict", "dp_rank", "backend",
			"context", "object_key", "seq_hashes", "binding_conflict", "assertion", "layout_conflict"},
		"conductor_stale_transitions_total": {"gap", "regression", "replay_unrecoverable", "replay_deadline", "buffer_overflow", "batch_rejected", "internal_error"},
		"conductor_replays_total":           {"recovered", "retried", "unrecoverable", "deadline", "stopped"},
	}
	for fam, reasons := range want {
		series, ok := got[fam]
		if !ok {
			t.Errorf("%s not exported", fam)
			continue
		}
		for _, typ := range []string{"vLLM", "SGLang", "Mooncake"} {
			for _, r := range reasons {
				key := "reason=" + r + ",source_type=" + typ + ","
				if v, ok := series[key]; !ok || v != 0 {
					t.Errorf("%s{%s} = %v, present %v; want 0", fam, key, v, ok)
				}
			}
		}
		if n := 3 * len(reasons); len(series) != n {
			t.Errorf("%s exports %d series, want %d", fam, len(series), n)
		}
	}
	kinds := got["conductor_events_group_kind_total"]
	for _, k := range []string{"full_attention", "sliding_window", "chunked_local_attention", "mamba", "uncached", "other"} {
		if v, ok := kinds["kind="+k+","]; !ok || v != 0 {
			t.Errorf("conductor_events_group_kind_total{kind=%s} = %v, present %v; want 0", k, v, ok)
		}
	}
	if len(kinds) != 6 {
		t.Errorf("conductor_events_group_kind_total exports %v", kinds)
	}
	for _, typ := range []string{"vLLM", "SGLang", "Mooncake"} {
		if v, ok := got["conductor_services"]["type="+typ+","]; !ok || v != 0 {
			t.Errorf("conductor_services{type=%s} = %v, present %v; want 0", typ, v, ok)
		}
	}
}

// TestIndexMemorySeries: the budget's gauges and the eviction counter by
// kind are exported from start-up, at zero evictions, and follow the index.
func TestIndexMemorySeries(t *testing.T) {
	ix := index.New(index.Options{MemoryLimit: 64 << 20})
	defer ix.Close()
	m := New(Options{Index: ix})
	got := scrape(t, m)
	if v := got["conductor_index_memory_limit_bytes"][""]; v != 64<<20 {
		t.Errorf("conductor_index_memory_limit_bytes = %v, want %d", v, 64<<20)
	}
	for _, kind := range []string{"context", "scope"} {
		if v, ok := got["conductor_index_evictions_total"]["kind="+kind+","]; !ok || v != 0 {
			t.Errorf("conductor_index_evictions_total{kind=%s} = %v, present %v; want 0", kind, v, ok)
		}
	}
	before := got["conductor_index_memory_bytes"][""]
	tb := ix.EnsureTable(index.ContextKey{Model: "m", BlockSize: 16})
	id := tb.AddEngineOwner("a", 0)
	for k := range uint64(10000) {
		tb.Store(id, index.Put{Key: k + 1, Tier: index.Device})
	}
	if after := scrape(t, m)["conductor_index_memory_bytes"][""]; after <= before {
		t.Errorf("conductor_index_memory_bytes %v after 10,000 blocks, %v before", after, before)
	}
}
