package index

import (
	"math/bits"
	"slices"
)

// queryScratch is per-QueryResult working memory, so a reused result makes
// the walk allocation-free. Owners are numbered by their position f within
// the queried span of the registration snapshot and kept in bitsets: bit f
// of word f/64.
type queryScratch struct {
	// hold is, for the current block, which owners hold it in Device,
	// CPULocal and (engine) Disk.
	hold [3][]uint64
	// alive is, per cumulative tier, which owners' prefixes are unbroken.
	alive [numTiers][]uint64
	// cnt is filled in when an owner's tier prefix breaks (or at the end).
	cnt [][numTiers]int
	// ready is walkReady's working memory.
	ready readyScratch
	// lists is, by stripe, the last interned holder list the walk
	// resolved there (see holdersOf).
	lists []listMemo
	// hy is the working memory for owners with hybrid layouts.
	hy hybridScratch
}

// listMemo is one stripe's interned holder list and the holder sets it
// gave this query; epoch is the stripe's holderSets.epoch when it was read,
// so an id freed and reused since does not match.
type listMemo struct {
	id, epoch     uint32
	dev, loc, dsk uint64
	shared        uint8
}

// readyScratch holds a batch of keys a ReadyChain produced, grouped by
// stripe: order lists positions stripe by stripe, start[s] is where stripe
// s's positions begin, and held is each position's holder sets.
type readyScratch struct {
	keys, hs []uint64
	covs     []int
	hints    []uint32 // 0: none (BatchChain)
	start    []int
	order    []int32
	held     [][4]uint64 // dev, loc, dsk, shared bits | readyFound
}

// prefetchMinSlots is the stripe size from which walkReady asks for a
// batch's blocks ahead: about 24 KiB of slab and slots a stripe, 1.5 MiB
// over a table's 64, where lookups start to miss the CPU's caches. A
// table's prefetchMin starts here (tests lower it on their tables).
const prefetchMinSlots = 1024

// readyFound marks a position whose block exists, in held[i][3].
const readyFound = 1 << 8

// noBlockHeld starts the walks' "holder sets last cut with": equal to no
// block's, found (readyFound) or not (zero), so the first block always
// cuts.
var noBlockHeld = [4]uint64{3: ^uint64(0)}

// maxReadyBatch bounds a walkReady batch, so its scratch (about 60 bytes a
// key, kept with a pooled result) stays small even for a long prompt with a
// small block size; 1,024 keys still share each of 64 stripe locks 16 ways.
const maxReadyBatch = 1024

// Query walks chain and reports, for every registered (instance, rank) —
// or only those of instance when it is not "" — the cumulative tier counts
// of the prompt's cached prefix. Shared tiers count for every owner. The
// walk stops as soon as no reported owner can extend any tier, so the lazy
// chain is advanced at most one block (the look-ahead of walkKeys) past the
// first block nobody relevant holds. Only one stripe read lock is held at a
// time, and never while the chain hashes, and once res has grown to the
// answer's shape the call does not allocate.
func (t *Table) Query(chain Chain, instance string, res *QueryResult) {
	t.query(t.view.Load(), chain, instance, res)
}

// query is Query against the registration snapshot v.
func (t *Table) query(v *ownerView, chain Chain, instance string, res *QueryResult) {
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
	words := (n + 63) / 64
	for i := range sc.hold {
		sc.hold[i] = resize(sc.hold[i], words)
	}
	for t := range sc.alive {
		a := resize(sc.alive[t], words)
		for w := range a {
			a[w] = ^uint64(0)
		}
		if n%64 != 0 {
			a[words-1] = 1<<(n%64) - 1
		}
		sc.alive[t] = a
	}
	sc.cnt = resize(sc.cnt, n)
	hybrid := v.hybrid != nil && spanHybrid(v.hybrid[lo:hi])
	if hybrid {
		// The dense walk's union prefix bounds every full-attention
		// group's hit, so it runs for hybrid owners too, recording the
		// keys it hashes for their rules (hybrid_query.go).
		chain = sc.hy.record(chain)
	}
	if words == 1 {
		sc.lists = resize(sc.lists, len(t.stripes))
		clear(sc.lists)
		t.walkSmall(v, chain, lo, n, sc)
	} else {
		t.walk(v, chain, lo, n, sc)
	}
	if hybrid {
		t.hybridCounts(v, lo, n, sc)
	}

	res.Instances = resize(res.Instances, i1-i0)
	for i := i0; i < i1; i++ {
		sp := v.insts[i]
		ih := &res.Instances[i-i0]
		ih.Instance = sp.name
		ih.Max = TierCounts{}
		ih.Ranks = ih.Ranks[:0]
		for f := sp.lo; f < sp.hi; f++ {
			c := TierCounts{sc.cnt[f-lo][Device], sc.cnt[f-lo][CPULocal], sc.cnt[f-lo][CPUShare], sc.cnt[f-lo][Disk]}
			ih.Ranks = append(ih.Ranks, RankHits{Rank: v.owners[f].rank, TierCounts: c})
			ih.Max.Device = max(ih.Max.Device, c.Device)
			ih.Max.CPULocal = max(ih.Max.CPULocal, c.CPULocal)
			ih.Max.CPUShare = max(ih.Max.CPUShare, c.CPUShare)
			ih.Max.Disk = max(ih.Max.Disk, c.Disk)
		}
	}
}

// walk advances the chain block by block for owners v.owners[lo:lo+n].
// Per block it costs one stripe lookup, one pass over the block's holders
// and a few word operations per 64 owners; an owner's count is written
// once, when its prefix in a tier breaks, instead of being added to on
// every block.
func (t *Table) walk(v *ownerView, chain Chain, lo, n int, sc *queryScratch) {
	dev, loc, dsk := sc.hold[0], sc.hold[1], sc.hold[2]
	total := 0 // tokens covered by the blocks matched so far
	// One block ahead, as walkKeys.
	key, covered, ok := chain.Next()
	for more := true; more && ok; {
		h := mix(key)
		s := t.stripeFor(h)
		s.prefetchSlot(h)
		next, nextCovered, nextOK := chain.Next()
		s.mu.RLock()
		idx := s.find(key, h)
		if idx < 0 {
			s.mu.RUnlock()
			break
		}
		clear(dev)
		clear(loc)
		clear(dsk)
		b := &s.blocks[idx]
		first := [1]pair{b.first}
		shared := sc.note(v.bySlot, lo, uint(n), first[:]) | sc.note(v.bySlot, lo, uint(n), s.overflow(b))
		s.mu.RUnlock()

		var allShare, allDisk uint64
		if shared&bitShare != 0 {
			allShare = ^uint64(0)
		}
		if shared&bitDisk != 0 {
			allDisk = ^uint64(0)
		}
		more = false
		for w := range dev {
			d := dev[w]
			l := d | loc[w]
			sh := l | allShare
			sc.cut(Device, w, d, total)
			sc.cut(CPULocal, w, l, total)
			sc.cut(CPUShare, w, sh, total)
			more = sc.cut(Disk, w, sh|dsk[w]|allDisk, total) || more
		}
		total += covered
		key, covered, ok = next, nextCovered, nextOK
	}
	for tier := range sc.alive {
		for w, a := range sc.alive[tier] {
			for ; a != 0; a &= a - 1 {
				sc.cnt[w*64+bits.TrailingZeros64(a)][tier] = total
			}
		}
	}
}

// smallWalk is walkSmall's state, which its two parts (walkReady and
// walkKeys) take in turn: the reported owners (the snapshot's slot map and
// the span lo, lo+un), the alive set per tier, the tokens matched so far
// and the holder memo.
type smallWalk struct {
	bySlot []uint64
	lo     int
	un     uint
	sc     *queryScratch
	alive  [numTiers]uint64
	total  int
	hm     holderMemo
}

// walkSmall is walk for at most 64 reported owners, the common case: the
// alive and holder sets live in registers instead of scratch slices.
func (t *Table) walkSmall(v *ownerView, chain Chain, lo, n int, sc *queryScratch) {
	w := smallWalk{bySlot: v.bySlot, lo: lo, un: uint(n), sc: sc,
		alive: [numTiers]uint64{sc.alive[Device][0], sc.alive[CPULocal][0], sc.alive[CPUShare][0], sc.alive[Disk][0]}}
	more := true
	// A memo-served prefix goes in batches; once it is used up (Ready 0)
	// it stays so, and the rest is walked key by key.
	if rc, _ := chain.(ReadyChain); rc != nil {
		for r := rc.Ready(); r > 0 && more && w.alive[Disk] != 0; r = rc.Ready() {
			more = t.walkReady(&w, chain, min(r, maxReadyBatch))
		}
	}
	if more && w.alive[Disk] != 0 {
		t.walkKeys(&w, chain)
	}
	for tier, a := range w.alive {
		for ; a != 0; a &= a - 1 {
			sc.cnt[bits.TrailingZeros64(a)][tier] = w.total
		}
	}
}

// walkKeys is walkSmall's key-by-key part: it looks each block up and cuts
// with its holders, from w.total tokens on, and adds the tokens matched.
// It hashes one block ahead: the next block's SHA-256 runs while the slot
// this block's lookup starts at is fetched from memory (prefetchSlot), so
// on a table larger than the caches the miss costs little; a walk thus
// advances the chain at most one block past the block that ends it.
func (t *Table) walkKeys(w *smallWalk, chain Chain) {
	bySlot, lo, un, sc, alive, total, hm := w.bySlot, w.lo, w.un, w.sc, &w.alive, w.total, &w.hm
	prev := noBlockHeld // the holder sets of the last block cut
	key, covered, ok := chain.Next()
	for ok && alive[Disk] != 0 {
		h := mix(key)
		si := t.stripeIndex(h)
		s := &t.stripes[si]
		s.prefetchSlot(h)
		next, nextCovered, nextOK := chain.Next()
		s.mu.RLock()
		idx := s.find(key, h)
		if idx < 0 {
			s.mu.RUnlock()
			break
		}
		dev, loc, dsk, shared := sc.holdersOf(s, si, &s.blocks[idx], bySlot, lo, un, hm, false)
		s.mu.RUnlock()
		// As in walkReady: a block held exactly like the one before it
		// cuts nobody, so the cut runs only where the holders change.
		if h := [4]uint64{dev, loc, dsk, uint64(shared)}; h != prev {
			sc.cutSmall(alive, dev, loc, dsk, shared, total)
			prev = h
		}
		total += covered
		key, covered, ok = next, nextCovered, nextOK
	}
	w.total = total
}

// walkReady is walkSmall's start for the n keys a ReadyChain has without
// hashing: it takes them all (in one call from a BatchChain, with their
// block hints), reads their blocks stripe by stripe (one read lock per
// stripe touched instead of one per block, and lookups within a stripe
// free to overlap their cache misses; a hinted block is checked where it
// lies before any probe, locate.go), then applies them in chain order
// exactly as walkSmall would. It adds the tokens matched to w.total and
// reports whether the walk may go on past the batch.
func (t *Table) walkReady(w *smallWalk, chain Chain, n int) bool {
	bySlot, lo, un, sc, alive, hm := w.bySlot, w.lo, w.un, w.sc, &w.alive, &w.hm
	r := &sc.ready
	ended, took := false, false
	if bc, _ := chain.(BatchChain); bc != nil {
		r.keys, r.covs, r.hints = bc.TakeReady(n, r.keys[:0], r.covs[:0], r.hints[:0])
		if took = len(r.keys) > 0; took {
			n = len(r.keys)
		}
	}
	if !took { // key by key (a chain without batches, or a batch that gave none)
		r.keys, r.covs, r.hints = resize(r.keys, n), resize(r.covs, n), resize(r.hints, n)
		for i := range n {
			k, c, ok := chain.Next()
			if !ok {
				n, ended = i, true
				break
			}
			r.keys[i], r.covs[i], r.hints[i] = k, c, 0
		}
	}
	r.hs, r.order, r.held = resize(r.hs, n), resize(r.order, n), resize(r.held, n)
	r.start = resize(r.start, len(t.stripes)+1)
	clear(r.start)
	unhinted := 0
	for i, k := range r.keys[:n] {
		h := mix(k)
		si := t.stripeIndex(h)
		// Every key is known before the first lookup, so the line each
		// lookup starts at is requested now: the batch's misses overlap
		// instead of following one another. With a hint that is the
		// block itself (locate.go), else the slot its probe starts at.
		if hint := r.hints[i]; hint != 0 {
			t.stripes[si].prefetchAt(hint - 1)
		} else {
			t.stripes[si].prefetchSlot(h)
			unhinted++
		}
		r.hs[i] = h
		r.start[si+1]++
	}
	for i := 1; i < len(r.start); i++ {
		r.start[i] += r.start[i-1]
	}
	for i := range n { // counting sort; start[s] ends at stripe s+1's start
		si := t.stripeIndex(r.hs[i])
		r.order[r.start[si]] = int32(i)
		r.start[si]++
	}
	// The slots are in cache by now; asking for every block of the batch
	// before comparing any of their keys lets those misses overlap too,
	// where find alone would wait for each in turn. That takes a stripe's
	// read lock twice, briefly, so a stripe small enough to stay in the
	// caches is left out, and so is a batch whose blocks all have hints
	// (requested above already).
	if unhinted > 0 {
		from := 0
		for si := range t.stripes {
			to := r.start[si]
			if s := &t.stripes[si]; from < to && s.slotsLen.Load() >= t.prefetchMin {
				s.mu.RLock()
				for _, i := range r.order[from:to] {
					if r.hints[i] == 0 {
						s.prefetchBlock(r.hs[i])
					}
				}
				s.mu.RUnlock()
			}
			from = to
		}
	}
	from := 0
	for si := range t.stripes {
		to := r.start[si]
		if from == to {
			continue
		}
		s := &t.stripes[si]
		s.mu.RLock()
		for _, i := range r.order[from:to] {
			var idx int
			if hn := r.hints[i]; hn != 0 && s.holdsAt(r.keys[i], hn-1) {
				idx = int(hn - 1)
			} else {
				idx = s.find(r.keys[i], r.hs[i])
			}
			if idx < 0 {
				r.held[i] = [4]uint64{}
				continue
			}
			dev, loc, dsk, shared := sc.holdersOf(s, si, &s.blocks[idx], bySlot, lo, un, hm, true)
			r.held[i] = [4]uint64{dev, loc, dsk, uint64(shared) | readyFound}
		}
		s.mu.RUnlock()
		from = to
	}
	// A block held exactly like the one before it cuts nobody: the alive
	// sets are already within its holder sets. The blocks of a cached
	// prompt mostly are, so the cut runs only where the holders change.
	prev, total := noBlockHeld, w.total
	for i := range n {
		if h := r.held[i]; h != prev {
			if h[3]&readyFound == 0 {
				w.total = total
				return false
			}
			sc.cutSmall(alive, h[0], h[1], h[2], uint8(h[3]), total)
			prev = h
		}
		total += r.covs[i]
		if alive[Disk] == 0 {
			w.total = total
			return false
		}
	}
	w.total = total
	return !ended
}

// cutSmall is walkSmall's per-block step: owners whose prefix in a tier
// does not reach this block (given the holder sets of the block's engine
// holders and its shared tier bits) get their count for that tier, total,
// and leave the tier's alive set. Tiers are cumulative, so a local holder
// also counts for cpu_local, a shared one for every owner.
func (sc *queryScratch) cutSmall(alive *[numTiers]uint64, dev, loc, dsk uint64, shared uint8, total int) {
	loc |= dev
	sh := loc | -uint64(shared>>CPUShare&1)
	held := [numTiers]uint64{dev, loc, sh, sh | dsk | -uint64(shared>>Disk&1)}
	for tier, a := range alive {
		if died := a &^ held[tier]; died != 0 {
			for ; died != 0; died &= died - 1 {
				sc.cnt[bits.TrailingZeros64(died)][tier] = total
			}
			alive[tier] = a & held[tier]
		}
	}
}

// holdersOf returns the holder sets of block b of stripe s, number si,
// which the caller holds read-locked. A block with an interned holder list
// is answered by id when the stripe's last list is the same, otherwise by
// comparing the list's words (hot: a stripe has few lists) with hm's, so
// the walk never reads its overflow list; a lone holder is compared with
// hm too. Only a block with more holders than are interned has its pairs
// resolved one by one.
func (sc *queryScratch) holdersOf(s *stripe, si int, b *block, bySlot []uint64, lo int, un uint, hm *holderMemo, scan bool) (dev, loc, dsk uint64, shared uint8) {
	id := b.holderID()
	switch {
	case id != 0:
	case b.ext == 0:
		one := [1]uint32{b.first.own}
		return hm.resolve(bySlot, lo, un, one[:], scan)
	default:
		dev, loc, dsk, shared = noteSmall(bySlot, lo, un, b.first, 0, 0, 0, 0)
		for _, p := range s.overflow(b) {
			dev, loc, dsk, shared = noteSmall(bySlot, lo, un, p, dev, loc, dsk, shared)
		}
		return dev, loc, dsk, shared
	}
	m := &sc.lists[si]
	if m.id == id && m.epoch == s.sets.epoch {
		return m.dev, m.loc, m.dsk, m.shared
	}
	dev, loc, dsk, shared = hm.resolve(bySlot, lo, un, s.sets.wordsOf(id), scan)
	// Field by field: a composite literal goes through the stack, and its
	// wide reload stalls on the narrow stores just made
	// (BenchmarkWalkMixed).
	m.id, m.epoch, m.shared = id, s.sets.epoch, shared
	m.dev, m.loc, m.dsk = dev, loc, dsk
	return dev, loc, dsk, shared
}

// holderMemo remembers the holder words of the last few distinct lists
// the walk resolved through it and the sets they gave. The blocks of a
// cached prompt are usually held by the same owners in the same tiers, and
// comparing a block's words with remembered ones costs less than resolving
// each owner again (a snapshot lookup and a generation check per word).
// Several lists, not one, because walkReady visits a batch stripe by
// stripe: where owners hold the prompt to different depths, each stripe
// runs through the same few lists in turn (all owners, then fewer), and a
// single remembered list would miss at every change. The sets depend only
// on the words, given the query's snapshot and owner span.
type holderMemo struct {
	last    int // the entry that answered last, tried first
	next    int // the entry the next new list replaces
	entries [holderMemoSize]holderMemoEntry
}

const holderMemoSize = 4

type holderMemoEntry struct {
	n      int // 0: nothing remembered; at most len(own)
	own    [32]uint32
	dev    uint64
	loc    uint64
	dsk    uint64
	shared uint8
}

// resolve returns the holder sets of a block held by the owner-and-tier
// words given (a lone holder's, or an interned list's), from the memo when
// it has them. Only with scan does it look past the list that answered
// last: walkKeys goes in chain order, where a block is held like the one
// before it or like none remembered, and scanning there only slows walks
// whose every block has its own holder.
func (m *holderMemo) resolve(bySlot []uint64, lo int, un uint, words []uint32, scan bool) (dev, loc, dsk uint64, shared uint8) {
	if e := &m.entries[m.last]; len(words) == e.n && slices.Equal(words, e.own[:len(words)]) {
		return e.dev, e.loc, e.dsk, e.shared
	}
	if scan && len(words) > 0 {
		for i := range m.entries {
			// The length and the first word rule out most other lists
			// before a full comparison.
			if e := &m.entries[i]; i != m.last && len(words) == e.n && words[0] == e.own[0] && slices.Equal(words, e.own[:len(words)]) {
				m.last = i
				return e.dev, e.loc, e.dsk, e.shared
			}
		}
	}
	for _, w := range words {
		dev, loc, dsk, shared = noteSmall(bySlot, lo, un, pair{own: w}, dev, loc, dsk, shared)
	}
	if e := &m.entries[m.next]; len(words) <= len(e.own) {
		e.n = copy(e.own[:], words)
		e.dev, e.loc, e.dsk, e.shared = dev, loc, dsk, shared
		m.last, m.next = m.next, (m.next+1)%holderMemoSize
	}
	return dev, loc, dsk, shared
}

// noteSmall adds one holder to walkSmall's holder sets (see note). It
// repeats note's owner resolution on purpose: the walk is this loop, and
// sharing the resolution through a small inlined helper slows it
// (BENCHMARKS.md, parts: BenchmarkWalk/inst=8/ranks=2).
func noteSmall(bySlot []uint64, lo int, n uint, p pair, dev, loc, dsk uint64, shared uint8) (uint64, uint64, uint64, uint8) {
	id, m := p.own>>maskBits, uint64(p.own&tierBits)
	if id == 0 {
		return dev, loc, dsk, shared | uint8(m)
	}
	sl := uint(id & slotMask)
	if sl >= uint(len(bySlot)) {
		return dev, loc, dsk, shared
	}
	e := bySlot[sl]
	f := uint(int(uint32(e)) - lo)
	if uint32(e>>32) != id || f >= n {
		return dev, loc, dsk, shared
	}
	bit := uint64(1) << (f & 63)
	return dev | bit&-(m&1>>Device), loc | bit&-(m>>CPULocal&1), dsk | bit&-(m>>Disk&1), shared
}

// cut keeps the owners of word w alive in tier only if they hold the
// current block there, records the count of those whose prefix just broke,
// and reports whether any remain.
func (sc *queryScratch) cut(tier Tier, w int, held uint64, total int) bool {
	old := sc.alive[tier][w]
	now := old & held
	if now != old {
		for died := old &^ now; died != 0; died &= died - 1 {
			sc.cnt[w*64+bits.TrailingZeros64(died)][tier] = total
		}
		sc.alive[tier][w] = now
	}
	return now != 0
}

// note records the engine pairs' tiers in the holder sets for owners being
// reported, and returns the shared pairs' tier bits. It is the inner loop of
// the walk (one iteration per holder per block), hence branch-free bit
// setting and one call per slice rather than per pair.
func (sc *queryScratch) note(bySlot []uint64, lo int, n uint, ps []pair) (shared uint8) {
	dev, loc, dsk := sc.hold[0], sc.hold[1], sc.hold[2]
	for _, p := range ps {
		id, m := p.own>>maskBits, uint64(p.own&tierBits)
		if id == 0 {
			shared |= uint8(m)
			continue
		}
		sl := uint(id & slotMask)
		if sl >= uint(len(bySlot)) {
			continue // registered after the snapshot was taken
		}
		e := bySlot[sl]
		f := uint(int(uint32(e)) - lo)
		if uint32(e>>32) != id || f >= n {
			continue // other generation, other instance, or not registered
		}
		w, bit := f>>6, uint64(1)<<(f&63)
		dev[w] |= bit & -(m & 1 >> Device)
		loc[w] |= bit & -(m >> CPULocal & 1)
		dsk[w] |= bit & -(m >> Disk & 1)
	}
	return shared
}

// resize returns s with length n, reusing its backing array (and the
// elements' own buffers beyond the old length) when large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return append(s[:cap(s)], make([]T, n-cap(s))...)
}
