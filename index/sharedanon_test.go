package index

// Anonymous shared counts, for tests that exercise the shared holders
// without owning references: the service only takes SharedRefs.

// acquireShared adds one anonymous reference to key in a shared tier
// (CPUShare or Disk).
func (t *Table) acquireShared(tier Tier, key uint64) {
	bit := sharedTierBit(tier)
	if bit == 0 {
		return
	}
	t.admit()
	h := mix(key)
	s := t.stripeFor(h)
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return
	}
	t.acquireSharedLocked(s, bit, key, h)
	s.mu.Unlock()
}

// releaseShared drops one reference taken by acquireShared; the key leaves
// the shared tier with its last reference and never goes below zero.
func (t *Table) releaseShared(tier Tier, key uint64) {
	bit := sharedTierBit(tier)
	if bit == 0 {
		return
	}
	s, idx := t.lockBlock(key)
	if s == nil {
		return
	}
	defer s.mu.Unlock()
	b := &s.blocks[idx]
	k := s.findShared(b, bit)
	if k == noPair {
		return
	}
	p := s.pairAt(b, k)
	if p.aux <= uint32(s.refsHeld(refKey{key, bit})) {
		return // the rest are owned references (Release)
	}
	if p.aux--; p.aux == 0 {
		s.removePair(b, k)
		s.settle(idx, b)
		t.notify(KeyEvicted, 0, key)
	}
}

// newSharedRef is a reference of group 0, made with Init.
func newSharedRef(owner any, tier Tier, key uint64, cost int64, orphans *Orphans) *SharedRef {
	r := &SharedRef{}
	r.Init(owner, tier, 0, key, cost, orphans)
	return r
}

// added is Store's added result alone.
func added(_ uint32, ok bool) bool { return ok }

// acquireSharedGroup adds an anonymous count of KV-cache group g (group 0
// is acquireShared), as a reference of that group would.
func (t *Table) acquireSharedGroup(tier Tier, g int, key uint64) {
	if g == 0 {
		t.acquireShared(tier, key)
		return
	}
	r := &SharedRef{}
	r.Init(nil, tier, g, key, 0, nil)
	t.Acquire(r)
}

// releaseSharedGroup drops one count acquireSharedGroup took.
func (t *Table) releaseSharedGroup(tier Tier, g int, key uint64) {
	if g == 0 {
		t.releaseShared(tier, key)
		return
	}
	r := &SharedRef{}
	r.Init(nil, tier, g, key, 0, nil)
	r.held = true // group counts are anonymous: any reference releases one
	t.Release(r)
}
