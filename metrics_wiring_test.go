package main

import (
	"strings"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/metrics"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

// The metrics know nothing of the subscriber (docs/architecture.md): the
// app hands the subscribers' counters and states over in the metrics'
// terms (ingestSeries, sourceStates). These tests check that wiring with
// the real counters.

// TestIngestFamiliesExported: every counter family the subscriber keeps
// has an exported name (one missing would silently not be exported).
func TestIngestFamiliesExported(t *testing.T) {
	exported := map[string]bool{}
	for _, f := range metrics.IngestFamilies() {
		exported[f] = true
	}
	n := 0
	for m := subscriber.Metric(0); !strings.HasPrefix(m.String(), "Metric("); m++ {
		if !exported[m.String()] {
			t.Errorf("subscriber counter family %q is not exported", m.String())
		}
		n++
	}
	if n < 10 {
		t.Fatalf("walked %d counter families; the loop looks in the wrong place", n)
	}
}

// TestIngestSeriesExportedAtZero: before any event, every ingest counter
// family exports each reason it counts by, for every source type, at zero,
// so rate() and alerts work from start-up; and the states a service's
// gauge exports are every state, in order. The expectations are written
// out, not derived from the code under test.
func TestIngestSeriesExportedAtZero(t *testing.T) {
	m := metrics.New(metrics.Options{Ingest: ingestSeries(subscriber.NewCounters()), SourceStates: sourceStates()})
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{}
	for _, f := range fams {
		series := map[string]float64{}
		for _, mt := range f.GetMetric() {
			key := ""
			for _, l := range mt.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + ","
			}
			series[key] = mt.GetCounter().GetValue()
		}
		got[f.GetName()] = series
	}
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
	if got := strings.Join(sourceStates(), ","); got != "connecting,connected,live,recovering,disconnected,stale,stopped" {
		t.Errorf("source states %s", got)
	}
}
