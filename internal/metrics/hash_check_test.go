package metrics

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
)

// hashCheckSeries gathers conductor_hash_check_total from the real
// registry as "service/result" -> value.
func hashCheckSeries(t *testing.T, m *Metrics) map[string]float64 {
	return counterSeries(t, m, "conductor_hash_check_total", "result")
}

// hashSkippedSeries gathers conductor_hash_check_skipped_total as
// "service/reason" -> value.
func hashSkippedSeries(t *testing.T, m *Metrics) map[string]float64 {
	return counterSeries(t, m, "conductor_hash_check_skipped_total", "reason")
}

// counterSeries gathers counter family name as "service/<label>" -> value.
func counterSeries(t *testing.T, m *Metrics, name, label string) map[string]float64 {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["service"]+"/"+l[label]] = s.GetCounter().GetValue()
		}
	}
	return out
}

func skippedAtZero(svc string) map[string]float64 {
	out := map[string]float64{}
	for _, r := range hashcheck.SkipReasons() {
		out[svc+"/"+r.String()] = 0
	}
	return out
}

// TestHashCheckSeries: a service's match and mismatch series exist at zero
// once its checker does, count its checks, and go when it is removed.
func TestHashCheckSeries(t *testing.T) {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	set := hashcheck.NewSet(hashcheck.Options{})
	m := New(Options{HashChecks: set})
	if got := hashCheckSeries(t, m); len(got) != 0 {
		t.Fatalf("series before any service: %v", got)
	}
	c := set.Add("p0|default|0", &p, 4, "")
	if diff := cmp.Diff(map[string]float64{"p0|default|0/match": 0, "p0|default|0/mismatch": 0, "p0|default|0/skipped": 0}, hashCheckSeries(t, m)); diff != "" {
		t.Fatalf("at creation (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(skippedAtZero("p0|default|0"), hashSkippedSeries(t, m)); diff != "" {
		t.Fatalf("skip reasons at creation (-want +got):\n%s", diff)
	}
	known := hashcheck.Extras{Known: true}
	c.Check(hashcheck.Root(), []int32{1, 2, 3, 4}, known, hashcheck.Published{Key: 2164874634404590027})
	c.Check(hashcheck.Root(), []int32{1, 2, 3, 4}, known, hashcheck.Published{Key: 7})
	c.Check(hashcheck.Root(), []int32{1, 2, 3, 4}, known, hashcheck.Published{Key: 8})
	c.Check(hashcheck.Root(), []int32{1, 2, 3, 4}, hashcheck.Extras{}, hashcheck.Published{Key: 8})
	c.Check(hashcheck.FromKey(99), []int32{1, 2, 3, 4}, known, hashcheck.Published{Key: 8})
	c.Skip(hashcheck.SkipNoTokenIDs, 3)
	if diff := cmp.Diff(map[string]float64{"p0|default|0/match": 1, "p0|default|0/mismatch": 2, "p0|default|0/skipped": 5}, hashCheckSeries(t, m)); diff != "" {
		t.Fatalf("after checks (-want +got):\n%s", diff)
	}
	wantSkips := skippedAtZero("p0|default|0")
	wantSkips["p0|default|0/no_extra_keys"] = 1
	wantSkips["p0|default|0/parent_not_pinned"] = 1
	wantSkips["p0|default|0/no_token_ids"] = 3
	if diff := cmp.Diff(wantSkips, hashSkippedSeries(t, m)); diff != "" {
		t.Fatalf("skip reasons after checks (-want +got):\n%s", diff)
	}
	set.Remove(c)
	if got := hashCheckSeries(t, m); len(got) != 0 {
		t.Fatalf("series after removal: %v", got)
	}
	if got := hashSkippedSeries(t, m); len(got) != 0 {
		t.Fatalf("skip series after removal: %v", got)
	}
}
