package index

import "slices"

// The KV-cache group dimension (docs/hybrid.md). A hybrid model's engine
// keeps one cache per group of layers and publishes each group's blocks
// with its group index; a key is then present per (owner, tier, group).
//
// Storage keeps the dense layout untouched: a block's pair still carries
// the owner's tiers, now the union over its groups, so the dense walk and
// every count are as before. Only an owner that stores a group other than
// 0 in a stripe gets, in that stripe, a word per held block beside its
// reverse list (stripe.groups[slot][pos], pos being the pair's aux): the
// groups holding the block, per engine tier. A word of 0 means "group 0 in
// each of the pair's tiers", so a list is born all zeros and an owner's
// blocks stored before its first other group need no rewrite. The word is
// 4 bytes per (block, owner) for hybrid owners only; a two-group model
// whose groups share keys (gpt-oss) keeps one block and one pair per key.

// MaxGroups is how many KV-cache groups an owner can have: a group word
// holds groupBits bits for each of the three engine tiers. Events of a
// higher group are rejected, and an owner that announced one answers 0
// (its layout cannot be evaluated, so any answer could be too high).
const MaxGroups = 10

const groupBits = 10

// groupShift is where tier t's group bits start in a word; CPUShare, never
// an engine tier, has none.
func groupShift(t Tier) uint {
	switch t {
	case CPULocal:
		return groupBits
	case Disk:
		return 2 * groupBits
	}
	return 0
}

const groupTierMask = 1<<groupBits - 1

// tierGroups returns the groups of tier t in word w.
func tierGroups(w uint32, t Tier) uint32 { return w >> groupShift(t) & groupTierMask }

// explicitWord returns w, or for the implicit word 0 the word of a pair
// with tier mask m: group 0 in each of its engine tiers.
func explicitWord(w uint32, m uint8) uint32 {
	if w != 0 {
		return w
	}
	for _, t := range [...]Tier{Device, CPULocal, Disk} {
		if m&(1<<t) != 0 {
			w |= 1 << groupShift(t)
		}
	}
	return w
}

// tierWordMask is the word bits of every tier in tier mask m.
func tierWordMask(m uint8) uint32 {
	var w uint32
	for _, t := range [...]Tier{Device, CPULocal, Disk} {
		if m&(1<<t) != 0 {
			w |= groupTierMask << groupShift(t)
		}
	}
	return w
}

func (s *stripe) groupsOf(sl int) []uint32 {
	if sl < len(s.groups) {
		return s.groups[sl]
	}
	return nil
}

// groupWordBytes is the accounted cost of a group word (budget.go).
const groupWordBytes = 4

// groupsAppend mirrors ownerAppend: a new pair's word is implicit.
func (s *stripe) groupsAppend(sl int) {
	if g := s.groupsOf(sl); g != nil {
		s.groups[sl] = append(g, 0)
		s.charge(groupWordBytes)
	}
}

// groupsRemoveAt mirrors ownerRemoveAt's move of the last entry into pos.
func (s *stripe) groupsRemoveAt(sl int, pos, last uint32) {
	g := s.groupsOf(sl)
	if g == nil {
		return
	}
	g[pos] = g[last]
	g = g[:last]
	s.charge(-groupWordBytes)
	if cap(g) > 64 && len(g)*4 < cap(g) {
		g = append([]uint32(nil), g...)
	}
	s.groups[sl] = g
}

// groupsTruncate mirrors clearOwner's cut of the reverse list to n entries.
func (s *stripe) groupsTruncate(sl, n int) {
	if g := s.groupsOf(sl); g != nil {
		s.charge(-groupWordBytes * int64(len(g)-n))
		if n == 0 {
			s.groups[sl] = nil
		} else {
			s.groups[sl] = g[:n]
		}
	}
}

// groupsClearTiers drops tiers m from the word at pos (ClearOwner).
func (s *stripe) groupsClearTiers(sl int, pos uint32, m uint8) {
	if g := s.groupsOf(sl); g != nil && g[pos] != 0 {
		g[pos] &^= tierWordMask(m)
	}
}

// groupStored records group gr in tier t for the pair at pos of slot sl,
// whose tier mask was before (0 for a new pair). The first group other
// than 0 gives the slot its word list, all implicit.
func (s *stripe) groupStored(sl int, pos uint32, before uint8, t Tier, gr uint) {
	g := s.groupsOf(sl)
	if g == nil {
		if gr == 0 {
			return
		}
		if sl >= len(s.groups) {
			groups := make([][]uint32, max(sl+1, len(s.owned)))
			copy(groups, s.groups)
			s.groups = groups
		}
		g = make([]uint32, len(s.owned[sl]))
		s.groups[sl] = g
		s.charge(groupWordBytes * int64(len(g)))
	}
	g[pos] = explicitWord(g[pos], before) | 1<<(groupShift(t)+gr)
}

// groupRemoved drops group gr in tier t from the pair at pos (tier mask m,
// holding t). changed is false when the group did not hold the key there;
// held is whether another group still does, so the tier stays.
func (s *stripe) groupRemoved(sl int, pos uint32, m uint8, t Tier, gr uint) (held, changed bool) {
	g := s.groupsOf(sl)
	if g == nil {
		return false, gr == 0
	}
	w := explicitWord(g[pos], m)
	bit := uint32(1) << (groupShift(t) + gr)
	if w&bit == 0 {
		return false, false
	}
	w &^= bit
	g[pos] = w
	return tierGroups(w, t) != 0, true
}

// pairWord returns the explicit group word of engine pair p of slot sl.
func (s *stripe) pairWord(p pair) uint32 {
	w := uint32(0)
	if g := s.groupsOf(p.id().slot()); g != nil && int(p.aux) < len(g) {
		w = g[p.aux]
	}
	return explicitWord(w, p.mask())
}

// cloneGroups deep-copies a stripe's group word lists, for a cut.
func cloneGroups(g [][]uint32) [][]uint32 {
	if g == nil {
		return nil
	}
	out := make([][]uint32, len(g))
	for i, l := range g {
		if l != nil {
			out[i] = slices.Clone(l)
		}
	}
	return out
}

// cutWord is engine pair p's group word in groups, 0 when it holds group 0
// alone (in each of its tiers), as a cut encodes it.
func cutWord(groups [][]uint32, p pair) uint32 {
	sl := p.id().slot()
	if sl >= len(groups) || int(p.aux) >= len(groups[sl]) {
		return 0
	}
	w := groups[sl][p.aux]
	if w == explicitWord(0, p.mask()) {
		return 0
	}
	return w
}

// wordCovers reports whether word w holds some group in every tier of m.
func wordCovers(w uint32, m uint8) bool {
	for _, t := range [...]Tier{Device, CPULocal, Disk} {
		if m&(1<<t) != 0 && tierGroups(w, t) == 0 {
			return false
		}
	}
	return true
}

// groupsRestored merges word w, for tiers m, into the pair at pos whose
// tiers were before (storeBatch).
func (s *stripe) groupsRestored(sl int, pos uint32, before, m uint8, w uint32) {
	g := s.groupsOf(sl)
	if g == nil {
		if w == explicitWord(0, m) {
			return // group 0 alone: the implicit word
		}
		if sl >= len(s.groups) {
			groups := make([][]uint32, max(sl+1, len(s.owned)))
			copy(groups, s.groups)
			s.groups = groups
		}
		g = make([]uint32, len(s.owned[sl]))
		s.groups[sl] = g
		s.charge(groupWordBytes * int64(len(g)))
	}
	g[pos] = explicitWord(g[pos], before) | w
}
