package metrics

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/buildinfo"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/membudget"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// readmeMetrics returns the metric names the metrics paragraph of
// docs/operations.md lists, with the conductor_ prefix it states once.
func readmeMetrics(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "Metrics (all prefixed `conductor_`):")
	if start < 0 {
		t.Fatal("docs/operations.md has no metrics paragraph")
	}
	end := strings.Index(doc[start:], "plus Go runtime")
	if end < 0 {
		t.Fatal("docs/operations.md's metrics paragraph has no end")
	}
	// The paragraph also puts label names and values in backticks.
	notMetrics := map[string]bool{"conductor_": true, "hit": true, "miss": true, "source_type": true, "reason": true, "match": true, "mismatch": true, "skipped": true}
	var names []string
	for _, m := range regexp.MustCompile("`([a-z_]+)(\\{[^`]*\\})?`").FindAllStringSubmatch(doc[start:start+end], -1) {
		if !notMetrics[m[1]] {
			names = append(names, "conductor_"+m[1])
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// TestFamiliesMatchREADME gathers the real registry, with every source of
// state present so that every family is collected, and compares the
// conductor_ family names with docs/operations.md's list. (That every counter
// family the subscriber keeps is among IngestFamilies is the app's
// wiring, checked beside it: TestIngestFamiliesExported.)
func TestFamiliesMatchREADME(t *testing.T) {
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	reg := registry.New(registry.Options{Contexts: cat})
	seed := "0"
	svc, err := registry.NewService(registry.Registration{
		Endpoint: "tcp://127.0.0.1:5557", Type: "vLLM", ModelName: "m", InstanceID: "i", BlockSize: 16,
		HashProfile: hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Register(svc); err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	checks := hashcheck.NewSet(hashcheck.Options{})
	checks.Add(string(svc.Key()), &svc.Profile, svc.BlockSize, "")
	m := New(Options{
		Index: ix, Registry: reg, Ingest: zeroIngest, SourceStates: []string{"connecting", "live"},
		Memo: hashing.NewMemo(1 << 20), Links: hashing.NewLinks(1 << 20), TokenMemo: tokenmemo.New(1 << 20),
		Build: &buildinfo.Info{Version: "v", Commit: "c", GoVersion: "go", LibZMQ: "4"}, HashChecks: checks,
		// The service adds the memory budget's families (app.go).
		Extra: []prometheus.Collector{membudget.NewCollector(membudget.Split(0, 0, "", nil), map[membudget.Part]func() int64{membudget.Total: func() int64 { return 1 }})},
	})
	m.ObserveRequest("/query", 200, 0)
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "conductor_") {
			got = append(got, f.GetName())
		}
	}
	// The per-service outcome families are exported only for a source
	// that runs, which this registry without subscribers has not; the
	// end-to-end tests see them (TestEndToEndArrayEncodedVLLM).
	got = append(got, "conductor_service_events_ignored_total", "conductor_service_events_rejected_total")
	slices.Sort(got)
	got = slices.Compact(got)
	if diff := cmp.Diff(readmeMetrics(t), got); diff != "" {
		t.Errorf("metric families (-docs/operations.md +registered):\n%s", diff)
	}
}

// zeroIngest reports one zero series of every ingestion family, as the
// subscribers' counters do before any message.
func zeroIngest(yield func(family, sourceType, reason string, value uint64)) {
	for _, f := range IngestFamilies() {
		yield(f, "vLLM", "", 0)
	}
}
