package index

import (
	"os"
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
