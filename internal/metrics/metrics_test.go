package metrics

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/registry"
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

// TestLabelledSeriesExportedAtZero: before any event, the group-kind
// counter exports each kind and the services gauge every type, at zero,
// so rate() and alerts work from start-up. The expectations are written
// out, not derived from the code under test. (The ingestion counters'
// zero series come from the subscriber's counters, wired by the app:
// TestIngestSeriesExportedAtZero beside it.)
func TestLabelledSeriesExportedAtZero(t *testing.T) {
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat, Logger: zerolog.Nop()})
	m := New(Options{Index: ix, Registry: reg})
	got := scrape(t, m)
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
