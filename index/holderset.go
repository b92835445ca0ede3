package index

import "slices"

// holderSets interns, per stripe, the holder lists of blocks with more than
// one holder: each distinct list (its pairs' owner-and-tier words, sorted)
// is stored once and a block refers to it by a small id. A query then tells
// that a block is held exactly like one it has already resolved by
// comparing that id, instead of reading the block's overflow list, a
// separate allocation and the walk's costliest cache miss: at 8 instances ×
// 2 ranks it was half of a warm 32K-token walk (BenchmarkWalkReady).
//
// Cached prompts are mostly held by the same few owner combinations, so a
// stripe keeps few sets however many blocks refer to them. The words are the
// only input of a block's holder sets for a given registration snapshot and
// owner span (see noteSmall), which is what makes the id a safe memo key.
//
// A set is freed with its last reference and its id reused; epoch counts
// those frees, so a query that remembered an id across two lock holds of
// the stripe can tell whether the id may have changed meaning meanwhile.
type holderSets struct {
	byHash map[uint64]uint32 // hash of words → id of the newest set with it
	sets   []holderSet       // by id - 1
	free   []uint32          // ids of freed sets
	epoch  uint32
	words  []uint32 // scratch for intern
}

type holderSet struct {
	words []uint32 // sorted; nil while the id is free
	hash  uint64
	refs  uint32
	next  uint32 // older set with the same hash, 0 ends the chain
}

// maxInternedHolders bounds the lists that are interned. Interning costs a
// sort of the list on every change of a block's holders; past this size the
// block is left uninterned (id 0) and queries compare its pairs instead.
const maxInternedHolders = 64

// hashWords mixes a sorted word list; equal lists hash equally.
func hashWords(w []uint32) uint64 {
	h := uint64(len(w))
	for _, x := range w {
		h = mix(h ^ uint64(x))
	}
	return h
}

// intern returns the id of the set equal to the holders first and rest,
// with one more reference, creating it when absent. It returns 0, and takes
// no reference, for lists longer than maxInternedHolders.
func (hs *holderSets) intern(first pair, rest []pair) uint32 {
	if len(rest)+1 > maxInternedHolders || len(hs.free) == 0 && len(hs.sets) == maxHolderID {
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
			set.refs++
			return id
		}
	}
	var id uint32
	if n := len(hs.free); n > 0 {
		id = hs.free[n-1]
		hs.free = hs.free[:n-1]
	} else {
		hs.sets = append(hs.sets, holderSet{})
		id = uint32(len(hs.sets))
	}
	hs.sets[id-1] = holderSet{words: slices.Clone(w), hash: h, refs: 1, next: head}
	if hs.byHash == nil {
		hs.byHash = make(map[uint64]uint32)
	}
	hs.byHash[h] = id
	return id
}

// release drops one reference to id (0 is ignored) and frees the set with
// its last one.
func (hs *holderSets) release(id uint32) {
	if id == 0 {
		return
	}
	set := &hs.sets[id-1]
	if set.refs--; set.refs > 0 {
		return
	}
	// Unlink from the hash chain.
	if hs.byHash[set.hash] == id {
		if set.next == 0 {
			delete(hs.byHash, set.hash)
		} else {
			hs.byHash[set.hash] = set.next
		}
	} else {
		for p := hs.byHash[set.hash]; p != 0; p = hs.sets[p-1].next {
			if hs.sets[p-1].next == id {
				hs.sets[p-1].next = set.next
				break
			}
		}
	}
	*set = holderSet{}
	hs.epoch++
	if len(hs.free)+1 == len(hs.sets) {
		// The last set went: give the memory back (a stripe emptied by an
		// unregistration would otherwise keep its peak forever).
		*hs = holderSets{epoch: hs.epoch}
		return
	}
	hs.free = append(hs.free, id)
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
