package hashcheck

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Shaped like the ingest benchmarks' batches (subscriber's
// BenchmarkDecodeVLLMBatch and BenchmarkIngestVLLM): vLLM BlockStored
// events of 16 blocks of 16 tokens, each starting a chain, CBOR hashing.
const (
	benchBlocks    = 16
	benchBlockSize = 16
	benchEvents    = 64 // distinct events, cycled
)

// benchEvents builds events whose published keys are the real ones, so
// every check matches, as on a correctly registered service.
func makeBenchEvents(b *testing.B, p *hashing.Profile) []Event {
	evs := make([]Event, benchEvents)
	for e := range evs {
		toks := make([]int32, benchBlocks*benchBlockSize)
		for i := range toks {
			toks[i] = int32(1000 + e*7919 + i*97)
		}
		c := hashing.AcquireChain()
		c.Reset(p, benchBlockSize, toks, "", "")
		ev := Event{Parent: Root(), Tokens: toks, BlockSize: benchBlockSize}
		for {
			k, _, ok := c.Next()
			if !ok {
				break
			}
			ev.Keys = append(ev.Keys, k)
			ev.Extras = append(ev.Extras, Extras{Known: true})
		}
		hashing.ReleaseChain(c)
		if len(ev.Keys) != benchBlocks {
			b.Fatalf("%d blocks", len(ev.Keys))
		}
		evs[e] = ev
	}
	return evs
}

// BenchmarkSampledCheck is the per-block cost the hash check adds to
// ingest, after the warm-up: Sample on every event, and for the sampled
// ones the token ids a decoder would decode for the granted blocks plus
// their SHA-256 and compare. "every-block" is the unsampled cost, for
// scale. Compare ns/block with BenchmarkDecodeVLLMBatch's ns/op ÷ 16 and
// with 1/(BenchmarkIngestVLLM's blocks/cpu-s).
func BenchmarkSampledCheck(b *testing.B) {
	seed := "0"
	p, err := hashing.Resolve(hashing.Spec{Strategy: hashing.StrategyVLLMV1, Algorithm: hashing.AlgorithmSHA256CBOR,
		IndexProjection: hashing.ProjectionLow64BE, PythonHashSeed: &seed})
	if err != nil {
		b.Fatal(err)
	}
	evs := makeBenchEvents(b, &p)
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"sampled", Options{}},
		{"every-block", Options{Every: 1, MaxPerEvent: benchBlocks}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := NewSet(bc.opts).Add("bench", &p, benchBlockSize, "")
			for i := 0; c.checked < c.opts.Warmup; i++ { // finish the warm-up first
				ev := &evs[i%benchEvents]
				c.CheckEvent(ev, c.Sample(len(ev.Keys)))
			}
			m0, _ := c.Counts()
			decoded := make([]int32, 0, benchBlocks*benchBlockSize)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				ev := &evs[i%benchEvents]
				if n := c.Sample(len(ev.Keys)); n > 0 {
					// What a decoder adds for a sampled event: the
					// granted blocks' token ids, decoded.
					decoded = append(decoded[:0], ev.Tokens[:n*benchBlockSize]...)
					e := *ev
					e.Tokens = decoded
					c.CheckEvent(&e, n)
				}
			}
			b.StopTimer()
			m, mm := c.Counts()
			if mm != 0 {
				b.Fatalf("%d mismatches", mm)
			}
			blocks := float64(b.N) * benchBlocks
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/block")
			b.ReportMetric(float64(m-m0)/blocks, "checked/block")
		})
	}
}
