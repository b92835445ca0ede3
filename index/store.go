package index

import "slices"

// Put is one (block, tier, group) an engine owner holds, as Store records it
// and Remove retracts it.
type Put struct {
	Key uint64
	// Tier is Device, CPULocal or Disk; the shared tiers are never an
	// engine owner's, so Store and Remove ignore them.
	Tier Tier
	// Group is the KV-cache group (docs/hybrid.md), 0 for a dense model;
	// a group outside [0, MaxGroups) is ignored.
	Group int
	// Replace makes the owner's holding of Key exactly Tier (Store) or
	// nothing (Remove), whatever tiers and groups it held before:
	// producers re-report a block with its current tier, last write wins,
	// which is how a demotion from engine memory to host memory arrives.
	// Producers have no KV-cache groups, so a replaced key is held in
	// group 0 and Group is not looked at.
	Replace bool
}

func engineTierBit(tier Tier) uint32 {
	switch tier {
	case Device, CPULocal, Disk:
		return 1 << tier
	}
	return 0
}

func sharedTierBit(tier Tier) uint32 {
	switch tier {
	case CPUShare, Disk:
		return 1 << tier
	}
	return 0
}

// Store records that engine owner id holds p. It is idempotent, as
// replayed or re-asserted events require, and a no-op for an unknown or
// removed owner. hint is the block's slab index plus one (locate.go), 0
// when nothing was stored: ingest keeps it for the verified links without
// looking the block up again. added reports that the owner did not hold
// p.Key before.
func (t *Table) Store(id OwnerID, p Put) (hint uint32, added bool) {
	if p.Replace {
		return t.replace(id, p.Tier, p.Key)
	}
	bit := engineTierBit(p.Tier)
	if bit == 0 || uint(p.Group) >= MaxGroups {
		return 0, false
	}
	g, key := uint(p.Group), p.Key
	s, idx := t.lockInsert(id, key)
	if s == nil {
		return 0, false
	}
	b := &s.blocks[idx]
	k := s.findEngine(b, id)
	var before uint8
	var pos uint32
	if k != noPair {
		p := s.pairAt(b, k)
		before, pos = p.mask(), p.aux
		if p.own&bit == 0 {
			p.own |= bit
			s.reintern(b)
		}
	} else {
		pos = s.ownerAppend(id, idx)
		s.addPair(b, pair{own: uint32(id)<<maskBits | bit, aux: pos})
	}
	// Group 0 of an owner that never stored another group costs nothing
	// beyond the dense store.
	if g != 0 || s.groups != nil {
		s.groupStored(id.slot(), pos, before, p.Tier, g)
	}
	s.setMask(b, b.mask()|uint8(bit))
	if k == noPair {
		t.notify(KeyAdded, id, key)
	}
	s.mu.Unlock()
	return uint32(idx + 1), k == noPair
}

// replace is Store with Put.Replace.
func (t *Table) replace(id OwnerID, tier Tier, key uint64) (hint uint32, added bool) {
	bit := engineTierBit(tier)
	if bit == 0 {
		return 0, false
	}
	s, idx := t.lockInsert(id, key)
	if s == nil {
		return 0, false
	}
	b := &s.blocks[idx]
	if k := s.findEngine(b, id); k != noPair {
		p, g := s.pairAt(b, k), s.groupsOf(id.slot())
		if p.mask() != uint8(bit) || (g != nil && g[p.aux] != 0) {
			p.own = p.own&^tierBits | bit
			if g != nil {
				g[p.aux] = 0 // group 0 alone, in the one tier now held
			}
			s.settle(idx, b)
		}
		s.mu.Unlock()
		return uint32(idx + 1), false
	}
	s.addPair(b, pair{own: uint32(id)<<maskBits | bit, aux: s.ownerAppend(id, idx)})
	s.setMask(b, b.mask()|uint8(bit))
	t.notify(KeyAdded, id, key)
	s.mu.Unlock()
	return uint32(idx + 1), true
}

// lockInsert write-locks key's stripe for a store by owner id and returns
// it with the slab index of key's block, created empty if absent; s is
// nil, and nothing is locked, when the table is dropped or id is not
// registered.
func (t *Table) lockInsert(id OwnerID, key uint64) (s *stripe, idx int) {
	t.admit()
	h := mix(key)
	s = t.stripeFor(h)
	s.mu.Lock()
	if s.dead || !t.registered(id) {
		s.mu.Unlock()
		return nil, -1
	}
	t.changing(s)
	return s, s.findOrInsert(key, h)
}

// lockBlock write-locks key's stripe and returns it with the block's slab
// index, for removals (which never create a block); s is nil, and nothing
// is locked, when the table is dropped or the key is absent.
func (t *Table) lockBlock(key uint64) (s *stripe, idx int) {
	h := mix(key)
	s = t.stripeFor(h)
	s.mu.Lock()
	if !s.dead {
		if idx = s.find(key, h); idx >= 0 {
			t.changing(s)
			return s, idx
		}
	}
	s.mu.Unlock()
	return nil, -1
}

// Remove retracts p from engine owner id: its tier stays held while
// another of the owner's groups still holds the key there. Anything absent
// is a no-op, since removals may refer to blocks the index never saw.
// removed reports that something was retracted.
func (t *Table) Remove(id OwnerID, p Put) (removed bool) {
	if p.Replace {
		return t.evict(id, p.Key)
	}
	bit := engineTierBit(p.Tier)
	if bit == 0 || uint(p.Group) >= MaxGroups {
		return false
	}
	s, idx := t.lockBlock(p.Key)
	if s == nil {
		return false
	}
	defer s.mu.Unlock()
	b := &s.blocks[idx]
	k := s.findEngine(b, id)
	if k == noPair {
		return false
	}
	pr := s.pairAt(b, k)
	if pr.own&bit == 0 {
		return false
	}
	if p.Group != 0 || s.groups != nil {
		held, changed := s.groupRemoved(id.slot(), pr.aux, pr.mask(), p.Tier, uint(p.Group))
		if !changed || held {
			return changed
		}
	}
	pr.own &^= bit
	gone := pr.mask() == 0
	if gone {
		s.ownerRemoveAt(id, pr.aux)
		s.removePair(b, k)
	}
	s.settle(idx, b)
	if gone {
		t.notify(KeyEvicted, id, p.Key)
	}
	return true
}

// evict is Remove with Put.Replace: key leaves every tier of the owner.
func (t *Table) evict(id OwnerID, key uint64) bool {
	s, idx := t.lockBlock(key)
	if s == nil {
		return false
	}
	b := &s.blocks[idx]
	k := s.findEngine(b, id)
	if k == noPair {
		s.mu.Unlock()
		return false
	}
	s.ownerRemoveAt(id, s.pairAt(b, k).aux)
	s.removePair(b, k)
	s.settle(idx, b)
	t.notify(KeyEvicted, id, key)
	s.mu.Unlock()
	return true
}

// ClearOwner retracts the given tiers of everything engine owner id holds:
// vLLM's AllBlocksCleared clears Device, SGLang's all tiers, a stale source
// AllEngineTiers. The owner stays registered. Cost is proportional to what
// the owner holds, through its per-stripe reverse lists.
func (t *Table) ClearOwner(id OwnerID, tiers TierMask) {
	m := uint8(tiers) & engineBit
	if m == 0 {
		return
	}
	t.clearOwner(id, m, nil)
	t.notify(OwnerCleared, id, 0)
}

// clearOwner removes tiers m from every block id holds, one stripe at a time
// and at most clearBudget blocks per write-lock hold, so queries and other
// writers get in between. After each hold it calls between, when set (the
// reaper's pacing); between returning false abandons the clear.
func (t *Table) clearOwner(id OwnerID, m uint8, between func() bool) {
	for i := range t.stripes {
		s := &t.stripes[i]
		for from := -1; from != 0; {
			s.mu.Lock()
			if s.dead {
				from = 0
			} else {
				t.changing(s)
				from = s.clearOwner(id, m, from, clearBudget)
			}
			s.mu.Unlock()
			if between != nil && !between() {
				return
			}
		}
	}
}

// storeBatch records that engine owner id holds each keys[i] in the engine
// tiers of tiers[i] with group word words[i] (0 for group 0 alone; words
// nil for none), as a cut encodes them. It takes each stripe's lock once
// for all its keys, so restoring a snapshot costs a hash-table insert per
// entry, not a lock round trip per tier.
func (t *Table) storeBatch(id OwnerID, keys []uint64, tiers []TierMask, words []uint32) {
	if len(keys) == 0 {
		return
	}
	// Bucket the entries by stripe (a counting sort).
	n := len(t.stripes)
	start := make([]int, n+1)
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = mix(k)
		start[t.stripeIndex(hs[i])+1]++
	}
	for i := 1; i <= n; i++ {
		start[i] += start[i-1]
	}
	order := make([]int32, len(keys))
	fill := slices.Clone(start[:n])
	for i := range keys {
		si := t.stripeIndex(hs[i])
		order[fill[si]] = int32(i)
		fill[si]++
	}
	for si := range n {
		if start[si] == start[si+1] {
			continue
		}
		t.admit()
		s := &t.stripes[si]
		s.mu.Lock()
		if s.dead || !t.registered(id) {
			s.mu.Unlock()
			return
		}
		t.changing(s)
		// Size the stripe for the whole batch once, instead of growing
		// it step by step through every resize on the way.
		if want := s.nlive + start[si+1] - start[si]; (want+s.tombs)*5 > len(s.slots)*4 {
			s.resize(want)
			s.blocks = slices.Grow(s.blocks, max(0, want-len(s.blocks)))
			s.publishBlocks()
		}
		for _, i := range order[start[si]:start[si+1]] {
			m := uint32(tiers[i]) & engineBit
			if m == 0 {
				continue
			}
			idx := s.findOrInsert(keys[i], hs[i])
			b := &s.blocks[idx]
			var before uint8
			var pos uint32
			if k := s.findEngine(b, id); k != noPair {
				p := s.pairAt(b, k)
				before, pos = p.mask(), p.aux
				if p.own&m != m {
					p.own |= m
					s.reintern(b)
				}
			} else {
				pos = s.ownerAppend(id, idx)
				s.addPair(b, pair{own: uint32(id)<<maskBits | m, aux: pos})
			}
			if words != nil && words[i] != 0 {
				s.groupsRestored(id.slot(), pos, before, uint8(m), words[i])
			} else if s.groups != nil {
				s.groupsRestored(id.slot(), pos, before, uint8(m), explicitWord(0, uint8(m)))
			}
			s.setMask(b, b.mask()|uint8(m))
		}
		s.mu.Unlock()
	}
}
