package index

import "slices"

// holderSets interns, per stripe, the holder lists of blocks with more than
// one holder: each distinct list (its pairs' owner-and-tier words, sorted)
// is stored once and a block refers to it by a small id. A query then tells
// that a block is held exactly like one it has already resolved by
// comparing that id, instead of reading the block's overflow list, a
// separate allocation and the walk's costliest cache miss (BENCHMARKS.md,
// BenchmarkWalkReady).
//
// Cached prompts are mostly held by the same few owner combinations, so a
// stripe keeps few sets however many blocks refer to them. The words are the
// only input of a block's holder sets for a given registration snapshot and
// owner span (see noteSmall), which is what makes the id a safe memo key.
//
// A set whose last reference goes stays interned, unreferenced, so the
// lists a block passes through while its owners arrive one by one are not
// built again for the next block; sweep frees such sets once they outnumber
// the referenced ones, and reuses their ids. epoch counts sweeps, so a
// query that remembered an id across two lock holds of the stripe can tell
// whether the id may have changed meaning meanwhile.
type holderSets struct {
	byHash map[uint64]uint32 // hash of words → id of the newest set with it
	sets   []holderSet       // by id - 1
	free   []uint32          // ids of freed sets
	unused int               // interned sets without references
	epoch  uint32
	bytes  int64    // accounted memory of the sets (budget.go)
	words  []uint32 // scratch for intern
}

type holderSet struct {
	words []uint32 // sorted; nil while the id is free
	hash  uint64
	refs  uint32
	next  uint32 // older set with the same hash, 0 ends the chain
	// grown remembers, newest first, which sets this one became when a
	// block gained a holder, the usual change while several owners store
	// one prompt, so that needs no sort, hash or map lookup. Every sweep
	// forgets them all, since it may free their targets.
	grown [2]growth
}

// growth is one entry of holderSet.grown: plus word, the set is to (0:
// empty).
type growth struct{ word, to uint32 }

// maxInternedHolders bounds the lists that are interned. Interning a list
// sorts it, on every change of a block's holders that is not a remembered
// growth; past this size the block is left uninterned (id 0) and queries
// compare its pairs instead.
const maxInternedHolders = 64

// minSweep is how many unreferenced sets a stripe may keep however few it
// references; beyond it, up to as many as it references, so unreferenced
// sets at most double the sets' memory.
const minSweep = 64

// hashWords mixes a sorted word list; equal lists hash equally.
func hashWords(w []uint32) uint64 {
	h := uint64(len(w))
	for _, x := range w {
		h = (h ^ uint64(x)) * 0x9e3779b97f4a7c15
	}
	return mix(h)
}

// intern returns the id of the set equal to the holders first and rest,
// with one more reference, creating it when absent. It returns 0, and takes
// no reference, for lists longer than maxInternedHolders or when the
// stripe has as many sets as an id can name.
func (hs *holderSets) intern(first pair, rest []pair) uint32 {
	if len(rest)+1 > maxInternedHolders {
		return 0
	}
	w := append(hs.words[:0], first.own)
	for _, p := range rest {
		w = append(w, p.own)
	}
	slices.Sort(w)
	hs.words = w
	h := hashWords(w)
	head := hs.byHash[h]
	for id := head; id != 0; id = hs.sets[id-1].next {
		if set := &hs.sets[id-1]; slices.Equal(set.words, w) {
			if set.refs == 0 {
				hs.unused--
			}
			set.refs++
			return id
		}
	}
	var id uint32
	if n := len(hs.free); n > 0 {
		id = hs.free[n-1]
		hs.free = hs.free[:n-1]
	} else if len(hs.sets) < maxHolderID {
		hs.sets = append(hs.sets, holderSet{})
		id = uint32(len(hs.sets))
	} else {
		return 0
	}
	hs.sets[id-1] = holderSet{words: slices.Clone(w), hash: h, refs: 1, next: head}
	hs.bytes += holderSetBytes + 4*int64(len(w))
	if hs.byHash == nil {
		hs.byHash = make(map[uint64]uint32)
	}
	hs.byHash[h] = id
	return id
}

// release drops one reference to id (0 is ignored).
func (hs *holderSets) release(id uint32) {
	if id == 0 {
		return
	}
	set := &hs.sets[id-1]
	if set.refs--; set.refs > 0 {
		return
	}
	hs.unused++
	if live := len(hs.sets) - len(hs.free); hs.unused > minSweep && 2*hs.unused > live {
		hs.sweep()
	}
}

// sweep frees every unreferenced set and refiles the others.
func (hs *holderSets) sweep() {
	hs.epoch++
	hs.unused = 0
	clear(hs.byHash)
	hs.free = hs.free[:0]
	for i := range hs.sets {
		id, set := uint32(i+1), &hs.sets[i]
		if set.refs == 0 {
			if set.words != nil {
				hs.bytes -= holderSetBytes + 4*int64(len(set.words))
			}
			*set = holderSet{}
			hs.free = append(hs.free, id)
			continue
		}
		set.next = hs.byHash[set.hash]
		set.grown = [2]growth{}
		hs.byHash[set.hash] = id
	}
	if len(hs.free) == len(hs.sets) {
		// Nothing is referenced (a stripe emptied by unregistrations):
		// give the memory back rather than keep the peak.
		*hs = holderSets{epoch: hs.epoch}
	}
}

// internGrown is intern for a block whose set was from before it gained
// the holder with word w (first and rest, now including it): it takes the
// set from grown when it is remembered there, and remembers it otherwise.
func (hs *holderSets) internGrown(from, w uint32, first pair, rest []pair) uint32 {
	for _, g := range hs.sets[from-1].grown {
		if g.to != 0 && g.word == w {
			set := &hs.sets[g.to-1]
			if set.refs == 0 {
				hs.unused--
			}
			set.refs++
			return g.to
		}
	}
	id := hs.intern(first, rest) // may grow hs.sets: index it afresh below
	if id != 0 {
		grown := &hs.sets[from-1].grown
		grown[1], grown[0] = grown[0], growth{word: w, to: id}
	}
	return id
}

// wordsOf returns the sorted words of a live set.
func (hs *holderSets) wordsOf(id uint32) []uint32 { return hs.sets[id-1].words }

// reintern points b at the interned set of its current holders, after a
// change of its holder list or of a holder's tiers. A block with a single
// holder has no set: its inline pair is already as cheap to compare.
func (s *stripe) reintern(b *block) {
	old, id := b.holderID(), uint32(0)
	if b.ext != 0 {
		id = s.sets.intern(b.first, s.overflow(b))
	}
	b.setHolderID(id)
	s.sets.release(old)
}

// reinternAdded is reintern after b, which had a holder already, gained
// the holder p (addPair).
func (s *stripe) reinternAdded(b *block, p pair) {
	old := b.holderID()
	if old == 0 {
		s.reintern(b)
		return
	}
	b.setHolderID(s.sets.internGrown(old, p.own, b.first, s.overflow(b)))
	s.sets.release(old)
}
