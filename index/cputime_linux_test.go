package index

import (
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/hashing"
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

// TestWalkCPUTime reports the walk's CPU time per block (hashing excluded)
// for a fully matched 512-block prompt, best of five rounds. It only
// reports; run it with INDEX_CPU=1 -v.
func TestWalkCPUTime(t *testing.T) {
	if os.Getenv("INDEX_CPU") == "" {
		t.Skip("set INDEX_CPU=1 to measure walk CPU time per block")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const blocks, rounds, queries = 512, 5, 2000
	for _, sh := range [][2]int{{1, 1}, {1, 8}, {8, 1}, {8, 2}, {8, 8}, {64, 1}, {64, 2}, {64, 8}} {
		tb, c := walkTable(nil, sh[0], sh[1], blocks, func(int) int { return blocks })
		var res QueryResult
		best := time.Duration(1<<63 - 1)
		for range rounds {
			t0 := threadCPU()
			for range queries {
				c.reset()
				tb.Query(c, "", &res)
			}
			best = min(best, threadCPU()-t0)
		}
		t.Logf("%2d instances x %d ranks: %6.1f ns/block", sh[0], sh[1], float64(best.Nanoseconds())/queries/blocks)
	}
}

// TestStoreCPUTime reports Store's CPU time per call: inserting 1M new keys
// for one owner, re-asserting them, and a store/remove churn at 1M live.
// Run it with INDEX_CPU=1 -v.
func TestStoreCPUTime(t *testing.T) {
	if os.Getenv("INDEX_CPU") == "" {
		t.Skip("set INDEX_CPU=1 to measure Store CPU time")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const n = 1 << 20
	tb := New(Options{}).EnsureTable(testCtx, hashing.Profile{})
	id := tb.AddEngineOwner("a", 0)
	measure := func(name string, f func(i int)) {
		t0 := threadCPU()
		for i := range n {
			f(i)
		}
		t.Logf("%-28s %6.1f ns/op", name, float64((threadCPU()-t0).Nanoseconds())/n)
	}
	measure("Store new key (to 1M)", func(i int) { tb.Store(id, Device, benchKey(i)) })
	measure("Store existing key", func(i int) { tb.Store(id, Device, benchKey(i)) })
	measure("Store+Remove churn at 1M", func(i int) {
		tb.Store(id, Device, benchKey(n+i))
		tb.Remove(id, Device, benchKey(i))
	})
	measure("AcquireShared new key", func(i int) { tb.AcquireShared(CPUShare, benchKey(3*n+i)) })
}
