package hashing

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLinksRecord is ingest's filing of verified blocks alone: 450 K
// blocks (about cold-8k's corpus) in events of 16, under the default
// 128 MiB budget, from empty links each iteration. It reports CPU per
// block filed, the tables' growth included.
func BenchmarkLinksRecord(b *testing.B) {
	p := testProfile(b, AlgorithmSHA256CBOR)
	const n, run = 450_000, 16
	rng := rand.New(rand.NewPCG(7, 8))
	ids := make([]LinkID, n)
	keys := make([]uint64, n)
	digs := make([][32]byte, n)
	for i := range ids {
		ids[i] = LinkID{Lo: rng.Uint64(), Hi: rng.Uint64()}
		keys[i] = rng.Uint64()
		digs[i][24] = byte(i)
	}
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		l := NewLinks(128 << 20)
		sc := l.Scope(p)
		var w LinkWriter
		b.StartTimer()
		c0 := processCPU()
		for i := 0; i < n; i += run {
			parent := LinkID{}
			if i > 0 {
				parent = ids[i-1]
			}
			sc.Record(&LinkRun{Parent: parent, IDs: ids[i : i+run], Keys: keys[i : i+run], Digs: digs[i : i+run]}, &w)
		}
		cpu += processCPU() - c0
		if l.Len() != n {
			b.Fatalf("%d links of %d", l.Len(), n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/block")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/block")
}

// processCPU is the process's user and system CPU time so far: on a shared
// machine the wall clock also counts time other processes took.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
