package index

// queryScratch is per-QueryResult working memory, so a reused result makes
// the walk allocation-free. Indices are positions within the queried span
// of the registration snapshot.
type queryScratch struct {
	alive []uint8 // tier bits whose prefix is still unbroken
	hold  []uint8 // engine tier bits held on the current block
	live  []int32 // owners with any alive tier
	cnt   []TierCounts
}

// extends[m] is the set of cumulative tiers a block extends for a holder
// whose (engine | shared) tier bits are m: every tier at or after the lowest
// held one, because tier t's count admits all tiers before it.
var extends = func() (tab [1 << maskBits]uint8) {
	for m := 1; m < len(tab); m++ {
		tab[m] = uint8(-(m & -m)) & tierBits
	}
	return
}()

// Query walks chain and reports, for every registered (instance, rank) —
// or only those of instance when it is not "" — the cumulative tier counts
// of the prompt's cached prefix. Shared tiers count for every owner. The
// walk stops as soon as no reported owner can extend any tier, so the lazy
// chain is never advanced past the first block nobody relevant holds. Only
// one stripe read lock is held at a time, and once res has grown to the
// answer's shape the call does not allocate.
func (t *Table) Query(chain Chain, instance string, res *QueryResult) {
	v := t.view.Load()
	i0, i1 := 0, len(v.insts)
	if instance != "" {
		i0, i1 = 0, 0
		for i, sp := range v.insts { // few instances; binary search gains nothing
			if sp.name == instance {
				i0, i1 = i, i+1
				break
			}
		}
	}
	if i0 == i1 {
		res.Instances = res.Instances[:0]
		return
	}
	lo, hi := v.insts[i0].lo, v.insts[i1-1].hi
	n := hi - lo
	sc := &res.scratch
	sc.alive = resize(sc.alive, n)
	sc.hold = resize(sc.hold, n)
	sc.live = resize(sc.live, n)
	sc.cnt = resize(sc.cnt, n)
	for f := range n {
		sc.alive[f] = tierBits
		sc.hold[f] = 0
		sc.live[f] = int32(f)
		sc.cnt[f] = TierCounts{}
	}
	t.walk(v, chain, lo, sc)

	res.Instances = resize(res.Instances, i1-i0)
	for i := i0; i < i1; i++ {
		sp := v.insts[i]
		ih := &res.Instances[i-i0]
		ih.Instance = sp.name
		ih.Max = TierCounts{}
		ih.Ranks = ih.Ranks[:0]
		for f := sp.lo; f < sp.hi; f++ {
			c := sc.cnt[f-lo]
			ih.Ranks = append(ih.Ranks, RankHits{Rank: v.owners[f].rank, TierCounts: c})
			ih.Max.Device = max(ih.Max.Device, c.Device)
			ih.Max.CPULocal = max(ih.Max.CPULocal, c.CPULocal)
			ih.Max.CPUShare = max(ih.Max.CPUShare, c.CPUShare)
			ih.Max.Disk = max(ih.Max.Disk, c.Disk)
		}
	}
}

// walk advances the chain block by block, updating sc for owners
// v.owners[lo:lo+len(sc.alive)].
func (t *Table) walk(v *ownerView, chain Chain, lo int, sc *queryScratch) {
	n := len(sc.alive)
	live := sc.live
	for len(live) > 0 {
		key, covered, ok := chain.Next()
		if !ok {
			break
		}
		h := mix(key)
		s := t.stripeFor(h)
		s.mu.RLock()
		idx := s.find(key, h)
		if idx < 0 {
			s.mu.RUnlock()
			break
		}
		b := &s.blocks[idx]
		var shared uint8
		if p := b.first; p.own != 0 {
			shared = sc.note(v, p, lo, n)
		}
		for _, p := range s.overflow(b) {
			shared |= sc.note(v, p, lo, n)
		}
		s.mu.RUnlock()

		for i := 0; i < len(live); {
			f := live[i]
			a := sc.alive[f] & extends[sc.hold[f]|shared]
			sc.hold[f] = 0
			sc.alive[f] = a
			if a == 0 {
				live[i] = live[len(live)-1]
				live = live[:len(live)-1]
				continue
			}
			c := &sc.cnt[f]
			switch {
			case a&bitDevice != 0:
				c.Device += covered
				fallthrough
			case a&bitLocal != 0:
				c.CPULocal += covered
				fallthrough
			case a&bitShare != 0:
				c.CPUShare += covered
				fallthrough
			default:
				c.Disk += covered
			}
			i++
		}
	}
}

// note records an engine pair's tiers for its owner if that owner is being
// reported and still alive, and returns a shared pair's tier bit.
func (sc *queryScratch) note(v *ownerView, p pair, lo, n int) uint8 {
	id := p.id()
	if id == 0 {
		return p.mask()
	}
	if int(id) < len(v.byID) {
		if f := int(v.byID[id]) - lo; f >= 0 && f < n && sc.alive[f] != 0 {
			sc.hold[f] |= p.mask()
		}
	}
	return 0
}

// resize returns s with length n, reusing its backing array (and the
// elements' own buffers beyond the old length) when large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return append(s[:cap(s)], make([]T, n-cap(s))...)
}
