package index

// hybridScratch is the query's working memory for hybrid owners.
type hybridScratch struct {
	chain  sliceChain
	ord    []int32  // by span position: hybrid ordinal, -1 for a dense owner
	words  []uint32 // ordinal*len(keys) + key: the owner's group word
	shared []uint8  // by key: shared tier bits (group 0)
	// sharedG is by key the shared references' other groups: CPUShare's
	// in the low groupBits, Disk's above (sharedGroupWord).
	sharedG []uint32
	masks   []uint32
}

// sliceChain replays keys already computed, for the dense walk of a
// table with hybrid owners, which needs every key of the prompt anyway.
type sliceChain struct {
	keys []uint64
	covs []int
	pos  int
}

func (c *sliceChain) Next() (uint64, int, bool) {
	if c.pos >= len(c.keys) {
		return 0, 0, false
	}
	c.pos++
	return c.keys[c.pos-1], c.covs[c.pos-1], true
}

func (c *sliceChain) Ready() int { return len(c.keys) - c.pos }

// hasHybrid reports whether any owner of the span has a hybrid layout.
func hasHybrid(ls []*hybridLayout) bool {
	for _, l := range ls {
		if l != nil {
			return true
		}
	}
	return false
}

// drain reads the whole chain into the scratch's slice chain. A hybrid
// rule may look past the first block nobody holds (a sliding window or a
// Mamba state further on), so the prompt is hashed to its end.
func (hy *hybridScratch) drain(chain Chain) *sliceChain {
	c := &hy.chain
	c.keys, c.covs, c.pos = c.keys[:0], c.covs[:0], 0
	for {
		k, cov, ok := chain.Next()
		if !ok {
			return c
		}
		c.keys, c.covs = append(c.keys, k), append(c.covs, cov)
	}
}

// hybridCounts overwrites the counts of the span's hybrid owners with
// their layouts' rules, evaluated per cumulative tier on the groups that
// hold each key of the drained chain.
func (t *Table) hybridCounts(v *ownerView, lo, n int, sc *queryScratch) {
	hy := &sc.hy
	keys := hy.chain.keys
	nk := len(keys)
	hy.ord = resize(hy.ord, n)
	nh := 0
	for f := range n {
		hy.ord[f] = -1
		if v.hybrid[lo+f] != nil {
			hy.ord[f] = int32(nh)
			nh++
		}
	}
	hy.words = resize(hy.words, nh*nk)
	clear(hy.words)
	hy.shared, hy.sharedG = resize(hy.shared, nk), resize(hy.sharedG, nk)
	clear(hy.shared)
	clear(hy.sharedG)
	t.readGroups(v, keys, lo, n, hy)
	total := 0
	for _, c := range hy.chain.covs {
		total += c
	}
	for f := range n {
		o := int(hy.ord[f])
		if o < 0 {
			continue
		}
		counts, _ := v.hybrid[lo+f].answer(hy.words[o*nk:(o+1)*nk], hy.shared, hy.sharedG, &hy.masks, total)
		sc.cnt[f] = counts
	}
}

// readGroups fills hy.words and hy.shared from the blocks of keys, one
// stripe read lock per key.
func (t *Table) readGroups(v *ownerView, keys []uint64, lo, n int, hy *hybridScratch) {
	nk := len(keys)
	for j, key := range keys {
		h := mix(key)
		s := t.stripeFor(h)
		s.mu.RLock()
		if idx := s.find(key, h); idx >= 0 {
			b := &s.blocks[idx]
			hy.note(v, s, b.first, j, nk, lo, n)
			for _, p := range s.overflow(b) {
				hy.note(v, s, p, j, nk, lo, n)
			}
		}
		if s.sharedGroups != nil {
			hy.sharedG[j] = s.sharedGroups[key].word()
		}
		s.mu.RUnlock()
	}
}

func (hy *hybridScratch) note(v *ownerView, s *stripe, p pair, j, nk, lo, n int) {
	if p.own == 0 {
		return
	}
	if p.id() == 0 {
		hy.shared[j] |= p.mask()
		return
	}
	f := v.position(p.id()) - lo
	if f < 0 || f >= n {
		return
	}
	if o := hy.ord[f]; o >= 0 {
		hy.words[int(o)*nk+j] = s.pairWord(p)
	}
}

// answer evaluates the layout per cumulative tier: tier T's count is the
// rule on the union of the tiers up to T, so counts stay cumulative (each
// rule only grows with presence). words are the owner's group words per
// key, shared the keys' shared tier bits, which count for group 0 (the only
// group Mooncake objects are indexed for). stops are the groups whose rule
// ended each tier's hit (-1: none did).
func (h *hybridLayout) answer(words []uint32, shared []uint8, sharedG []uint32, masks *[]uint32, total int) (counts [numTiers]int, stops [numTiers]int) {
	m := resize(*masks, len(words))
	*masks = m
	clear(m)
	p := presence{masks: m, hbs: h.hbs}
	for tier := Device; tier < numTiers; tier++ {
		for j, w := range words {
			switch tier {
			case Device:
				m[j] = tierGroups(w, Device)
			case CPULocal:
				m[j] |= tierGroups(w, CPULocal)
			case CPUShare:
				if shared[j]&bitShare != 0 {
					m[j] |= 1
				}
				m[j] |= sharedG[j] & groupTierMask
			case Disk:
				m[j] |= tierGroups(w, Disk) | sharedG[j]>>groupBits&groupTierMask
				if shared[j]&bitDisk != 0 {
					m[j] |= 1
				}
			}
		}
		counts[tier], stops[tier] = h.hit(p, total)
	}
	return counts, stops
}

// explainHybrid replaces the runs of the explained owners (positions in
// v.owners) that have hybrid layouts with their rules' answers, as
// hybridCounts gives /query.
func (t *Table) explainHybrid(v *ownerView, keys []uint64, tokens []int, owners []int, runs []OwnerRun) {
	var hy hybridScratch
	n := len(v.owners)
	hy.ord = make([]int32, n)
	for f := range hy.ord {
		hy.ord[f] = -1
	}
	nh := 0
	for _, f := range owners {
		if v.hybrid[f] != nil {
			hy.ord[f] = int32(nh)
			nh++
		}
	}
	if nh == 0 {
		return
	}
	nk := len(keys)
	hy.words, hy.shared, hy.sharedG = make([]uint32, nh*nk), make([]uint8, nk), make([]uint32, nk)
	t.readGroups(v, keys, 0, n, &hy)
	total := 0
	if nk > 0 {
		total = tokens[nk-1]
	}
	for i, f := range owners {
		o := int(hy.ord[f])
		if o < 0 {
			continue
		}
		l := v.hybrid[f]
		counts, stops := l.answer(hy.words[o*nk:(o+1)*nk], hy.shared, hy.sharedG, &hy.masks, total)
		r := &runs[i]
		r.Counts = TierCounts{counts[Device], counts[CPULocal], counts[CPUShare], counts[Disk]}
		r.Hybrid = &HybridRun{Layout: l.src, StopGroup: stops[Disk]}
		r.StopBlock, r.Reason = nk, PromptEnd
		if counts[Disk] < total {
			r.StopBlock, r.Reason = counts[Disk]/l.hbs, GroupRule
			if l.zero {
				r.StopBlock = 0
			}
		}
	}
}
