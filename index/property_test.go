package index

import (
	"cmp"
	"fmt"
	"math/rand/v2"

	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// refModel is the naive reference: plain maps, no striping, no reverse
// lists, recomputed from scratch on every query.
type refModel struct {
	reg    map[ownerKey]OwnerID
	held   map[OwnerID]map[uint64]uint8 // engine tier bits per key
	shared [numTiers]map[uint64]int     // reference counts (CPUShare, Disk)
}

func newRefModel() *refModel {
	m := &refModel{reg: map[ownerKey]OwnerID{}, held: map[OwnerID]map[uint64]uint8{}}
	m.shared[CPUShare] = map[uint64]int{}
	m.shared[Disk] = map[uint64]int{}
	return m
}

func (m *refModel) registered(id OwnerID) bool {
	for _, v := range m.reg {
		if v == id {
			return true
		}
	}
	return false
}

func (m *refModel) store(id OwnerID, tier Tier, key uint64) {
	if tier == CPUShare || !m.registered(id) {
		return
	}
	if m.held[id] == nil {
		m.held[id] = map[uint64]uint8{}
	}
	m.held[id][key] |= 1 << tier
}

func (m *refModel) remove(id OwnerID, tier Tier, key uint64) {
	if h := m.held[id]; h != nil {
		h[key] &^= 1 << tier
		if h[key] == 0 {
			delete(h, key)
		}
	}
}

func (m *refModel) clearOwner(id OwnerID, tiers TierMask) {
	for _, tier := range []Tier{Device, CPULocal, Disk} {
		if tiers&(1<<tier) != 0 {
			for key := range m.held[id] {
				m.remove(id, tier, key)
			}
		}
	}
}

func (m *refModel) removeOwner(id OwnerID) {
	for k, v := range m.reg {
		if v == id {
			delete(m.reg, k)
		}
	}
	delete(m.held, id)
}

func (m *refModel) acquire(tier Tier, key uint64) {
	if tier == CPUShare || tier == Disk {
		m.shared[tier][key]++
	}
}

func (m *refModel) release(tier Tier, key uint64) {
	if (tier == CPUShare || tier == Disk) && m.shared[tier][key] > 0 {
		if m.shared[tier][key]--; m.shared[tier][key] == 0 {
			delete(m.shared[tier], key)
		}
	}
}

// tiersOf returns every tier bit anyone holds key in.
func (m *refModel) tiersOf(key uint64) uint8 {
	var b uint8
	for _, h := range m.held {
		b |= h[key]
	}
	if m.shared[CPUShare][key] > 0 {
		b |= bitShare
	}
	if m.shared[Disk][key] > 0 {
		b |= bitDisk
	}
	return b
}

func (m *refModel) stats() (prefixes int, tiers [4]int) {
	keys := map[uint64]bool{}
	for _, h := range m.held {
		for k := range h {
			keys[k] = true
		}
	}
	for _, t := range []Tier{CPUShare, Disk} {
		for k := range m.shared[t] {
			keys[k] = true
		}
	}
	for k := range keys {
		b := m.tiersOf(k)
		for t := range numTiers {
			if b&(1<<t) != 0 {
				tiers[t]++
			}
		}
	}
	return len(keys), tiers
}

// query answers literally from the contract and returns how many blocks a
// walk decides on (see walkCalls): up to and including the first block
// that ends every reported owner's disk prefix.
func (m *refModel) query(keys []uint64, cov []int, filter string) ([]InstanceHits, int) {
	var owners []ownerRef
	for k, id := range m.reg {
		if filter == "" || filter == k.instance {
			owners = append(owners, ownerRef{id, k.instance, k.rank})
		}
	}
	slices.SortFunc(owners, func(a, b ownerRef) int {
		return cmp.Or(cmp.Compare(a.instance, b.instance), cmp.Compare(a.rank, b.rank))
	})
	out := []InstanceHits{}
	longest := -1
	for _, o := range owners {
		var c TierCounts
		dev, loc, sh, dk := true, true, true, true
		blocks := 0
		for i, key := range keys {
			h := m.held[o.id][key]
			shC, shD := m.shared[CPUShare][key] > 0, m.shared[Disk][key] > 0
			dev = dev && h&bitDevice != 0
			loc = loc && h&(bitDevice|bitLocal) != 0
			sh = sh && (h&(bitDevice|bitLocal) != 0 || shC)
			dk = dk && (h != 0 || shC || shD)
			if dev {
				c.Device += cov[i]
			}
			if loc {
				c.CPULocal += cov[i]
			}
			if sh {
				c.CPUShare += cov[i]
			}
			if dk {
				c.Disk += cov[i]
				blocks++
			}
		}
		longest = max(longest, blocks)
		if n := len(out); n == 0 || out[n-1].Instance != o.instance {
			out = append(out, InstanceHits{Instance: o.instance})
		}
		ih := &out[len(out)-1]
		ih.Ranks = append(ih.Ranks, RankHits{Rank: o.rank, TierCounts: c})
	}
	for i := range out {
		out[i] = inst(out[i].Instance, out[i].Ranks...)
	}
	return out, longest + 1
}

func (m *refModel) instances() map[string][]int {
	out := map[string][]int{}
	for k := range m.reg {
		out[k.instance] = append(out[k.instance], k.rank)
	}
	for _, r := range out {
		slices.Sort(r)
	}
	return out
}

func TestPropertyAgainstReference(t *testing.T) { propertyAgainstReference(t, false) }

// propertyAgainstReference checks tables against the reference model;
// prefetchAll takes every stripe as large enough to prefetch.
func propertyAgainstReference(t *testing.T, prefetchAll bool) {
	rapid.Check(t, func(rt *rapid.T) {
		stripes := rapid.SampledFrom([]int{1, 2, 8}).Draw(rt, "stripes")
		tb := New(Options{Stripes: stripes}).EnsureTable(testCtx)
		if prefetchAll {
			tb.prefetchMin = 0
		}
		m := newRefModel()
		ids := []OwnerID{0, 999} // never issued: every use is a no-op
		key := rapid.Uint64Range(0, 11)
		tier := rapid.SampledFrom([]Tier{Device, CPULocal, CPUShare, Disk})
		anyID := rapid.Custom(func(rt *rapid.T) OwnerID { return rapid.SampledFrom(ids).Draw(rt, "id") })
		var res QueryResult          // reused across queries, as the server does
		stale := map[uint64]uint32{} // block hints located before

		rt.Repeat(map[string]func(*rapid.T){
			"add": func(rt *rapid.T) {
				k := ownerKey{rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "inst"), rapid.IntRange(0, 2).Draw(rt, "rank")}
				id := tb.AddEngineOwner(k.instance, k.rank)
				if old, ok := m.reg[k]; ok && old != id {
					rt.Fatalf("re-add gave %d, had %d", id, old)
				}
				m.reg[k] = id
				ids = append(ids, id)
			},
			"removeOwner": func(rt *rapid.T) {
				id := anyID.Draw(rt, "id")
				tb.RemoveEngineOwner(id)
				m.removeOwner(id)
			},
			"store": func(rt *rapid.T) {
				id, tr, k := anyID.Draw(rt, "id"), tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.Store(id, Put{Key: k, Tier: tr})
				m.store(id, tr, k)
			},
			"remove": func(rt *rapid.T) {
				id, tr, k := anyID.Draw(rt, "id"), tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.Remove(id, Put{Key: k, Tier: tr})
				m.remove(id, tr, k)
			},
			"clear": func(rt *rapid.T) {
				id := anyID.Draw(rt, "id")
				mask := TierMask(rapid.IntRange(0, 15).Draw(rt, "mask"))
				tb.ClearOwner(id, mask)
				m.clearOwner(id, mask)
			},
			"acquire": func(rt *rapid.T) {
				tr, k := tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.acquireShared(tr, k)
				m.acquire(tr, k)
			},
			"release": func(rt *rapid.T) {
				tr, k := tier.Draw(rt, "tier"), key.Draw(rt, "key")
				tb.releaseShared(tr, k)
				m.release(tr, k)
			},
			"query": func(rt *rapid.T) {
				n := rapid.IntRange(0, 6).Draw(rt, "n")
				c := &keyChain{}
				for range n {
					c.keys = append(c.keys, key.Draw(rt, "key"))
					c.cov = append(c.cov, rapid.IntRange(1, 16).Draw(rt, "covered"))
				}
				filter := rapid.SampledFrom([]string{"", "", "a", "b", "z"}).Draw(rt, "filter")
				want, calls := m.query(c.keys, c.cov, filter)
				hints := hintsFor(tb, c.keys, rapid.IntRange(0, numHintModes-1).Draw(rt, "hints"), stale,
					func(n int) int { return rapid.IntRange(0, n-1).Draw(rt, "hint") })
				ch, calls := asHinted(c, rapid.IntRange(0, n).Draw(rt, "ready"), calls, hints)
				tb.Query(ch, filter, &res)
				got := res.Instances
				if got == nil {
					got = []InstanceHits{}
				}
				if !reflect.DeepEqual(got, want) {
					rt.Fatalf("query %v %q:\n got  %+v\n want %+v", c.keys, filter, got, want)
				}
				if c.calls != calls {
					rt.Fatalf("chain advanced %d times, reference allows %d", c.calls, calls)
				}
				checkExplain(rt, tb, c.keys, c.cov, filter, want)
			},
			"": func(rt *rapid.T) {
				if err := invariantErr(tb); err != nil {
					rt.Fatal(err)
				}
				pc, tiers := m.stats()
				if got := tb.PrefixCount(); got != pc {
					rt.Fatalf("PrefixCount %d, want %d", got, pc)
				}
				if got := tb.TierBlocks(); got != tiers {
					rt.Fatalf("TierBlocks %v, want %v", got, tiers)
				}
				if got, want := tb.Instances(), m.instances(); !reflect.DeepEqual(got, want) {
					rt.Fatalf("Instances %v, want %v", got, want)
				}
			},
		})
	})
}

// TestRandomizedAgainstReference is the same differential check at a scale
// rapid's shrinking makes impractical: enough keys per stripe for index
// growth, shrinking and slab compaction to happen between queries.
func TestRandomizedAgainstReference(t *testing.T) {
	ops := 40000
	if testing.Short() {
		ops = 5000
	}
	for seed := range uint64(3) {
		r := rand.New(rand.NewPCG(seed, 42))
		tb := New(Options{Stripes: 1 << seed}).EnsureTable(testCtx)
		m := newRefModel()
		ids := []OwnerID{0}
		var res QueryResult
		stale := map[uint64]uint32{} // block hints located before
		tiers := []Tier{Device, CPULocal, CPUShare, Disk}
		for i := range ops {
			id := ids[r.IntN(len(ids))]
			tier := tiers[r.IntN(4)]
			k := uint64(r.IntN(1500))
			if r.IntN(4000) == 0 { // mass eviction: every owner cleared, most shared refs gone
				for _, id := range m.reg {
					tb.ClearOwner(id, AllEngineTiers)
					m.clearOwner(id, AllEngineTiers)
				}
				for _, tier := range []Tier{CPUShare, Disk} {
					for k, refs := range m.shared[tier] {
						if k%8 != 0 {
							for range refs {
								tb.releaseShared(tier, k)
								m.release(tier, k)
							}
						}
					}
				}
			}
			switch n := r.IntN(1000); {
			case n < 450:
				tb.Store(id, Put{Key: k, Tier: tier})
				m.store(id, tier, k)
			case n < 700:
				tb.Remove(id, Put{Key: k, Tier: tier})
				m.remove(id, tier, k)
			case n < 780:
				tb.acquireShared(tier, k)
				m.acquire(tier, k)
			case n < 860:
				tb.releaseShared(tier, k)
				m.release(tier, k)
			case n < 875:
				mask := TierMask(r.IntN(16))
				tb.ClearOwner(id, mask)
				m.clearOwner(id, mask)
			case n < 880:
				tb.RemoveEngineOwner(id)
				m.removeOwner(id)
			case n < 900:
				inst, rank := string(rune('a'+r.IntN(3))), r.IntN(2)
				id := tb.AddEngineOwner(inst, rank)
				m.reg[ownerKey{inst, rank}] = id
				ids = append(ids, id)
			default:
				start := uint64(r.IntN(1500))
				c := &keyChain{}
				for j := range r.IntN(40) {
					c.keys = append(c.keys, (start+uint64(j))%1500)
					c.cov = append(c.cov, 1+r.IntN(16))
				}
				filter := []string{"", "a", "b", "c", "x"}[r.IntN(5)]
				want, calls := m.query(c.keys, c.cov, filter)
				hints := hintsFor(tb, c.keys, r.IntN(numHintModes), stale, r.IntN)
				ch, calls := asHinted(c, r.IntN(len(c.keys)+1), calls, hints)
				tb.Query(ch, filter, &res)
				got := res.Instances
				if got == nil {
					got = []InstanceHits{}
				}
				if !reflect.DeepEqual(got, want) || c.calls != calls {
					t.Fatalf("seed %d op %d query %q: got %+v (%d calls)\nwant %+v (%d calls)", seed, i, filter, got, c.calls, want, calls)
				}
			}
			if i%2000 == 0 || i == ops-1 {
				checkInvariants(t, tb)
				pc, tiers := m.stats()
				if tb.PrefixCount() != pc || tb.TierBlocks() != tiers {
					t.Fatalf("seed %d op %d: stats %d %v, want %d %v", seed, i, tb.PrefixCount(), tb.TierBlocks(), pc, tiers)
				}
			}
		}
	}
}

// TestWideQueryAgainstReference covers the multi-word walk (more than 64
// reported owners) against the reference model, with owners dying at
// different blocks and tiers in every word.
func TestWideQueryAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	tb := New(Options{Stripes: 8}).EnsureTable(testCtx)
	m := newRefModel()
	tiers := []Tier{Device, CPULocal, Disk}
	for i := range 13 {
		for rank := range 11 { // 143 owners: three words
			inst := fmt.Sprintf("inst-%02d", i)
			id := tb.AddEngineOwner(inst, rank)
			m.reg[ownerKey{inst, rank}] = id
			held := r.IntN(24)
			for k := range uint64(held) {
				if r.IntN(30) == 0 {
					continue // a gap
				}
				tier := tiers[r.IntN(3)]
				tb.Store(id, Put{Key: k, Tier: tier})
				m.store(id, tier, k)
			}
		}
	}
	for k := uint64(3); k < 20; k += 1 + uint64(r.IntN(3)) {
		tier := []Tier{CPUShare, Disk}[r.IntN(2)]
		tb.acquireShared(tier, k)
		m.acquire(tier, k)
	}
	var res QueryResult
	for _, filter := range []string{"", "inst-03", "inst-12", ""} {
		c := &keyChain{}
		for k := range uint64(26) {
			c.keys = append(c.keys, k)
			c.cov = append(c.cov, 1+r.IntN(16))
		}
		tb.Query(c, filter, &res)
		want, decide := m.query(c.keys, c.cov, filter)
		if calls := walkCalls(decide, len(c.keys), 0); !reflect.DeepEqual(res.Instances, want) || c.calls != calls {
			t.Fatalf("filter %q: got %+v (%d calls)\nwant %+v (%d calls)", filter, res.Instances, c.calls, want, calls)
		}
	}
}

// checkExplain: Explain reports, per owner, the counts Query does, and a
// stop block consistent with them: the disk count is the tokens before it,
// and only a run reaching the end stops with PromptEnd.
func checkExplain(rt *rapid.T, tb *Table, keys []uint64, cov []int, filter string, want []InstanceHits) {
	ends := make([]int, len(keys))
	total := 0
	for i, c := range cov {
		total += c
		ends[i] = total
	}
	blocks, runs := tb.Explain(keys, ends, filter)
	if len(blocks) != len(keys) {
		rt.Fatalf("explain: %d blocks for %d keys", len(blocks), len(keys))
	}
	var wantRuns []OwnerRun
	for _, in := range want {
		for _, r := range in.Ranks {
			wantRuns = append(wantRuns, OwnerRun{Instance: in.Instance, Rank: r.Rank, Counts: r.TierCounts})
		}
	}
	if len(runs) != len(wantRuns) {
		rt.Fatalf("explain: %d owners, query reports %d", len(runs), len(wantRuns))
	}
	for i, r := range runs {
		w := wantRuns[i]
		if r.Instance != w.Instance || r.Rank != w.Rank || r.Counts != w.Counts {
			rt.Fatalf("explain owner %d: %+v, query says %+v", i, r, w)
		}
		before := 0
		if r.StopBlock > 0 {
			before = ends[r.StopBlock-1]
		}
		if r.Counts.Disk != before || (r.Reason == PromptEnd) != (r.StopBlock == len(keys)) {
			rt.Fatalf("explain owner %d: stop %d (%v) with disk count %d", i, r.StopBlock, r.Reason, r.Counts.Disk)
		}
		if r.StopBlock < len(keys) && (r.Reason == KeyAbsent) == blocks[r.StopBlock].Indexed {
			rt.Fatalf("explain owner %d: reason %v at a block indexed=%v", i, r.Reason, blocks[r.StopBlock].Indexed)
		}
	}
}

// TestPropertyAgainstReferencePrefetching runs the property with every
// stripe taken as large, so the batched walk's block prefetching (a hint
// that must change no answer) runs on the small tables the property
// draws.
func TestPropertyAgainstReferencePrefetching(t *testing.T) { propertyAgainstReference(t, true) }
