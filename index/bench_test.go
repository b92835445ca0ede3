package index

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

// benchKey spreads sequential ids like real projected hashes.
func benchKey(i int) uint64 { return uint64(i)*0x9e3779b97f4a7c15 + 1 }

// walkTable registers instances x ranks owners holding the first held(i)
// blocks of an n-block prompt in Device.
func walkTable(_ testing.TB, instances, ranks, n int, held func(owner int) int) (*Table, *keyChain) {
	tb := New(Options{}).EnsureTable(testCtx)
	c := &keyChain{}
	for i := range n {
		c.keys = append(c.keys, benchKey(i))
	}
	o := 0
	for i := range instances {
		for r := range ranks {
			id := tb.AddEngineOwner(fmt.Sprintf("inst-%03d", i), r)
			for k := range held(o) {
				tb.Store(id, Put{Key: c.keys[k], Tier: Device})
			}
			o++
		}
	}
	return tb, c
}

func runWalk(b *testing.B, tb *Table, c *keyChain, blocks int) {
	var res QueryResult
	tb.Query(c, "", &res)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		c.reset()
		tb.Query(c, "", &res)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
}

// BenchmarkWalk measures the per-block cost of a fully matched 8K-token
// prompt (512 blocks of 16) with hashing excluded, by owner count.
func BenchmarkWalk(b *testing.B) {
	const blocks = 512
	for _, sh := range [][2]int{{1, 1}, {1, 8}, {8, 1}, {8, 2}, {8, 8}, {64, 1}, {64, 2}, {64, 8}} {
		b.Run(fmt.Sprintf("inst=%d/ranks=%d", sh[0], sh[1]), func(b *testing.B) {
			tb, c := walkTable(b, sh[0], sh[1], blocks, func(int) int { return blocks })
			runWalk(b, tb, c, blocks)
		})
	}
}

// BenchmarkWalkReady is the stretch goal's walk with hashing excluded: a
// warm 32K-token prompt (2,048 blocks of 16) fully held by 8 instances × 2
// ranks, every key ready (a memo hit), so walkReady does all of it.
func BenchmarkWalkReady(b *testing.B) {
	const blocks = 2048
	tb, c := walkTable(b, 8, 2, blocks, func(int) int { return blocks })
	var res QueryResult
	ch := &readyChain{c, blocks}
	tb.Query(ch, "", &res)
	b.ReportAllocs()
	for b.Loop() {
		c.reset()
		tb.Query(ch, "", &res)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
}

// BenchmarkWalkMixed is 8 instances x 2 ranks with staggered device
// prefixes and the whole prompt in the shared pool, so owners die at
// different blocks and the shared tier carries them to the end.
func BenchmarkWalkMixed(b *testing.B) {
	const blocks = 512
	tb, c := walkTable(b, 8, 2, blocks, func(o int) int { return (o + 1) * blocks / 16 })
	for _, k := range c.keys {
		tb.acquireShared(CPUShare, k)
	}
	runWalk(b, tb, c, blocks)
}

// BenchmarkStore measures inserting new keys for one owner (the hot
// ingestion path), re-asserting existing ones, and parallel inserts.
func BenchmarkStore(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		tb := New(Options{}).EnsureTable(testCtx)
		id := tb.AddEngineOwner("a", 0)
		i := 0
		for b.Loop() {
			tb.Store(id, Put{Key: benchKey(i), Tier: Device})
			i++
		}
	})
	b.Run("existing", func(b *testing.B) {
		tb := New(Options{}).EnsureTable(testCtx)
		id := tb.AddEngineOwner("a", 0)
		for i := range 1 << 16 {
			tb.Store(id, Put{Key: benchKey(i), Tier: Device})
		}
		i := 0
		for b.Loop() {
			tb.Store(id, Put{Key: benchKey(i & (1<<16 - 1)), Tier: Device})
			i++
		}
	})
	for _, owners := range []int{2, 16} {
		// Every block gets all owners in turn, as when replicas or 8
		// instances × 2 ranks cache the same prompt: each Store after the
		// first grows a holder list.
		b.Run(fmt.Sprint(owners, "-owners"), func(b *testing.B) {
			tb := New(Options{}).EnsureTable(testCtx)
			ids := make([]OwnerID, owners)
			for o := range ids {
				ids[o] = tb.AddEngineOwner(fmt.Sprint("inst-", o/2), o%2)
			}
			i := 0
			for b.Loop() {
				tb.Store(ids[i%owners], Put{Key: benchKey(i / owners), Tier: Device})
				i++
			}
		})
	}
	b.Run("store-remove", func(b *testing.B) {
		tb := New(Options{}).EnsureTable(testCtx)
		id := tb.AddEngineOwner("a", 0)
		i := 0
		for b.Loop() {
			tb.Store(id, Put{Key: benchKey(i), Tier: Device})
			tb.Remove(id, Put{Key: benchKey(i - 4096), Tier: Device})
			i++
		}
	})
	b.Run("parallel", func(b *testing.B) {
		tb := New(Options{}).EnsureTable(testCtx)
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			id := tb.AddEngineOwner(fmt.Sprint("p", next.Add(1)), 0)
			i := 0
			for pb.Next() {
				tb.Store(id, Put{Key: benchKey(i), Tier: Device})
				i++
			}
		})
	})
}

func rssBytes() uint64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func settle() (heap, rss uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, rssBytes()
}

// measureMemory fills a table with blocks keys, each held in Device by
// every one of owners engine owners, and returns live heap and RSS growth
// per (block, owner).
func measureMemory(blocks, owners int) (heap, rss float64) {
	h0, r0 := settle()
	tb := New(Options{}).EnsureTable(testCtx)
	for o := range owners {
		id := tb.AddEngineOwner("inst", o)
		for i := range blocks {
			tb.Store(id, Put{Key: benchKey(i), Tier: Device})
		}
	}
	h1, r1 := settle()
	runtime.KeepAlive(tb)
	pairs := float64(blocks * owners)
	return (float64(h1) - float64(h0)) / pairs, (float64(r1) - float64(r0)) / pairs
}

// BenchmarkMemory reports bytes per (block, owner) at 1M blocks; run it
// with -benchtime=1x (each iteration rebuilds the table).
func BenchmarkMemory(b *testing.B) {
	for _, owners := range []int{1, 4} {
		b.Run(fmt.Sprintf("owners=%d", owners), func(b *testing.B) {
			var heap, rss float64
			for range b.N {
				heap, rss = measureMemory(1<<20, owners)
			}
			b.ReportMetric(heap, "heapB/pair")
			b.ReportMetric(rss, "rssB/pair")
		})
	}
}

// TestIndexAllocatedBytesPerPlacement holds the index to its memory target:
// at most maxHeapPerPlacement bytes of live heap per (block, owner) at 1 M
// blocks, with one owner on every block and with four (BenchmarkMemory
// gives the figures, RSS among them). Live heap depends on what is
// allocated, not on timing, but only in a process doing nothing else, so
// the measurement runs in a child process of this test binary. Its name
// puts it in test.sh's allocation phase, without the race detector, whose
// runtime allocates beside the index.
func TestIndexAllocatedBytesPerPlacement(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's runtime allocates beside the index; the allocation phase runs this without it")
	}
	const maxHeapPerPlacement = 48
	if os.Getenv(memoryChildEnv) != "" {
		for _, owners := range []int{1, 4} {
			heap, _ := measureMemory(1<<20, owners)
			fmt.Printf("owners=%d heap=%.2f\n", owners, heap)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIndexAllocatedBytesPerPlacement$", "-test.count", "1")
	cmd.Env = append(os.Environ(), memoryChildEnv+"=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child measurement: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(string(out), "\n") {
		var owners int
		var heap float64
		if n, _ := fmt.Sscanf(line, "owners=%d heap=%f", &owners, &heap); n != 2 {
			continue
		}
		seen++
		if heap > maxHeapPerPlacement {
			t.Errorf("%d owners: %.1f B of live heap per (block, owner), over the %d B target", owners, heap, maxHeapPerPlacement)
		}
	}
	if seen != 2 {
		t.Fatalf("child measured %d configurations, want 2:\n%s", seen, out)
	}
}

// memoryChildEnv marks the child process TestIndexAllocatedBytesPerPlacement
// measures in.
const memoryChildEnv = "CONDUCTOR_INDEX_MEMORY_CHILD"

// BenchmarkQueryUnderIngest runs 8x2-owner queries of a matched 512-block
// prompt in parallel while one goroutine keeps storing and removing other
// keys of the same table, the contention the stripes exist for. ns/block
// is wall time over all parallel queries (throughput, not latency).
func BenchmarkQueryUnderIngest(b *testing.B) {
	const blocks = 512
	tb, c := walkTable(b, 8, 2, blocks, func(int) int { return blocks })
	writer := tb.AddEngineOwner("writer", 0)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tb.Store(writer, Put{Key: benchKey(blocks + i%100000), Tier: Device})
			tb.Remove(writer, Put{Key: benchKey(blocks + (i+50000)%100000), Tier: Device})
		}
	}()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var res QueryResult
		ch := &keyChain{keys: c.keys}
		for pb.Next() {
			ch.reset()
			tb.Query(ch, "", &res)
		}
	})
	b.StopTimer()
	close(stop)
	<-done
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
}

// BenchmarkQueryDuringRemoval removes 15 of 16 owners holding 2 M blocks in
// all (issue 7's unregistration shape) while one goroutine keeps walking a
// 512-block prompt of the 16th, and reports the slowest walk seen until
// every entry is reclaimed, the time per RemoveEngineOwner call, and the
// time until the index is at rest. "sync" clears inside the call;
// "background" is the service's setting (RemovalPause 200 µs).
func BenchmarkQueryDuringRemoval(b *testing.B) {
	const owners, perOwner, blocks = 16, 125_000, 512
	for _, pause := range []time.Duration{0, 200 * time.Microsecond} {
		name := "sync"
		if pause > 0 {
			name = "background"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ix := New(Options{RemovalPause: pause})
				tb := ix.EnsureTable(testCtx)
				ids := make([]OwnerID, owners)
				for o := range ids {
					ids[o] = tb.AddEngineOwner(fmt.Sprintf("inst-%02d", o), 0)
					for i := range perOwner {
						tb.Store(ids[o], Put{Key: benchKey(o*perOwner + i), Tier: Device})
					}
				}
				c := &keyChain{}
				for i := range blocks {
					c.keys = append(c.keys, benchKey((owners-1)*perOwner+i))
				}
				stop := make(chan struct{})
				worst := make(chan time.Duration)
				go func() {
					var res QueryResult
					var w time.Duration
					for {
						select {
						case <-stop:
							worst <- w
							return
						default:
						}
						t0 := time.Now()
						c.reset()
						tb.Query(c, "", &res)
						w = max(w, time.Since(t0))
					}
				}()
				b.StartTimer()
				t0 := time.Now()
				for _, id := range ids[:owners-1] {
					tb.RemoveEngineOwner(id)
				}
				per := time.Since(t0) / (owners - 1)
				ix.Settle()
				rest := time.Since(t0)
				b.StopTimer()
				close(stop)
				ix.Close()
				b.ReportMetric(float64((<-worst).Microseconds()), "worst-query-µs")
				b.ReportMetric(float64(per.Microseconds()), "µs/removal")
				b.ReportMetric(float64(rest.Milliseconds()), "ms-to-rest")
				b.StartTimer()
			}
		})
	}
}

// BenchmarkWalkLargeTable walks 512-block prompts of a 2 M-block table (16
// owners × 125 K blocks, 300 prompts cycled, so lookups miss the caches as
// in the service), one key at a time or as a ReadyChain batch (what a memo
// hit gives): one read lock per stripe and lookups free to overlap.
func BenchmarkWalkLargeTable(b *testing.B) {
	const owners, perOwner, blocks = 16, 125_000, 512
	tb := New(Options{}).EnsureTable(testCtx)
	for o := range owners {
		id := tb.AddEngineOwner(fmt.Sprintf("inst-%02d", o), 0)
		for i := range perOwner {
			tb.Store(id, Put{Key: benchKey(o*perOwner + i), Tier: Device})
		}
	}
	var chains []*keyChain
	var hints [][]uint32
	for q := range 300 {
		c := &keyChain{}
		o := q % owners
		base := (q * 997) % (perOwner - blocks)
		for i := range blocks {
			c.keys = append(c.keys, benchKey(o*perOwner+base+i))
		}
		chains = append(chains, c)
		h := make([]uint32, blocks)
		tb.Locate(c.keys, h)
		hints = append(hints, h)
	}
	for _, mode := range []string{"keys", "ready", "hinted", "hashing", "hashing-alone"} {
		b.Run(mode, func(b *testing.B) {
			var res QueryResult
			i := 0
			for b.Loop() {
				c := chains[i%len(chains)]
				i++
				c.reset()
				var ch Chain = c
				switch mode {
				case "ready":
					ch = &readyChain{c, blocks}
				case "hinted": // what verified links give
					ch = &hintedChain{&readyChain{c, blocks}, hints[(i-1)%len(chains)]}
				case "hashing":
					ch = &hashingChain{keyChain: c}
				case "hashing-alone": // what the walk adds to "hashing"
					hc := &hashingChain{keyChain: c}
					for _, _, ok := hc.Next(); ok; _, _, ok = hc.Next() {
					}
					continue
				}
				tb.Query(ch, "", &res)
			}
		})
	}
}

// hashingChain is a keyChain that runs one SHA-256 compression per key, as
// a cold query hashes each block before it can look it up: the time the
// walk has to overlap its cache misses with. Its keys stay the table's.
type hashingChain struct {
	*keyChain
	buf [64]byte
	sum [32]byte
}

func (c *hashingChain) Next() (uint64, int, bool) {
	c.buf[0]++
	c.sum = sha256.Sum256(c.buf[:55])
	c.buf[1] ^= c.sum[0]
	return c.keyChain.Next()
}

// BenchmarkMachineRandomReads is what this machine charges for the walk's
// unavoidable memory traffic, apart from any of the index's work: the key
// of 512 slab entries at random in a 64 MiB slab (larger than the caches
// a core has to itself), all addresses known up front as a batch's hints
// are, read one after another (independent loads, which the core
// overlaps) or each requested first (as walkReady does). The slab is on
// whatever pages the kernel gives anonymous memory.
func BenchmarkMachineRandomReads(b *testing.B) {
	const slabBytes = 64 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 512
	sets := make([][]int, 1024)
	for i := range sets {
		sets[i] = make([]int, n)
		for j := range sets[i] {
			sets[i][j] = rng.IntN(slabBytes / int(unsafe.Sizeof(block{})))
		}
	}
	var sink uint64
	slab := make([]block, slabBytes/int(unsafe.Sizeof(block{})))
	for i := range slab {
		slab[i].key = uint64(i)
	}
	b.Run("independent", func(b *testing.B) {
		for i := range b.N {
			for _, j := range sets[i%len(sets)] {
				sink += slab[j].key
			}
		}
	})
	b.Run("prefetched", func(b *testing.B) {
		for i := range b.N {
			idx := sets[i%len(sets)]
			for _, j := range idx {
				prefetch(uintptr(unsafe.Pointer(&slab[j])))
			}
			for _, j := range idx {
				sink += slab[j].key
			}
		}
	})
	_ = sink
}
