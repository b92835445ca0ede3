package index

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU is this OS thread's CPU time: unlike a benchmark's wall clock
// it does not count time the thread spent descheduled, which is what makes
// figures from a shared, loaded machine comparable.
func threadCPU() time.Duration {
	const rusageThread = 1
	var ru syscall.Rusage
	_ = syscall.Getrusage(rusageThread, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkWalkCPUTime reports the walk's thread CPU time per block
// (hashing excluded) for a fully matched 512-block prompt, by owner count,
// as the metric cpu-ns/block beside the wall-clock ns/op.
func BenchmarkWalkCPUTime(b *testing.B) {
	const blocks = 512
	for _, sh := range [][2]int{{1, 1}, {1, 8}, {8, 1}, {8, 2}, {8, 8}, {64, 1}, {64, 2}, {64, 8}} {
		b.Run(fmt.Sprintf("inst=%d/ranks=%d", sh[0], sh[1]), func(b *testing.B) {
			tb, c := walkTable(b, sh[0], sh[1], blocks, func(int) int { return blocks })
			var res QueryResult
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			t0 := threadCPU()
			for b.Loop() {
				c.reset()
				tb.Query(c, "", &res)
			}
			b.ReportMetric(float64((threadCPU()-t0).Nanoseconds())/float64(b.N*blocks), "cpu-ns/block")
		})
	}
}

// BenchmarkStoreCPUTime reports Store's thread CPU time per call: inserting
// new keys for one owner, re-asserting existing ones, a store/remove churn,
// and a shared reference to a new key.
func BenchmarkStoreCPUTime(b *testing.B) {
	benchStoreCPUTime(b, func() (*Table, func()) {
		return New(Options{}).EnsureTable(testCtx), func() {}
	})
}

// BenchmarkStoreBudgetCPUTime is BenchmarkStoreCPUTime's cases on a
// bounded index whose budget is never reached, so the figures differ from
// those by the recency stamp per stored block (the accounting is paid by
// both): the cost the budget adds to ingestion.
func BenchmarkStoreBudgetCPUTime(b *testing.B) {
	benchStoreCPUTime(b, func() (*Table, func()) {
		ix := New(Options{MemoryLimit: 1 << 40})
		return ix.EnsureTable(testCtx), ix.Close
	})
}

// benchStoreCPUTime runs the store cases on a fresh table from newTable
// per case; its second result is called when the case ends.
func benchStoreCPUTime(b *testing.B, newTable func() (*Table, func())) {
	for _, tc := range []struct {
		name string
		prep func(tb *Table, id OwnerID, n int) // untimed
		op   func(tb *Table, id OwnerID, i int)
	}{
		{"new", nil, func(tb *Table, id OwnerID, i int) { tb.Store(id, Put{Key: benchKey(i), Tier: Device}) }},
		{"existing", func(tb *Table, id OwnerID, n int) {
			for i := range n {
				tb.Store(id, Put{Key: benchKey(i), Tier: Device})
			}
		}, func(tb *Table, id OwnerID, i int) { tb.Store(id, Put{Key: benchKey(i), Tier: Device}) }},
		{"churn", func(tb *Table, id OwnerID, n int) {
			for i := range n {
				tb.Store(id, Put{Key: benchKey(i), Tier: Device})
			}
		}, func(tb *Table, id OwnerID, i int) {
			tb.Store(id, Put{Key: benchKey(1<<30 + i), Tier: Device})
			tb.Remove(id, Put{Key: benchKey(i), Tier: Device})
		}},
		{"shared-new", nil, func(tb *Table, _ OwnerID, i int) { tb.acquireShared(CPUShare, benchKey(i)) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tb, done := newTable()
			defer done()
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
