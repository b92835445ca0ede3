package index

// hybridScratch is the query's working memory for hybrid owners.
type hybridScratch struct {
	chain recChain
	ord   []int32  // by span position: hybrid ordinal, -1 for a dense owner
	words []uint32 // key*nh + ordinal: the owner's group word, key-major
	nh    int      // hybrid owners reported
	// slotOrd and slotID map a pair's owner slot to its hybrid ordinal
	// (-1: none) and the owner id that must be there (generation check).
	slotOrd []int32
	slotID  []uint32
	// hs, order and start group the keys by stripe (readGroups).
	hs     []uint64
	order  []int32
	start  []int
	shared []uint8 // by key: shared tier bits (group 0)
	// sharedG is by key the shared references' other groups: CPUShare's
	// in the low groupBits, Disk's above (sharedGroupWord).
	sharedG []uint32
	masks   []uint32
}

// recChain passes a query's chain to the dense walk and records the keys
// it hashes, for the hybrid owners' rules; keeping Ready, it keeps the
// walk's batched path for keys the memo serves.
type recChain struct {
	src   Chain
	ready ReadyChain
	batch BatchChain
	keys  []uint64
	covs  []int
}

func (c *recChain) Next() (uint64, int, bool) {
	k, cov, ok := c.src.Next()
	if ok {
		c.keys, c.covs = append(c.keys, k), append(c.covs, cov)
	}
	return k, cov, ok
}

// recBatch is recChain over a BatchChain, passing its batches on.
type recBatch struct{ *recChain }

// TakeReady passes the source chain's batch on (BatchChain), recording
// its keys.
func (c recBatch) TakeReady(n int, keys []uint64, covs []int, hints []uint32) ([]uint64, []int, []uint32) {
	from := len(keys)
	keys, covs, hints = c.batch.TakeReady(n, keys, covs, hints)
	c.keys, c.covs = append(c.keys, keys[from:]...), append(c.covs, covs[from:]...)
	return keys, covs, hints
}

func (c *recChain) Ready() int {
	if c.ready == nil {
		return 0
	}
	return c.ready.Ready()
}

// rest records the chain's remaining keys.
func (c *recChain) rest() {
	for {
		if _, _, ok := c.Next(); !ok {
			return
		}
	}
}

// record starts recording chain.
func (hy *hybridScratch) record(chain Chain) Chain {
	c := &hy.chain
	c.src, c.keys, c.covs = chain, c.keys[:0], c.covs[:0]
	c.ready, _ = chain.(ReadyChain)
	if c.batch, _ = chain.(BatchChain); c.batch != nil {
		return recBatch{c}
	}
	return c
}

// spanHybrid reports whether any owner of the span has a hybrid layout.
func spanHybrid(ls []*hybridLayout) bool {
	for _, l := range ls {
		if l != nil {
			return true
		}
	}
	return false
}

// hybridCounts overwrites the counts of the span's hybrid owners with
// their layouts' rules, evaluated per cumulative tier on the groups that
// hold each key of the drained chain.
func (t *Table) hybridCounts(v *ownerView, lo, n int, sc *queryScratch) {
	hy := &sc.hy
	// When every hybrid owner has a full-attention group, its hit is at
	// most its union prefix, which the dense walk just counted: keys past
	// the longest of those are never needed, and a prompt nobody holds
	// costs what a dense one does. Otherwise a sliding window or a Mamba
	// state may lie anywhere: the prompt is hashed to its end.
	// Shared references of groups other than 0 are not in the blocks'
	// pairs the walk reads, so once a table has any, there is no bound.
	bound, full := 0, !t.sharedGroups.Load()
	for f := range n {
		if l := v.hybrid[lo+f]; l != nil {
			full = full && (l.zero || l.hasFull())
			bound = max(bound, sc.cnt[f][Disk])
		}
	}
	if !full {
		hy.chain.rest()
	}
	keys := hy.chain.keys
	nk := len(keys)
	if full {
		covered := 0
		for i, c := range hy.chain.covs {
			if covered+c > bound {
				nk = i
				break
			}
			covered += c
		}
		keys = keys[:nk]
	}
	hy.ord = resize(hy.ord, n)
	nh := 0
	for f := range n {
		hy.ord[f] = -1
		if v.hybrid[lo+f] != nil {
			hy.ord[f] = int32(nh)
			nh++
		}
	}
	hy.nh = nh
	hy.words = resize(hy.words, nh*nk)
	clear(hy.words)
	hy.mapSlots(v, lo, n)
	hy.shared, hy.sharedG = resize(hy.shared, nk), resize(hy.sharedG, nk)
	clear(hy.shared)
	clear(hy.sharedG)
	t.readGroups(v, keys, lo, n, hy)
	total := prefixTokens(hy.chain.covs[:nk])
	prev := -1 // the last hybrid owner evaluated
	for f := range n {
		o := int(hy.ord[f])
		if o < 0 {
			continue
		}
		// Replicas holding a prompt alike (the same cached system
		// prompt, say) have equal columns; comparing one costs less
		// than running the rules again.
		if prev >= 0 && v.hybrid[lo+prev].sameRules(v.hybrid[lo+f]) && hy.sameColumn(int(hy.ord[prev]), o, nk) {
			sc.cnt[f] = sc.cnt[prev]
			continue
		}
		counts, _ := v.hybrid[lo+f].answer(hy.words, o, nh, nk, hy.shared, hy.sharedG, &hy.masks, total)
		sc.cnt[f] = counts
		prev = f
	}
}

func prefixTokens(covs []int) int {
	n := 0
	for _, c := range covs {
		n += c
	}
	return n
}

// readGroups fills hy.words, hy.shared and hy.sharedG from the blocks of
// keys, stripe by stripe (one read lock per stripe touched, as walkReady).
func (t *Table) readGroups(v *ownerView, keys []uint64, lo, n int, hy *hybridScratch) {
	nk := len(keys)
	hy.hs, hy.order = resize(hy.hs, nk), resize(hy.order, nk)
	hy.start = resize(hy.start, len(t.stripes)+1)
	clear(hy.start)
	for j, k := range keys {
		h := mix(k)
		hy.hs[j] = h
		hy.start[t.stripeIndex(h)+1]++
	}
	for i := 1; i < len(hy.start); i++ {
		hy.start[i] += hy.start[i-1]
	}
	for j := range keys { // counting sort; start[s] ends at stripe s+1's start
		si := t.stripeIndex(hy.hs[j])
		hy.order[hy.start[si]] = int32(j)
		hy.start[si]++
	}
	slotOrd, slotID, words, nh := hy.slotOrd, hy.slotID, hy.words, hy.nh
	from := 0
	for si := range t.stripes {
		to := hy.start[si]
		if from == to {
			continue
		}
		s := &t.stripes[si]
		s.mu.RLock()
		for _, j32 := range hy.order[from:to] {
			j := int(j32)
			key := keys[j]
			if s.sharedGroups != nil {
				hy.sharedG[j] = s.sharedGroups[key].word()
			}
			idx := s.find(key, hy.hs[j])
			if idx < 0 {
				continue
			}
			b := &s.blocks[idx]
			ps := s.overflow(b)
			for k := -1; k < len(ps); k++ {
				p := b.first
				if k >= 0 {
					p = ps[k]
				}
				id := p.id()
				if id == 0 {
					if p.own != 0 {
						hy.shared[j] |= p.mask()
					}
					continue
				}
				sl := id.slot()
				if sl >= len(slotOrd) || slotOrd[sl] < 0 || slotID[sl] != uint32(id) {
					continue
				}
				w := uint32(0)
				if sl < len(s.groups) {
					if g := s.groups[sl]; int(p.aux) < len(g) {
						w = g[p.aux]
					}
				}
				words[j*nh+int(slotOrd[sl])] = explicitWord(w, p.mask())
			}
		}
		s.mu.RUnlock()
		from = to
	}
}

// mapSlots fills slotOrd and slotID for the span's hybrid owners.
func (hy *hybridScratch) mapSlots(v *ownerView, lo, n int) {
	hy.slotOrd = resize(hy.slotOrd, len(v.bySlot))
	hy.slotID = resize(hy.slotID, len(v.bySlot))
	for i := range hy.slotOrd {
		hy.slotOrd[i] = -1
	}
	for f := range n {
		if o := hy.ord[f]; o >= 0 {
			id := v.owners[lo+f].id
			hy.slotOrd[id.slot()], hy.slotID[id.slot()] = o, uint32(id)
		}
	}
}

// sameColumn reports whether hybrid owners a and b have equal group words
// at every key.
func (hy *hybridScratch) sameColumn(a, b, nk int) bool {
	for j := range nk {
		if hy.words[j*hy.nh+a] != hy.words[j*hy.nh+b] {
			return false
		}
	}
	return true
}

// answer evaluates the layout per cumulative tier: tier T's count is the
// rule on the union of the tiers up to T, so counts stay cumulative (each
// rule only grows with presence). words[j*stride+off] is the owner's
// group word at key j of nk, shared the keys' shared tier bits, which count for group 0 (the only
// group Mooncake objects are indexed for). stops are the groups whose rule
// ended each tier's hit (-1: none did).
func (h *hybridLayout) answer(words []uint32, off, stride, nk int, shared []uint8, sharedG []uint32, masks *[]uint32, total int) (counts [numTiers]int, stops [numTiers]int) {
	m := resize(*masks, nk)
	*masks = m
	p := presence{masks: m, hbs: h.hbs}
	for tier := Device; tier < numTiers; tier++ {
		// A tier that adds no group to any key answers as the one below
		// it: for vLLM, which publishes device only, the rules run once.
		changed := tier == Device
		for j := range nk {
			w := words[j*stride+off]
			var add uint32
			switch tier {
			case Device:
				m[j] = tierGroups(w, Device)
				continue
			case CPULocal:
				add = tierGroups(w, CPULocal)
			case CPUShare:
				add = sharedG[j] & groupTierMask
				if shared[j]&bitShare != 0 {
					add |= 1
				}
			case Disk:
				add = tierGroups(w, Disk) | sharedG[j]>>groupBits&groupTierMask
				if shared[j]&bitDisk != 0 {
					add |= 1
				}
			}
			if add&^m[j] != 0 {
				m[j] |= add
				changed = true
			}
		}
		if !changed {
			counts[tier], stops[tier] = counts[tier-1], stops[tier-1]
			continue
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
	hy.nh = nh
	hy.words, hy.shared, hy.sharedG = make([]uint32, nh*nk), make([]uint8, nk), make([]uint32, nk)
	hy.mapSlots(v, 0, n)
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
		counts, stops := l.answer(hy.words, o, nh, nk, hy.shared, hy.sharedG, &hy.masks, total)
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
