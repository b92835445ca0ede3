package index

import (
	"testing"
)

// sharedCount is the reference count of key's holder in shared tier, 0
// without one.
func sharedCount(tb *Table, tier Tier, key uint64) uint32 {
	h := mix(key)
	s := tb.stripeFor(h)
	s.mu.RLock()
	defer s.mu.RUnlock()
	idx := s.find(key, h)
	if idx < 0 {
		return 0
	}
	b := &s.blocks[idx]
	k := s.findShared(b, sharedTierBit(tier))
	if k == noPair {
		return 0
	}
	return s.pairAt(b, k).aux
}

// TestSharedRefEvictedReleaseIsNoOp: an eviction takes a shared holder with
// all its owned references, hands each to its owner's Orphans and gives
// back their bytes; releasing an evicted reference then leaves alone the
// holder a later reference took on the same key, and releasing that one
// removes it, so no holder is left that no reference can remove.
func TestSharedRefEvictedReleaseIsNoOp(t *testing.T) {
	ix := New(Options{Stripes: 2, MemoryLimit: 1 << 40})
	defer ix.Close()
	tb := ix.EnsureTable(testCtx)
	base := ix.MemoryBytes()
	var orphans Orphans
	a := newSharedRef("a", CPUShare, 7, 500, &orphans)
	b := newSharedRef("b", CPUShare, 7, 300, &orphans)
	if !tb.Acquire(a) || !tb.Acquire(b) {
		t.Fatal("acquire refused on a live table")
	}
	if tb.Acquire(a) {
		t.Fatal("a reference was taken twice")
	}
	if got := sharedCount(tb, CPUShare, 7); got != 2 {
		t.Fatalf("count after two references = %d, want 2", got)
	}
	if err := accountErr(tb); err != nil {
		t.Fatal(err)
	}
	evictUpTo(ix, ix.bud.epoch.Add(1)-1)
	if tb.Has(7) {
		t.Fatal("key 7 survived its eviction")
	}
	if !a.Gone() || !b.Gone() {
		t.Fatalf("after eviction: a gone %v, b gone %v", a.Gone(), b.Gone())
	}
	got := orphans.Drain()
	if len(got) != 2 || got[0].Owner == got[1].Owner {
		t.Fatalf("orphans = %v, want a and b", got)
	}
	if err := accountErr(tb); err != nil {
		t.Fatal(err)
	}
	c := newSharedRef("c", CPUShare, 7, 100, &orphans)
	tb.Acquire(c)
	tb.Release(a) // evicted: must not take c's count
	tb.releaseShared(CPUShare, 7)
	if got := sharedCount(tb, CPUShare, 7); got != 1 {
		t.Fatalf("after releasing an evicted reference and an anonymous one, count = %d, want c's 1", got)
	}
	if tb.Acquire(a) {
		t.Fatal("an evicted reference was taken again")
	}
	tb.Release(c)
	tb.Release(c)
	if tb.Has(7) {
		t.Fatal("key 7 kept a holder after its last reference was released")
	}
	tb.flushAll()
	if got := ix.MemoryBytes(); got != base {
		t.Fatalf("after releasing everything %d bytes are accounted, want %d", got, base)
	}
	if orphans.Len() != 0 {
		t.Fatalf("%d orphans from releases, want none", orphans.Len())
	}
}

// TestSharedRefDropOrphans: dropping a table orphans its references, and
// every later operation on them is a no-op.
func TestSharedRefDropOrphans(t *testing.T) {
	ix := New(Options{Stripes: 2})
	defer ix.Close()
	tb := ix.EnsureTable(testCtx)
	var orphans Orphans
	refs := []*SharedRef{newSharedRef(1, Disk, 1, 10, &orphans), newSharedRef(2, CPUShare, 2, 10, &orphans)}
	for _, r := range refs {
		tb.Acquire(r)
	}
	ix.DropTable(testCtx)
	if orphans.Len() != 2 || !refs[0].Gone() || !refs[1].Gone() {
		t.Fatalf("after the drop %d orphans, gone %v %v; want both", orphans.Len(), refs[0].Gone(), refs[1].Gone())
	}
	tb.Release(refs[0])
	if tb.Acquire(newSharedRef(3, Disk, 3, 10, nil)) {
		t.Fatal("a dropped table took a reference")
	}
}

// flushAll passes every stripe's unflushed change on to the budget.
func (t *Table) flushAll() {
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		s.flush()
		s.mu.Unlock()
	}
}
