package index

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestStoreRemoveResults checks what Store and Remove report, step by step
// on one owner, and that the table stays consistent after each step.
func TestStoreRemoveResults(t *testing.T) {
	ix := New(Options{Stripes: 2})
	tb := ix.EnsureTable(testCtx)
	a := tb.AddEngineOwner("a", 0)
	type step struct {
		name    string
		remove  bool
		p       Put
		added   bool // Store
		hint    bool // Store: a hint other than 0
		removed bool // Remove
		tiers   TierMask
	}
	steps := []step{
		{name: "first store", p: Put{Key: 1, Tier: Device}, added: true, hint: true, tiers: 1 << Device},
		{name: "same again", p: Put{Key: 1, Tier: Device}, hint: true, tiers: 1 << Device},
		{name: "another tier", p: Put{Key: 1, Tier: Disk}, hint: true, tiers: 1<<Device | 1<<Disk},
		{name: "a shared tier is not an engine's", p: Put{Key: 1, Tier: CPUShare}, tiers: 1<<Device | 1<<Disk},
		{name: "group out of range", p: Put{Key: 1, Tier: CPULocal, Group: MaxGroups}, tiers: 1<<Device | 1<<Disk},
		{name: "negative group", p: Put{Key: 1, Tier: CPULocal, Group: -1}, tiers: 1<<Device | 1<<Disk},
		{name: "group 2 on device", p: Put{Key: 1, Tier: Device, Group: 2}, hint: true, tiers: 1<<Device | 1<<Disk},
		{name: "remove group 0 keeps device for group 2", remove: true, p: Put{Key: 1, Tier: Device}, removed: true, tiers: 1<<Device | 1<<Disk},
		{name: "remove group 0 again", remove: true, p: Put{Key: 1, Tier: Device}, tiers: 1<<Device | 1<<Disk},
		{name: "remove group 2 retracts device", remove: true, p: Put{Key: 1, Tier: Device, Group: 2}, removed: true, tiers: 1 << Disk},
		{name: "remove a tier not held", remove: true, p: Put{Key: 1, Tier: CPULocal}, tiers: 1 << Disk},
		{name: "remove an unknown key", remove: true, p: Put{Key: 99, Tier: Disk}, tiers: 1 << Disk},
		{name: "replace moves to host", p: Put{Key: 1, Tier: CPULocal, Replace: true}, hint: true, tiers: 1 << CPULocal},
		{name: "replacing remove", remove: true, p: Put{Key: 1, Replace: true}, removed: true},
		{name: "replacing remove of nothing", remove: true, p: Put{Key: 1, Replace: true}},
		{name: "replace adds", p: Put{Key: 1, Tier: Device, Replace: true}, added: true, hint: true, tiers: 1 << Device},
		{name: "group 2 beside", p: Put{Key: 1, Tier: Device, Group: 2}, hint: true, tiers: 1 << Device},
		{name: "replace drops group 2", p: Put{Key: 1, Tier: Device, Replace: true}, hint: true, tiers: 1 << Device},
		{name: "so group 0's removal retracts", remove: true, p: Put{Key: 1, Tier: Device}, removed: true},
	}
	for _, st := range steps {
		if st.remove {
			if got := tb.Remove(a, st.p); got != st.removed {
				t.Errorf("%s: Remove = %v, want %v", st.name, got, st.removed)
			}
		} else {
			hint, added := tb.Store(a, st.p)
			if added != st.added || (hint != 0) != st.hint {
				t.Errorf("%s: Store = (%d, %v), want added %v, a hint %v", st.name, hint, added, st.added, st.hint)
			}
			if hint != 0 {
				loc := make([]uint32, 1)
				tb.Locate([]uint64{st.p.Key}, loc)
				if loc[0] != hint {
					t.Errorf("%s: hint %d, Locate says %d", st.name, hint, loc[0])
				}
			}
		}
		checkInvariants(t, tb)
		if err := groupsErr(tb); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := heldTiers(t, ix, Owner{"a", 0}, 1); got != st.tiers {
			t.Errorf("%s: owner holds key 1 in %04b, want %04b", st.name, got, st.tiers)
		}
	}
	if h, added := tb.Store(OwnerID(12345), Put{Key: 2, Tier: Device}); h != 0 || added {
		t.Errorf("an unknown owner stored: (%d, %v)", h, added)
	}
}

// heldTiers is the tiers owner o holds key in, as a cut records them.
func heldTiers(t *testing.T, ix *Index, o Owner, key uint64) TierMask {
	t.Helper()
	cut, _ := findCut(ix.BeginCut().Finish(), testCtx)
	return decodeCut(t, cut)[o][key]
}

// TestSharedRefGroups checks the one acquire/release pair for references of
// group 0 and of other groups: each is taken at most once, released at most
// once, and only group 0 is charged its cost.
func TestSharedRefGroups(t *testing.T) {
	for _, g := range []int{0, 3} {
		t.Run(fmt.Sprint("group=", g), func(t *testing.T) {
			ix := New(Options{Stripes: 2})
			tb := ix.EnsureTable(testCtx)
			base := ix.MemoryBytes()
			var r, other SharedRef
			r.Init("r", CPUShare, g, 7, 100, nil)
			other.Init("other", CPUShare, g, 7, 100, nil)
			if r.Group() != g || r.Tier() != CPUShare || r.Key() != 7 {
				t.Fatalf("Init gave group %d tier %d key %d", r.Group(), r.Tier(), r.Key())
			}
			if !tb.Acquire(&r) || tb.Acquire(&r) {
				t.Fatal("a reference was not taken exactly once")
			}
			if !tb.Acquire(&other) {
				t.Fatal("a second reference on the key was refused")
			}
			if got := tb.Adjust(&r, 50); got != (g == 0) {
				t.Errorf("Adjust = %v; only group 0 references account bytes", got)
			}
			tb.Release(&r)
			tb.Release(&r) // a no-op: it never takes other's count
			if g == 0 {
				if !tb.Has(7) {
					t.Fatal("the key left the shared tier with a reference still held")
				}
			} else if w := tb.stripeFor(mix(7)).sharedGroups[7].word(); w != 1<<g {
				t.Fatalf("group word %b after one release, want %b", w, 1<<g)
			}
			tb.Release(&other)
			checkInvariants(t, tb)
			if tb.Has(7) || tb.stripeFor(mix(7)).sharedGroups[7] != nil {
				t.Fatal("the key stayed shared after its last release")
			}
			if got := accountErr(tb); got != nil {
				t.Fatal(got)
			}
			if ix.MemoryBytes() != base {
				t.Errorf("accounted %d bytes after every release, want %d", ix.MemoryBytes(), base)
			}
			var bad SharedRef
			bad.Init(nil, Device, g, 7, 0, nil)
			if tb.Acquire(&bad) {
				t.Error("a reference on an engine tier was taken")
			}
		})
	}
}

// TestSplitEntriesRestoresPerOwner: restoring each owner from its own split
// gives the table a restore of the whole cut gives, and each split holds
// exactly its owner's blocks.
func TestSplitEntriesRestoresPerOwner(t *testing.T) {
	ix := New(Options{Stripes: 8})
	tb := ix.EnsureTable(testCtx)
	rng := rand.New(rand.NewPCG(3, 4))
	var ids []OwnerID
	for i := range 3 {
		ids = append(ids, tb.AddEngineOwner(fmt.Sprint("i", i), 0))
	}
	for range 3000 {
		id, k := ids[rng.IntN(len(ids))], rng.Uint64N(800)
		tr := []Tier{Device, CPULocal, Disk}[rng.IntN(3)]
		tb.Store(id, Put{Key: k, Tier: tr, Group: rng.IntN(3)})
	}
	cut, _ := findCut(ix.BeginCut().Finish(), testCtx)
	split, err := SplitEntries(cut.Entries, len(cut.Owners))
	if err != nil {
		t.Fatal(err)
	}
	whole, perOwner := New(Options{Stripes: 4}), New(Options{Stripes: 4})
	tw, tp := whole.EnsureTable(testCtx), perOwner.EnsureTable(testCtx)
	var wids []OwnerID
	pairs := 0
	for i, o := range cut.Owners {
		wids = append(wids, tw.AddEngineOwner(o.Instance, o.Rank))
		b, p, err := WalkEntries(split[i], 1, nil)
		if err != nil || b != p {
			t.Fatalf("owner %d's split: %d blocks, %d pairs, %v", i, b, p, err)
		}
		pairs += p
		if err := tp.Restore(split[i], []OwnerID{tp.AddEngineOwner(o.Instance, o.Rank)}); err != nil {
			t.Fatal(err)
		}
	}
	if pairs != cut.Pairs {
		t.Errorf("splits hold %d pairs, the cut %d", pairs, cut.Pairs)
	}
	if err := tw.Restore(cut.Entries, wids); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, tp)
	if err := groupsErr(tp); err != nil {
		t.Fatal(err)
	}
	cw, _ := findCut(whole.BeginCut().Finish(), testCtx)
	cp, _ := findCut(perOwner.BeginCut().Finish(), testCtx)
	if diff := cmp.Diff(decodeCut(t, cw), decodeCut(t, cp)); diff != "" {
		t.Errorf("per-owner restore (-whole +per owner):\n%s", diff)
	}
	if !bytes.Equal(cw.Entries, cp.Entries) {
		t.Error("per-owner restore encodes differently from a whole restore (group words)")
	}
	if _, err := SplitEntries([]byte{1, 2, 3}, 1); err == nil {
		t.Error("SplitEntries took malformed entries")
	}
}
