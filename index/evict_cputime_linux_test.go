package index

import (
	"runtime"
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// BenchmarkStoreBudgetCPUTime is BenchmarkStoreCPUTime's cases on a
// bounded index whose budget is never reached, so the figures differ from
// those by the recency stamp per stored block (the accounting is paid by
// both): the cost the budget adds to ingestion.
func BenchmarkStoreBudgetCPUTime(b *testing.B) {
	for _, tc := range []struct {
		name string
		prep func(tb *Table, id OwnerID, n int) // untimed
		op   func(tb *Table, id OwnerID, i int)
	}{
		{"new", nil, func(tb *Table, id OwnerID, i int) { tb.Store(id, Device, benchKey(i)) }},
		{"existing", func(tb *Table, id OwnerID, n int) {
			for i := range n {
				tb.Store(id, Device, benchKey(i))
			}
		}, func(tb *Table, id OwnerID, i int) { tb.Store(id, Device, benchKey(i)) }},
		{"churn", func(tb *Table, id OwnerID, n int) {
			for i := range n {
				tb.Store(id, Device, benchKey(i))
			}
		}, func(tb *Table, id OwnerID, i int) {
			tb.Store(id, Device, benchKey(1<<30+i))
			tb.Remove(id, Device, benchKey(i))
		}},
		{"shared-new", nil, func(tb *Table, _ OwnerID, i int) { tb.AcquireShared(CPUShare, benchKey(i)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ix := New(Options{MemoryLimit: 1 << 40})
			defer ix.Close()
			tb := ix.EnsureTable(testCtx, hashing.Profile{})
			id := tb.AddEngineOwner("a", 0)
			if tc.prep != nil {
				tc.prep(tb, id, b.N)
			}
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			b.ResetTimer()
			t0 := threadCPU()
			for i := range b.N {
				tc.op(tb, id, i)
			}
			b.ReportMetric(float64((threadCPU()-t0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
