package index

import (
	"testing"
)

// BenchmarkEvict measures eviction throughput: a table of 1 M blocks held
// by two owners each, evicted whole by the evictor's stripe sweeps (in
// holds of evictChunk). ns/op is per evicted block.
func BenchmarkEvict(b *testing.B) {
	const n = 1 << 20
	for range b.N {
		b.StopTimer()
		ix := New(Options{MemoryLimit: 1 << 40})
		tb := ix.EnsureTable(testCtx)
		a, c := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0)
		for i := range n {
			tb.Store(a, Put{Key: benchKey(i), Tier: Device})
			tb.Store(c, Put{Key: benchKey(i), Tier: Device})
		}
		limit := ix.bud.epoch.Add(1) - 1
		b.StartTimer()
		evictUpTo(ix, limit)
		b.StopTimer()
		if tb.PrefixCount() != 0 {
			b.Fatalf("%d blocks left", tb.PrefixCount())
		}
		ix.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/block")
}
