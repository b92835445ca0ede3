package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"pgregory.net/rapid"
)

// held is what a cut describes: per owner, the engine tier bits per key.
type held map[Owner]map[uint64]TierMask

// failer is what decodeCut needs of a *testing.T or *rapid.T.
type failer interface {
	Helper()
	Errorf(format string, args ...any)
	Fatal(args ...any)
}

// decodeCut turns a table's cut back into held, checking its counts.
func decodeCut(t failer, tc TableCut) held {
	t.Helper()
	out := held{}
	blocks, pairs, err := WalkEntries(tc.Entries, len(tc.Owners), func(key uint64, hs []EntryHolder) {
		for _, h := range hs {
			o := tc.Owners[h.Owner]
			if out[o] == nil {
				out[o] = map[uint64]TierMask{}
			}
			if _, dup := out[o][key]; dup {
				t.Errorf("owner %v holds %d twice", o, key)
			}
			out[o][key] = h.Tiers
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if blocks != tc.Blocks || pairs != tc.Pairs {
		t.Errorf("walk saw %d blocks, %d pairs; cut says %d, %d", blocks, pairs, tc.Blocks, tc.Pairs)
	}
	return out
}

// modelHeld is the reference's engine entries of registered owners.
func modelHeld(m *refModel) held {
	out := held{}
	for k, id := range m.reg {
		for key, bits := range m.held[id] {
			o := Owner{k.instance, k.rank}
			if out[o] == nil {
				out[o] = map[uint64]TierMask{}
			}
			out[o][key] = TierMask(bits)
		}
	}
	return out
}

func findCut(cuts []TableCut, ctx ContextKey) (TableCut, bool) {
	for _, c := range cuts {
		if c.Context == ctx {
			return c, true
		}
	}
	return TableCut{}, false
}

// Writes after BeginCut do not show in the cut, whichever stripe they touch
// and whether they come before or after Finish reaches it.
func TestCutIsTheStateAtBegin(t *testing.T) {
	for _, stripes := range []int{1, 4, 64} {
		t.Run(fmt.Sprint(stripes), func(t *testing.T) {
			ix := New(Options{Stripes: stripes})
			tb := ix.EnsureTable(testCtx)
			m := newRefModel()
			a, b := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 1)
			m.reg[ownerKey{"a", 0}], m.reg[ownerKey{"b", 1}] = a, b
			for k := uint64(0); k < 2000; k++ {
				tb.Store(a, Put{Key: k, Tier: Device})
				m.store(a, Device, k)
				if k%3 == 0 {
					tb.Store(b, Put{Key: k, Tier: Disk})
					m.store(b, Disk, k)
				}
				if k%5 == 0 {
					tb.acquireShared(CPUShare, k) // shared references are not cut
				}
			}
			want := modelHeld(m)

			c := ix.BeginCut()
			// Every kind of writer, after the cut.
			late := tb.AddEngineOwner("late", 0)
			for k := uint64(0); k < 3000; k += 2 {
				tb.Store(late, Put{Key: k, Tier: CPULocal})
				tb.Store(a, Put{Key: k, Tier: CPULocal})
				tb.Remove(b, Put{Key: k, Tier: Disk})
				tb.releaseShared(CPUShare, k)
			}
			tb.ClearOwner(a, AllEngineTiers)
			tb.RemoveEngineOwner(b)
			cuts := c.Finish()

			got, ok := findCut(cuts, testCtx)
			if !ok {
				t.Fatal("table missing from the cut")
			}
			if diff := cmp.Diff([]Owner{{"a", 0}, {"b", 1}}, got.Owners); diff != "" {
				t.Errorf("owners (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, decodeCut(t, got)); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			if tb.cut.Load() != nil {
				t.Error("table still has a cut after Finish")
			}
			checkInvariants(t, tb)
		})
	}
}

// A table dropped during a cut is still described as it was at the cut; a
// table created after it is absent.
func TestCutAcrossDropAndCreate(t *testing.T) {
	ix := New(Options{Stripes: 4})
	other := ContextKey{Model: "other", BlockSize: 16}
	tb := ix.EnsureTable(testCtx)
	id := tb.AddEngineOwner("a", 0)
	tb.Store(id, Put{Key: 7, Tier: Device})
	c := ix.BeginCut()
	ix.DropTable(testCtx)
	ix.EnsureTable(other)
	cuts := c.Finish()
	if _, ok := findCut(cuts, other); ok {
		t.Error("a table created after the cut is in it")
	}
	got, ok := findCut(cuts, testCtx)
	if !ok {
		t.Fatal("dropped table missing")
	}
	want := held{{"a", 0}: {7: 1 << Device}}
	if diff := cmp.Diff(want, decodeCut(t, got)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// Restore brings a cut back into a fresh table: same answers, owners mapped
// by position, a zero id dropping that owner.
func TestRestoreRoundTrip(t *testing.T) {
	ix := New(Options{Stripes: 8})
	tb := ix.EnsureTable(testCtx)
	m := newRefModel()
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []OwnerID
	for i := range 4 {
		id := tb.AddEngineOwner(fmt.Sprint("i", i%2), i/2)
		m.reg[ownerKey{fmt.Sprint("i", i%2), i / 2}] = id
		ids = append(ids, id)
	}
	for range 5000 {
		id, k := ids[rng.IntN(len(ids))], rng.Uint64N(1500)
		tr := []Tier{Device, CPULocal, Disk}[rng.IntN(3)]
		tb.Store(id, Put{Key: k, Tier: tr})
		m.store(id, tr, k)
	}
	c := ix.BeginCut()
	cut, _ := findCut(c.Finish(), testCtx)
	want := modelHeld(m)

	ix2 := New(Options{Stripes: 4}) // a different layout restores the same
	tb2 := ix2.EnsureTable(testCtx)
	owners := make([]OwnerID, len(cut.Owners))
	for i, o := range cut.Owners {
		if o == (Owner{"i1", 1}) {
			delete(want, o) // resumes cold
			continue
		}
		owners[i] = tb2.AddEngineOwner(o.Instance, o.Rank)
	}
	if err := tb2.Restore(cut.Entries, owners); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tb2)
	c2 := ix2.BeginCut()
	cut2, _ := findCut(c2.Finish(), testCtx)
	if diff := cmp.Diff(want, decodeCut(t, cut2)); diff != "" {
		t.Errorf("restored (-want +got):\n%s", diff)
	}
}

func TestWalkEntriesRejectsMalformed(t *testing.T) {
	ix := New(Options{Stripes: 1})
	tb := ix.EnsureTable(testCtx)
	a, b := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0)
	tb.Store(a, Put{Key: 1, Tier: Device})
	tb.Store(b, Put{Key: 1, Tier: Disk})
	tb.Store(a, Put{Key: 2, Tier: CPULocal})
	cut, _ := findCut(ix.BeginCut().Finish(), testCtx)
	good := cut.Entries
	if _, _, err := WalkEntries(good, 2, nil); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		data   []byte
		owners int
	}{
		"cut in key":      {good[:5], 2},
		"cut in holders":  {good[:9], 2},
		"owner too large": {good, 1},
		"zero holders":    {append(append([]byte(nil), good[:8]...), 0), 2},
		"shared tier bit": {append(append([]byte(nil), good[:8]...), 1, 1<<CPUShare), 2},
		"empty mask":      {append(append([]byte(nil), good[:8]...), 1, 0), 2},
	} {
		if _, _, err := WalkEntries(tc.data, tc.owners, nil); !errors.Is(err, ErrBadEntries) {
			t.Errorf("%s: %v, want ErrBadEntries", name, err)
		}
	}
}

// TestPropertyCutPerSource is the snapshot's consistency property at the
// index level: sources apply numbered batches under a shared gate; a cut
// begun with the gate held records each source's last sequence; whatever
// the interleaving of batches, cuts and queries, each owner's entries in the
// cut equal that source's model after exactly the recorded sequence.
func TestPropertyCutPerSource(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const sources = 3
		ix := New(Options{Stripes: rapid.SampledFrom([]int{1, 2, 8}).Draw(rt, "stripes")})
		tb := ix.EnsureTable(testCtx)
		type src struct {
			id  OwnerID
			seq int
			// states[n] is the model after batch n.
			states []map[uint64]TierMask
		}
		var ss [sources]*src
		for i := range ss {
			ss[i] = &src{id: tb.AddEngineOwner("s", i), states: []map[uint64]TierMask{{}}}
		}
		var cut *Cut
		var seqs [sources]int
		key := rapid.Uint64Range(0, 40)
		tier := rapid.SampledFrom([]Tier{Device, CPULocal, Disk})
		rt.Repeat(map[string]func(*rapid.T){
			"batch": func(rt *rapid.T) {
				s := ss[rapid.IntRange(0, sources-1).Draw(rt, "source")]
				next := map[uint64]TierMask{}
				for k, v := range s.states[s.seq] {
					next[k] = v
				}
				for range rapid.IntRange(1, 8).Draw(rt, "events") {
					k, tr := key.Draw(rt, "key"), tier.Draw(rt, "tier")
					switch rapid.IntRange(0, 3).Draw(rt, "op") {
					case 0, 1:
						tb.Store(s.id, Put{Key: k, Tier: tr})
						next[k] |= 1 << tr
					case 2:
						tb.Remove(s.id, Put{Key: k, Tier: tr})
						if next[k] &^= 1 << tr; next[k] == 0 {
							delete(next, k)
						}
					case 3:
						tb.ClearOwner(s.id, AllEngineTiers)
						clear(next)
					}
				}
				s.seq++
				s.states = append(s.states, next)
			},
			"begin": func(rt *rapid.T) {
				if cut != nil {
					rt.Skip("a cut is in progress")
				}
				cut = ix.BeginCut()
				for i, s := range ss {
					seqs[i] = s.seq
				}
			},
			"finish": func(rt *rapid.T) {
				if cut == nil {
					rt.Skip("no cut in progress")
				}
				tc, _ := findCut(cut.Finish(), testCtx)
				cut = nil
				got := decodeCut(rt, tc)
				for i, s := range ss {
					want := s.states[seqs[i]]
					g := got[Owner{"s", i}]
					if diff := cmp.Diff(want, g, cmpopts.EquateEmpty()); diff != "" {
						rt.Fatalf("source %d at seq %d (-want +got):\n%s", i, seqs[i], diff)
					}
				}
			},
		})
		if cut != nil {
			cut.Finish()
		}
	})
}

// TestCutConcurrent runs the same property with real goroutines: sources
// write under a gate's read lock while queries run, and cuts are taken with
// the gate's write lock held only for BeginCut. Run with -race.
func TestCutConcurrent(t *testing.T) {
	const (
		sources = 4
		batches = 400
		keys    = 3000
	)
	ix := New(Options{Stripes: 16})
	tb := ix.EnsureTable(testCtx)
	var gate sync.RWMutex
	ids := make([]OwnerID, sources)
	seq := make([]int, sources) // under gate
	for i := range ids {
		ids[i] = tb.AddEngineOwner("s", i)
	}
	// Batch n of source i stores keys [n*7, n*7+50) and removes those of
	// batch n-3, so the state after n is a function of n alone.
	apply := func(i, n int) {
		for k := n * 7; k < n*7+50; k++ {
			tb.Store(ids[i], Put{Key: uint64(k % keys), Tier: Device})
		}
		if n >= 3 {
			for k := (n - 3) * 7; k < (n-3)*7+50; k++ {
				tb.Remove(ids[i], Put{Key: uint64(k % keys), Tier: Device})
			}
		}
	}
	model := func(n int) map[uint64]TierMask {
		out := map[uint64]TierMask{}
		for m := 1; m <= n; m++ {
			for k := m * 7; k < m*7+50; k++ {
				out[uint64(k%keys)] = 1 << Device
			}
			if m >= 3 {
				for k := (m - 3) * 7; k < (m-3)*7+50; k++ {
					delete(out, uint64(k%keys))
				}
			}
		}
		return out
	}
	var wg sync.WaitGroup
	for i := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 1; n <= batches; n++ {
				gate.RLock()
				apply(i, n)
				seq[i] = n
				gate.RUnlock()
			}
		}()
	}
	stopQ := make(chan struct{})
	var qwg sync.WaitGroup
	qwg.Add(1)
	go func() {
		defer qwg.Done()
		var res QueryResult
		for {
			select {
			case <-stopQ:
				return
			default:
			}
			tb.Query(chainOf(1, 2, 3, 4, 5), "", &res)
		}
	}()
	cuts := 0
	for done := false; !done; cuts++ {
		gate.Lock()
		c := ix.BeginCut()
		at := append([]int(nil), seq...)
		done = at[0] == batches && at[1] == batches && at[2] == batches && at[3] == batches
		gate.Unlock()
		tc, _ := findCut(c.Finish(), testCtx)
		got := decodeCut(t, tc)
		for i := range sources {
			if diff := cmp.Diff(model(at[i]), got[Owner{"s", i}], cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("cut %d, source %d at seq %d (-want +got):\n%s", cuts, i, at[i], diff)
			}
		}
	}
	wg.Wait()
	close(stopQ)
	qwg.Wait()
	checkInvariants(t, tb)
	t.Logf("%d cuts", cuts)
}

// BenchmarkCutPauses measures, at 2 M (block, owner) entries in one context
// (64 stripes), what a snapshot costs the others: BeginCut is the instant
// sources are held still; a writer that touches a stripe first copies it
// (the longest it holds that stripe's write lock for the cut); Finish
// encodes each untouched stripe under its read lock (queries share it, a
// writer to that stripe waits for it).
func BenchmarkCutPauses(b *testing.B) {
	ix := New(Options{})
	tb := ix.EnsureTable(testCtx)
	ids := make([]OwnerID, 16)
	for i := range ids {
		ids[i] = tb.AddEngineOwner(fmt.Sprint("e", i/2), i%2)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2_000_000 {
		tb.Store(ids[rng.IntN(len(ids))], Put{Key: rng.Uint64(), Tier: Device})
	}
	var begin, worstCopy, totalCopy, finish time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		c := ix.BeginCut()
		begin += time.Since(t0)
		for i := range tb.stripes {
			s := &tb.stripes[i]
			s.mu.Lock()
			t1 := time.Now()
			tb.cow(s) // as the first writer after the cut would
			d := time.Since(t1)
			s.mu.Unlock()
			worstCopy, totalCopy = max(worstCopy, d), totalCopy+d
		}
		c.Finish()
		t2 := time.Now()
		ix.BeginCut().Finish() // every stripe encoded in place
		finish += time.Since(t2)
	}
	n := float64(b.N * len(tb.stripes))
	b.ReportMetric(float64(begin.Nanoseconds())/float64(b.N), "ns-begin/op")
	b.ReportMetric(float64(worstCopy.Microseconds()), "µs-worst-copy")
	b.ReportMetric(float64(totalCopy.Microseconds())/n, "µs-mean-copy")
	b.ReportMetric(float64(finish.Microseconds())/n, "µs-mean-encode-in-place")
}

// storeBatch leaves the table exactly as Store per tier would, including
// into stripes that already hold entries and free slab slots.
func TestStoreBatchEqualsStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	a, b := New(Options{Stripes: 8}), New(Options{Stripes: 8})
	ta, tb := a.EnsureTable(testCtx), b.EnsureTable(testCtx)
	m := newRefModel()
	var ida, idb [3]OwnerID
	for i := range ida {
		ida[i], idb[i] = ta.AddEngineOwner("e", i), tb.AddEngineOwner("e", i)
		m.reg[ownerKey{"e", i}] = ida[i]
	}
	for round := range 4 {
		for o := range ida {
			var keys []uint64
			var tiers []TierMask
			for range 3000 {
				k, tm := rng.Uint64N(5000), TierMask(rng.IntN(16))
				keys, tiers = append(keys, k), append(tiers, tm)
				for _, tr := range []Tier{Device, CPULocal, CPUShare, Disk} {
					if tm&(1<<tr) != 0 {
						ta.Store(ida[o], Put{Key: k, Tier: tr})
						m.store(ida[o], tr, k)
					}
				}
			}
			tb.storeBatch(idb[o], keys, tiers, nil)
		}
		// Removals leave free slab slots for the next round to reuse.
		for range 2000 * (round + 1) {
			o, k := rng.IntN(len(ida)), rng.Uint64N(5000)
			ta.Remove(ida[o], Put{Key: k, Tier: Device})
			tb.Remove(idb[o], Put{Key: k, Tier: Device})
			m.remove(ida[o], Device, k)
		}
	}
	checkInvariants(t, ta)
	checkInvariants(t, tb)
	ca, _ := findCut(a.BeginCut().Finish(), testCtx)
	cb, _ := findCut(b.BeginCut().Finish(), testCtx)
	want := modelHeld(m)
	if diff := cmp.Diff(want, decodeCut(t, ca)); diff != "" {
		t.Errorf("Store (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, decodeCut(t, cb)); diff != "" {
		t.Errorf("storeBatch (-want +got):\n%s", diff)
	}
}
