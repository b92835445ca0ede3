package index

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
)

// own packs an engine holder word for tests.
func ownWord(id OwnerID, mask uint32) pair { return pair{own: uint32(id)<<maskBits | mask} }

func TestHolderSetsIntern(t *testing.T) {
	var hs holderSets
	a, b, c := ownWord(1, bitDevice), ownWord(2, bitDevice), ownWord(3, bitDisk)
	ab := hs.intern(a, []pair{b})
	cases := []struct {
		name  string
		first pair
		rest  []pair
		want  uint32 // 0: a new id, other than ab
	}{
		{"same holders", a, []pair{b}, ab},
		{"same holders, other order", b, []pair{a}, ab},
		{"another holder", a, []pair{b, c}, 0},
		{"another tier", a, []pair{ownWord(2, bitLocal)}, 0},
		{"shared holder", a, []pair{{own: bitShare, aux: 1}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := hs.intern(tc.first, tc.rest)
			if tc.want != 0 && got != tc.want || tc.want == 0 && (got == 0 || got == ab) {
				t.Fatalf("id %d, want %d (ab is %d)", got, tc.want, ab)
			}
			hs.release(got)
		})
	}
	if refs := hs.sets[ab-1].refs; refs != 1 {
		t.Fatalf("ab has %d references after balanced interns, want 1", refs)
	}
	if err := holderSetsErr(&hs, map[uint32]uint32{ab: 1}); err != nil {
		t.Fatal(err)
	}
	var long []pair
	for i := range maxInternedHolders {
		long = append(long, ownWord(OwnerID(10+i), bitDevice))
	}
	if id := hs.intern(a, long); id != 0 {
		t.Fatalf("%d holders interned as %d, want uninterned", len(long)+1, id)
	}
}

// TestHolderSetsSweep checks that unreferenced lists keep their ids (and
// the epoch) until they outnumber referenced ones, and that a sweep frees
// them, bumps the epoch, keeps live lists findable and returns all memory
// once nothing is referenced.
func TestHolderSetsSweep(t *testing.T) {
	var hs holderSets
	a := ownWord(1, bitDevice)
	kept := hs.intern(a, []pair{ownWord(2, bitDevice)})
	var ids []uint32
	for i := range minSweep {
		ids = append(ids, hs.intern(a, []pair{ownWord(OwnerID(100+i), bitDevice)}))
	}
	for _, id := range ids {
		hs.release(id)
	}
	if hs.epoch != 0 || hs.unused != minSweep {
		t.Fatalf("after %d releases: epoch %d, unused %d; want no sweep yet", minSweep, hs.epoch, hs.unused)
	}
	if again := hs.intern(a, []pair{ownWord(100, bitDevice)}); again != ids[0] {
		t.Fatalf("unreferenced list came back as %d, want its old id %d", again, ids[0])
	}
	hs.release(ids[0])
	extra := hs.intern(a, []pair{ownWord(999, bitDevice)})
	hs.release(extra) // minSweep+1 unused of minSweep+2: sweep
	if hs.epoch != 1 || hs.unused != 0 || len(hs.free) != minSweep+1 {
		t.Fatalf("after the sweep: epoch %d, unused %d, free %d", hs.epoch, hs.unused, len(hs.free))
	}
	if err := holderSetsErr(&hs, map[uint32]uint32{kept: 1}); err != nil {
		t.Fatal(err)
	}
	if again := hs.intern(ownWord(2, bitDevice), []pair{a}); again != kept {
		t.Fatalf("referenced list lost by the sweep: %d, want %d", again, kept)
	}
	hs.release(kept)
	hs.release(kept)
	for i := 0; hs.epoch == 1 && i <= 2*minSweep; i++ { // until the next sweep
		hs.release(hs.intern(a, []pair{ownWord(OwnerID(500+i), bitDevice)}))
	}
	if hs.sets != nil || hs.byHash != nil || hs.epoch != 2 {
		t.Fatalf("nothing referenced, but %d sets and map %v kept (epoch %d)", len(hs.sets), hs.byHash != nil, hs.epoch)
	}
}

// hookChain runs hook once, just before handing out key number at, so a
// test can change the table in the middle of a walk, between two lock holds
// of one stripe. A key-by-key walk hashes one block ahead, so that is after
// the walk has looked up key at-2 and before it looks up key at-1.
type hookChain struct {
	keyChain
	at   int
	hook func()
}

func (c *hookChain) Next() (uint64, int, bool) {
	if c.i == c.at && c.hook != nil {
		c.hook()
		c.hook = nil
	}
	return c.keyChain.Next()
}

// TestQueryAfterHolderListReuse: a walk remembers, per stripe, the holder
// sets an interned list id gave. When that id is freed and reissued to
// another list while the walk is between blocks, the next block with the id
// must be resolved again, not answered from the memo.
func TestQueryAfterHolderListReuse(t *testing.T) {
	ix := New(Options{Stripes: 2})
	tb := ix.EnsureTable(testCtx)
	// keysIn returns n keys from start on that live in stripe si.
	keysIn := func(si, n int, start uint64) []uint64 {
		var ks []uint64
		for k := start; len(ks) < n; k++ {
			if tb.stripeIndex(mix(k)) == si {
				ks = append(ks, k)
			}
		}
		return ks
	}
	o1, o2, o3 := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0), tb.AddEngineOwner("c", 0)
	ab := keysIn(0, 2, 1000) // keyA, keyB in stripe 0
	keyA, keyB, keyF := ab[0], ab[1], keysIn(1, 1, 1000)[0]
	// Other lists in stripe 0, enough to sweep once unreferenced, interned
	// before keyA's so that its id is the newest and the first reissued.
	// Each of a few owners holds a key in every combination of its tiers,
	// so the query still has at most 64 owners (walkSmall).
	tiers := []Tier{Device, CPULocal, Disk}
	var others []OwnerID
	for n, k := range keysIn(0, minSweep+1, 5000) {
		if n%7 == 0 {
			others = append(others, tb.AddEngineOwner(fmt.Sprint("x", n/7), 0))
		}
		tb.Store(o1, Put{Key: k, Tier: Device})
		for i, tier := range tiers {
			if (n%7+1)&(1<<i) != 0 {
				tb.Store(others[len(others)-1], Put{Key: k, Tier: tier})
			}
		}
	}
	tb.Store(o1, Put{Key: keyA, Tier: Device})
	tb.Store(o2, Put{Key: keyA, Tier: Device})
	// keyF, in the other stripe, keeps a and b going between keyA and keyB
	// without touching stripe 0's memo.
	tb.Store(o1, Put{Key: keyF, Tier: Device})
	tb.Store(o2, Put{Key: keyF, Tier: Device})
	s := &tb.stripes[0]
	idA := s.blocks[s.find(keyA, mix(keyA))].holderID()

	reuse := func() {
		// keyA's list and the others lose their last reference, which
		// sweeps them, and keyB's new list gets keyA's old id.
		tb.Remove(o2, Put{Key: keyA, Tier: Device})
		for _, id := range others {
			tb.ClearOwner(id, AllEngineTiers)
		}
		tb.Store(o1, Put{Key: keyB, Tier: Device})
		tb.Store(o3, Put{Key: keyB, Tier: Device})
		if got := s.blocks[s.find(keyB, mix(keyB))].holderID(); got != idA {
			t.Fatalf("keyB's list got id %d, want keyA's old id %d: the test no longer reuses an id", got, idA)
		}
	}
	c := &hookChain{keyChain: keyChain{keys: []uint64{keyA, keyF, keyB}}, at: 2, hook: reuse}
	var res QueryResult
	tb.Query(c, "", &res)
	if c.hook != nil {
		t.Fatal("the walk ended before the hook ran")
	}
	// a holds all three blocks; b keyA (when looked up) and keyF; c keyB only.
	got := map[string]int{}
	for _, ih := range res.Instances {
		if ih.Instance <= "c" {
			got[ih.Instance] = ih.Max.Device
		}
	}
	want := map[string]int{"a": 48, "b": 32, "c": 0}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("device counts %v, want %v", got, want)
	}
	checkInvariants(t, tb)
}

// TestHolderSetsGrown checks that a remembered growth gives the same set a
// full intern would, and that a sweep forgets growths whose target it
// freed, even when the target's id is reissued to another list.
func TestHolderSetsGrown(t *testing.T) {
	var hs holderSets
	x, y, w := ownWord(1, bitDevice), ownWord(2, bitDevice), ownWord(3, bitLocal)
	a := hs.intern(x, []pair{y})
	b := hs.internGrown(a, w.own, x, []pair{y, w})
	if again := hs.internGrown(a, w.own, x, []pair{w, y}); again != b {
		t.Fatalf("remembered growth gave %d, first time %d", again, b)
	}
	if full := hs.intern(w, []pair{y, x}); full != b {
		t.Fatalf("full intern gave %d, growth %d", full, b)
	}
	for range 3 {
		hs.release(b) // b unreferenced, still interned
	}
	// Sweep b away with other unreferenced lists, keeping a, then intern
	// new lists until b's id is reissued.
	for i := 0; hs.epoch == 0 && i <= 2*minSweep; i++ {
		hs.release(hs.intern(x, []pair{ownWord(OwnerID(100+i), bitDisk)}))
	}
	if hs.epoch == 0 {
		t.Fatal("no sweep")
	}
	for i := 0; i < 4*minSweep; i++ {
		if id := hs.intern(x, []pair{ownWord(OwnerID(1000+i), bitDisk)}); id == b {
			break
		}
	}
	got := hs.internGrown(a, w.own, x, []pair{y, w})
	want := []uint32{x.own, y.own, w.own}
	slices.Sort(want)
	if words := hs.wordsOf(got); !slices.Equal(words, want) {
		t.Fatalf("growth after a sweep gave list %d = %x, want %x", got, words, want)
	}
}
