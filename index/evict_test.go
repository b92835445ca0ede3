package index

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// accountErr checks that every stripe's accounted bytes are exactly what
// its structures hold at the documented costs.
func accountErr(tb *Table) error {
	for si := range tb.stripes {
		s := &tb.stripes[si]
		s.mu.Lock()
		s.charge(0) // take in the holder sets' last change
		want := int64(s.nlive) * blockBytes
		for i := range s.blocks {
			if b := &s.blocks[i]; b.first.own != 0 && b.ext != 0 {
				want += extBytes + pairBytes*int64(len(s.overflow(b)))
			}
		}
		for _, l := range s.owned {
			want += ownedBytes * int64(len(l))
		}
		for _, g := range s.groups {
			want += groupWordBytes * int64(len(g))
		}
		want += sharedGroupBytes * int64(len(s.sharedGroups))
		want += s.sets.bytes
		for rk, list := range s.refs {
			want += refListBytes
			for i, r := range list {
				want += refSlotBytes + r.cost
				if !r.held || int(r.pos) != i || r.key != rk.key {
					s.mu.Unlock()
					return fmt.Errorf("stripe %d: reference %d of key %d is not held where listed", si, i, rk.key)
				}
			}
			if b := s.find(rk.key, mix(rk.key)); b < 0 {
				s.mu.Unlock()
				return fmt.Errorf("stripe %d: references on key %d without its block", si, rk.key)
			} else if k := s.findShared(&s.blocks[b], rk.bit); k == noPair || s.pairAt(&s.blocks[b], k).aux < uint32(len(list)) {
				s.mu.Unlock()
				return fmt.Errorf("stripe %d: key %d's shared holder counts fewer than its %d references", si, rk.key, len(list))
			}
		}
		got := s.acct.bytes
		s.mu.Unlock()
		if got != want {
			return fmt.Errorf("stripe %d accounts %d bytes, holds %d", si, got, want)
		}
	}
	return nil
}

// evictUpTo evicts, synchronously, every entry stamped at or before limit.
func evictUpTo(ix *Index, limit uint32) {
	for _, t := range ix.allTables() {
		for i := range t.stripes {
			t.evictStripe(&t.stripes[i], limit)
		}
	}
}

// evictModel is refModel with recency: the epoch each key was last stored
// or re-announced at, so that it knows exactly what an eviction removes.
type evictModel struct {
	*refModel
	stamp map[uint64]uint32
}

func (m *evictModel) evict(limit uint32) {
	for key, st := range m.stamp {
		if st > limit {
			continue
		}
		delete(m.stamp, key)
		for _, h := range m.held {
			delete(h, key)
		}
		delete(m.shared[CPUShare], key)
		delete(m.shared[Disk], key)
	}
}

// lowerOrEqual reports whether every count of got is at most want's for
// the same (instance, rank): an answer after eviction may be lower than
// the engines' truth, never higher.
func lowerOrEqual(got, want []InstanceHits) bool {
	truth := map[[2]any]TierCounts{}
	for _, in := range want {
		for _, r := range in.Ranks {
			truth[[2]any{in.Instance, r.Rank}] = r.TierCounts
		}
	}
	for _, in := range got {
		for _, r := range in.Ranks {
			w, ok := truth[[2]any{in.Instance, r.Rank}]
			c := r.TierCounts
			if !ok || c.Device > w.Device || c.CPULocal > w.CPULocal || c.CPUShare > w.CPUShare || c.Disk > w.Disk {
				return false
			}
		}
	}
	return true
}

// TestPropertyEvictionNeverOverReports runs random stores, removals,
// shared references, clock ticks, evictions and queries against two
// models: one that applies the evictions (the index must match it
// exactly) and the engines' truth, which never evicts (the index must
// never report more than it).
func TestPropertyEvictionNeverOverReports(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		stripes := rapid.SampledFrom([]int{1, 2, 8}).Draw(rt, "stripes")
		// A limit so large the evictor never wakes: evictions are the
		// test's, at the limits it draws.
		ix := New(Options{Stripes: stripes, MemoryLimit: 1 << 40})
		defer ix.Close()
		tb := ix.EnsureTable(testCtx)
		m := &evictModel{refModel: newRefModel(), stamp: map[uint64]uint32{}}
		truth := newRefModel()
		ids := []OwnerID{0}
		key := rapid.Uint64Range(0, 11)
		tier := rapid.SampledFrom([]Tier{Device, CPULocal, CPUShare, Disk})
		anyID := rapid.Custom(func(rt *rapid.T) OwnerID { return rapid.SampledFrom(ids).Draw(rt, "id") })
		var res QueryResult
		rt.Repeat(map[string]func(*rapid.T){
			"add": func(rt *rapid.T) {
				k := ownerKey{rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "inst"), rapid.IntRange(0, 1).Draw(rt, "rank")}
				id := tb.AddEngineOwner(k.instance, k.rank)
				m.reg[k], truth.reg[k] = id, id
				ids = append(ids, id)
			},
			"removeOwner": func(rt *rapid.T) {
				id := anyID.Draw(rt, "id")
				tb.RemoveEngineOwner(id)
				m.removeOwner(id)
				truth.removeOwner(id)
			},
			"store": func(rt *rapid.T) {
				id, tr, k := anyID.Draw(rt, "id"), tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.Store(id, Put{Key: k, Tier: tr})
				if tr != CPUShare && m.registered(id) {
					m.stamp[k] = ix.bud.epoch.Load()
				}
				m.store(id, tr, k)
				truth.store(id, tr, k)
			},
			"remove": func(rt *rapid.T) {
				id, tr, k := anyID.Draw(rt, "id"), tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.Remove(id, Put{Key: k, Tier: tr}) // of an evicted entry: a no-op
				m.remove(id, tr, k)
				truth.remove(id, tr, k)
			},
			"acquire": func(rt *rapid.T) {
				tr, k := tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.acquireShared(tr, k)
				if tr == CPUShare || tr == Disk {
					m.stamp[k] = ix.bud.epoch.Load()
				}
				m.acquire(tr, k)
				truth.acquire(tr, k)
			},
			"release": func(rt *rapid.T) {
				tr, k := tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.releaseShared(tr, k)
				m.release(tr, k)
				truth.release(tr, k)
			},
			"tick": func(rt *rapid.T) { ix.bud.epoch.Add(1) },
			"evict": func(rt *rapid.T) {
				now := ix.bud.epoch.Load()
				limit := now - uint32(rapid.IntRange(0, int(min(now, 3))).Draw(rt, "age"))
				evictUpTo(ix, limit)
				m.evict(limit)
			},
			"query": func(rt *rapid.T) {
				c := &keyChain{}
				for range rapid.IntRange(0, 6).Draw(rt, "n") {
					c.keys = append(c.keys, key.Draw(rt, "key"))
					c.cov = append(c.cov, rapid.IntRange(1, 16).Draw(rt, "covered"))
				}
				filter := rapid.SampledFrom([]string{"", "a", "b"}).Draw(rt, "filter")
				want, _ := m.query(c.keys, c.cov, filter)
				upper, _ := truth.query(c.keys, c.cov, filter)
				tb.Query(c, filter, &res)
				got := res.Instances
				if got == nil {
					got = []InstanceHits{}
				}
				if !reflect.DeepEqual(got, want) {
					rt.Fatalf("query %v %q:\n got  %+v\n want %+v", c.keys, filter, got, want)
				}
				if !lowerOrEqual(got, upper) {
					rt.Fatalf("query %v %q over-reports:\n got   %+v\n truth %+v", c.keys, filter, got, upper)
				}
			},
			"": func(rt *rapid.T) {
				if err := invariantErr(tb); err != nil {
					rt.Fatal(err)
				}
				if err := accountErr(tb); err != nil {
					rt.Fatal(err)
				}
				if pc, _ := m.stats(); tb.PrefixCount() != pc {
					rt.Fatalf("PrefixCount %d, want %d", tb.PrefixCount(), pc)
				}
			},
		})
	})
}

// TestAccountingFollowsEveryPath drives every writer (stores, removals,
// clears, shared references, producer puts, batches, owner removal,
// compaction) at a scale where stripes grow, compact and empty, and checks
// the accounted bytes against the structures, then that dropping every
// table gives everything back.
func TestAccountingFollowsEveryPath(t *testing.T) {
	ix := New(Options{Stripes: 4, MemoryLimit: 1 << 40})
	defer ix.Close()
	base := ix.MemoryBytes()
	tb := ix.EnsureTable(testCtx)
	sc := ix.EnsureScope(ScopeKey{Tenant: "t", Model: "m", Scheme: "s"})
	r := rand.New(rand.NewPCG(1, 2))
	ids := []OwnerID{tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0), tb.AddEngineOwner("c", 1)}
	pid := sc.AddEngineOwner("p", 0)
	var orphans Orphans
	var refs []*SharedRef
	for i := range 60000 {
		id, k := ids[r.IntN(len(ids))], uint64(r.IntN(5000))
		switch n := r.IntN(100); {
		case n < 40:
			tb.Store(id, Put{Key: k, Tier: Tier(r.IntN(4))})
		case n < 65:
			tb.Remove(id, Put{Key: k, Tier: Tier(r.IntN(4))})
		case n < 72:
			tb.acquireShared(Tier(2+r.IntN(2)), k)
		case n < 78:
			tb.releaseShared(Tier(2+r.IntN(2)), k)
		case n < 81:
			ref := newSharedRef(nil, Tier(2+r.IntN(2)), k, int64(r.IntN(300)), &orphans)
			if tb.Acquire(ref) {
				refs = append(refs, ref)
			}
		case n < 84 && len(refs) > 0:
			j := r.IntN(len(refs))
			tb.Release(refs[j])
			refs[j] = refs[len(refs)-1]
			refs = refs[:len(refs)-1]
		case n < 88:
			sc.Store(pid, Put{Key: k, Tier: Tier(r.IntN(2)), Replace: true})
		case n < 95:
			sc.Remove(pid, Put{Key: k, Replace: true})
		case n < 96:
			tb.storeBatch(id, []uint64{k, k + 1, k + 2}, []TierMask{1, 2, 4}, nil)
		default:
			if r.IntN(200) == 0 {
				tb.ClearOwner(id, AllEngineTiers)
			}
		}
		if i%10000 == 0 {
			evictUpTo(ix, ix.bud.epoch.Add(1)-1)
		}
		if i%5000 == 4999 {
			for _, x := range []*Table{tb, sc} {
				if err := accountErr(x); err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
		}
	}
	tb.RemoveEngineOwner(ids[0])
	if err := accountErr(tb); err != nil {
		t.Fatal(err)
	}
	ix.DropTable(testCtx)
	ix.DropScope(sc.ScopeKey())
	if got := ix.MemoryBytes(); got != base {
		t.Fatalf("after dropping every table %d bytes are accounted, want %d", got, base)
	}
}

// TestEvictedRemovalIsNoOp: once an entry is evicted its removal changes
// nothing, and in particular does not touch a later store of the same key.
func TestEvictedRemovalIsNoOp(t *testing.T) {
	ix := New(Options{Stripes: 2, MemoryLimit: 1 << 40})
	defer ix.Close()
	tb := ix.EnsureTable(testCtx)
	a, b := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0)
	tb.Store(a, Put{Key: 1, Tier: Device})
	tb.acquireShared(CPUShare, 1)
	old := ix.bud.epoch.Add(1) - 1
	tb.Store(b, Put{Key: 2, Tier: Device})
	evictUpTo(ix, old)
	if tb.Has(1) || !tb.Has(2) {
		t.Fatalf("after evicting epoch %d: key 1 held %v, key 2 held %v", old, tb.Has(1), tb.Has(2))
	}
	if got := ix.Evictions(EvictedContext); got != 1 {
		t.Fatalf("%d evictions counted, want 1", got)
	}
	tb.Remove(a, Put{Key: 1, Tier: Device})
	tb.releaseShared(CPUShare, 1)
	if tb.Has(1) {
		t.Fatal("removing an evicted entry brought it back")
	}
	tb.Store(b, Put{Key: 1, Tier: Device})
	tb.Remove(a, Put{Key: 1, Tier: Device}) // a's entry was evicted: b's is untouched
	var res QueryResult
	tb.Query(&keyChain{keys: []uint64{1, 2}, cov: []int{16, 16}}, "b", &res)
	want := []InstanceHits{inst("b", RankHits{0, TierCounts{32, 32, 32, 32}})}
	if !reflect.DeepEqual(res.Instances, want) {
		t.Fatalf("got %+v, want %+v", res.Instances, want)
	}
	if err := invariantErr(tb); err != nil {
		t.Fatal(err)
	}
}

// TestBudgetBelowFixedCosts: a budget smaller than the tables' fixed cost
// leaves nothing evictable beyond the entries; writers must still get
// through (the evictor says it is stuck) rather than wait forever.
func TestBudgetBelowFixedCosts(t *testing.T) {
	ix := New(Options{Stripes: 64, MemoryLimit: 64 << 10})
	defer ix.Close()
	var tbs []*Table
	for i := range 8 { // 8 × 64 stripes × 320 B: 160 KiB of fixed cost
		tbs = append(tbs, ix.EnsureTable(ContextKey{Model: fmt.Sprint("m", i), BlockSize: 16}))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, tb := range tbs {
			id := tb.AddEngineOwner("a", 0)
			for k := range uint64(5000) {
				tb.Store(id, Put{Key: uint64(i)<<32 | k, Tier: Device})
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("writers still waiting for an evictor with nothing to evict")
	}
	if ix.Evictions(EvictedContext) == 0 {
		t.Error("nothing was evicted")
	}
}
