package snapshot

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
)

// benchIndex fills one context with pairs (block, owner) entries over 16
// engine owners: with shared set, half the blocks are held by two owners
// (a common prefix), otherwise every block has one.
func benchIndex(b *testing.B, pairs int, shared bool) (*index.Index, *index.Table) {
	b.Helper()
	ix := index.New(index.Options{})
	t := ix.EnsureTable(ctxA)
	ids := make([]index.OwnerID, 16)
	for i := range ids {
		ids[i] = t.AddEngineOwner(fmt.Sprint("engine-", i/2), i%2)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 0; n < pairs; {
		k := rng.Uint64()
		o := rng.IntN(len(ids))
		t.Store(ids[o], index.Put{Key: k, Tier: index.Device})
		n++
		if shared && n < pairs && n%3 == 0 {
			t.Store(ids[(o+1)%len(ids)], index.Put{Key: k, Tier: index.CPULocal})
			n++
		}
	}
	return ix, t
}

// snapshotOf cuts ix into a Snapshot as the service would.
func snapshotOf(ix *index.Index) *Snapshot {
	s := &Snapshot{Created: time.Now(), Sources: []StreamPosition{{Key: "x", Type: "vLLM", Seq: 1, HasSeq: true}}}
	for _, tc := range ix.BeginCut().Finish() {
		s.Contexts = append(s.Contexts, TableSection{Context: tc.Context, Owners: tc.Owners, Entries: tc.Entries, Blocks: tc.Blocks, Pairs: tc.Pairs})
	}
	return s
}

// BenchmarkWrite2M is the snapshot write at 2 M (block, owner) entries: the
// cut, encoding and a durable write (temporary file, fsync, rename, fsync
// of the directory) into a real directory.
func BenchmarkWrite2M(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			ix, _ := benchIndex(b, 2_000_000, shared)
			d, err := statedir.Open(b.TempDir(), statedir.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			var size int64
			var pairs int
			b.ResetTimer()
			for range b.N {
				s := snapshotOf(ix)
				pairs = s.Contexts[0].Pairs
				size, err = d.WriteAtomic(FileName, func(w io.Writer) error { return Write(w, s) })
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size)/float64(pairs), "bytes/pair")
			b.ReportMetric(float64(size)/(1<<20), "MiB")
		})
	}
}

// BenchmarkLoad2M reads, validates and restores a 2 M-entry snapshot into
// a fresh index.
func BenchmarkLoad2M(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			ix, _ := benchIndex(b, 2_000_000, shared)
			d, err := statedir.Open(b.TempDir(), statedir.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			s := snapshotOf(ix)
			if _, err := d.WriteAtomic(FileName, func(w io.Writer) error { return Write(w, s) }); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				data, err := os.ReadFile(d.File(FileName))
				if err != nil {
					b.Fatal(err)
				}
				got, err := Read(data)
				if err != nil {
					b.Fatal(err)
				}
				ix2 := index.New(index.Options{})
				c := got.Contexts[0]
				t2 := ix2.EnsureTable(c.Context)
				owners := make([]index.OwnerID, len(c.Owners))
				for i, o := range c.Owners {
					owners[i] = t2.AddEngineOwner(o.Instance, o.Rank)
				}
				if err := t2.Restore(c.Entries, owners); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// keysChain feeds a query a fixed run of keys.
type keysChain struct {
	keys []uint64
	i    int
}

func (c *keysChain) Next() (uint64, int, bool) {
	if c.i == len(c.keys) {
		return 0, 0, false
	}
	c.i++
	return c.keys[c.i-1], 16, true
}

// BenchmarkServingDuringSnapshot measures, at 2 M (block, owner) entries,
// query and ingest latencies while snapshots are cut and written back to
// back, against the same load without them: the figures behind "no query
// waits more than 5 ms, ingest pauses a few ms at most". One goroutine
// queries 8-block chains, another stores new blocks, a third snapshots.
func BenchmarkServingDuringSnapshot(b *testing.B) {
	for _, snapshots := range []bool{false, true} {
		b.Run(fmt.Sprintf("snapshots=%v", snapshots), func(b *testing.B) {
			ix := index.New(index.Options{})
			t := ix.EnsureTable(ctxA)
			id := t.AddEngineOwner("engine", 0)
			rng := rand.New(rand.NewPCG(9, 10))
			keys := make([]uint64, 2_000_000)
			for i := range keys {
				keys[i] = rng.Uint64()
			}
			for _, k := range keys {
				t.Store(id, index.Put{Key: k, Tier: index.Device})
			}
			d, err := statedir.Open(b.TempDir(), statedir.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var writeWorst time.Duration
			snaps := 0
			wg.Add(2)
			go func() { // ingest
				defer wg.Done()
				for k := uint64(1); ; k++ {
					select {
					case <-stop:
						return
					default:
					}
					t0 := time.Now()
					t.Store(id, index.Put{Key: k * 0x9e3779b97f4a7c15, Tier: index.Device})
					writeWorst = max(writeWorst, time.Since(t0))
					time.Sleep(20 * time.Microsecond)
				}
			}()
			go func() { // snapshots
				defer wg.Done()
				for snapshots {
					select {
					case <-stop:
						return
					default:
					}
					s := snapshotOf(ix)
					if _, err := d.WriteAtomic(FileName, func(w io.Writer) error { return Write(w, s) }); err != nil {
						b.Error(err)
						return
					}
					snaps++
				}
			}()
			lat := make([]time.Duration, 0, b.N)
			var res index.QueryResult
			b.ResetTimer()
			for i := range b.N {
				at := (i * 7919) % (len(keys) - 8)
				t0 := time.Now()
				t.Query(&keysChain{keys: keys[at : at+8]}, "", &res)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "µs-p50")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "µs-p99")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "µs-max")
			b.ReportMetric(float64(writeWorst.Microseconds()), "µs-store-max")
			b.ReportMetric(float64(snaps), "snapshots")
		})
	}
}
