package hashing

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkCold8K is a cold 8K-token query's whole chain (512 blocks of
// 16, no memo, no links: what a prompt nobody asked before costs) under
// each vLLM algorithm, the four run in turn within every iteration so that
// all see the same machine load. It reports, per algorithm, the median,
// fastest and slowest µs per query, and the median ratio of each to
// sha256 (vLLM's default). docs/hashing.md#vllm-algorithms; BENCHMARKS.md
// ("vLLM hash algorithms") has the figures.
func BenchmarkCold8K(b *testing.B) {
	const tokens, bs = 8192, 16
	algs := []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}
	profs := make([]Profile, len(algs))
	for i, a := range algs {
		seed := "0"
		profs[i] = mustResolve(b, "vllm_v1", a, "low64_be", &seed)
	}
	// 32 distinct prompts, cycled, so that no branch predictor learns one.
	r := rand.New(rand.NewPCG(8, 192))
	prompts := make([][]int32, 32)
	for i := range prompts {
		prompts[i] = make([]int32, tokens)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(151936))
		}
	}
	c := AcquireChain()
	defer ReleaseChain(c)
	times := make([][]time.Duration, len(algs))
	q := 0
	b.ReportAllocs()
	for b.Loop() {
		q = (q + 1) % len(prompts)
		for i := range algs {
			// Rotate which algorithm goes first, so none always runs
			// right after another's cache footprint.
			k := (i + q) % len(algs)
			t0 := time.Now()
			c.Reset(&profs[k], bs, prompts[q], "adapter-A", "")
			for {
				key, _, ok := c.Next()
				if !ok {
					break
				}
				sinkKey += key
			}
			times[k] = append(times[k], time.Since(t0))
		}
	}
	med := make([]float64, len(algs))
	for i, a := range algs {
		ts := slices.Clone(times[i])
		slices.Sort(ts)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		med[i] = us(ts[len(ts)/2])
		b.ReportMetric(med[i], a+"-µs/query")
		b.ReportMetric(us(ts[0]), a+"-min-µs")
		b.ReportMetric(us(ts[len(ts)-1]), a+"-max-µs")
	}
	for i := 1; i < len(algs); i++ {
		b.ReportMetric(med[i]/med[0], algs[i]+"/sha256")
	}
}
