package index

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
)

// Table is the index of one context: which engine owners and shared
// references hold which projected keys in which tier. Keys are spread over
// independently locked stripes so ingestion of one key never blocks queries
// touching others.
//
// Layout, chosen for memory per (block, owner) (BENCHMARKS.md, index
// memory; less when owners share blocks) and for operations that cost what
// they touch:
//
//   - A Table is split into power-of-two stripes by a mix of the key; each
//     stripe has its own RWMutex, so writers of one stripe never stall
//     readers of another and a query holds one read lock per block.
//   - A stripe is a slab of 24-byte blocks (key, one inline holder, overflow
//     handle, union tier mask) with stable indices, plus a linear-probing
//     index of uint32 slots (slab index + hash fingerprint).
//   - A holder is 8 bytes: engine owner id and tier bits, plus the block's
//     position in that owner's per-stripe reverse list (which makes
//     ClearOwner and RemoveEngineOwner proportional to what the owner holds
//     and removal O(1)); shared tiers are one holder per tier whose second
//     word is the reference count.
//   - Registration is an immutable snapshot swapped atomically, so the query
//     path maps holders to reported owners without locks, and walks with one
//     bitset per cumulative tier.
type Table struct {
	ctx     ContextKey
	shift   uint // 64 - log2(len(stripes)); stripe = mix(key) >> shift
	stripes []stripe
	// prefetchMin is the stripe size from which walkReady prefetches a
	// batch's blocks (prefetchMinSlots; tests lower it).
	prefetchMin int64

	// view is the immutable registration snapshot queries and writers read
	// without locks; it is replaced wholesale under regMu.
	view  atomic.Pointer[ownerView]
	regMu sync.Mutex
	ids   map[ownerKey]OwnerID
	// slots holds, per registration slot, the id currently or last issued
	// there and its key; freeSlots are slots whose owner has been fully
	// retracted and may be reissued with the next generation.
	slots     []slotInfo
	freeSlots []int
	dropped   bool // under regMu
	// layouts are the owners' KV-cache group layouts (layout.go), under
	// regMu; an owner without one is dense.
	layouts map[OwnerID]*ownerLayout
	// sharedGroups is set once a shared reference of a KV-cache group
	// other than 0 arrives (groups.go), which the dense walk cannot see.
	sharedGroups atomic.Bool

	// reap, when set, clears removed owners in the background.
	reap *reaper

	// cut is the cut in progress, if any: writers copy a stripe for it
	// before their first change (see Cut).
	cut atomic.Pointer[tableCut]
	// ix is the index the table belongs to (nil for tables built alone in
	// tests), whose watcher sees the table's changes.
	ix *Index
	// scope and scheme mark a producer-fed scope (scope.go).
	scope  bool
	scheme string
}

type slotInfo struct {
	id  OwnerID // 0 while free
	gen OwnerID
	key ownerKey
}

// An OwnerID is gen<<slotBits | slot. The slot is dense and reused, so
// per-stripe owner lists and the query's owner map stay as small as the
// number of live owners however often engines re-register; the generation
// (never 0, so no id is 0, the shared pseudo-owner) makes a late event
// carrying a retired id miss the slot's next owner.
const (
	slotBits = 18
	genBits  = 32 - maskBits - slotBits
	slotMask = 1<<slotBits - 1
)

// MaxEngineOwners is how many engine owners one context can hold at once;
// the limit comes from packing an owner id and a tier mask in 32 bits per
// (block, owner), which is what keeps the index compact.
const MaxEngineOwners = 1 << slotBits

func (id OwnerID) slot() int { return int(id & slotMask) }

type ownerKey struct {
	instance string
	rank     int
}

// ownerView is a registration snapshot. owners is sorted by (instance,
// rank), so every instance is a contiguous span and a query with an instance
// filter touches only that span.
type ownerView struct {
	// bySlot[slot] packs the slot's registered OwnerID (high 32 bits) and
	// its position in owners (low 32), so the query maps a pair to its
	// owner with one load and one compare.
	bySlot []uint64
	owners []ownerRef
	insts  []instSpan
	// hybrid[i] is owners[i]'s compiled layout, nil for a dense owner;
	// hybrid itself is nil when every owner is dense (hybrid.go).
	hybrid []*hybridLayout
}

type ownerRef struct {
	id       OwnerID
	instance string
	rank     int
}

type instSpan struct {
	name   string
	lo, hi int
}

var emptyView = &ownerView{}

func newTable(ctx ContextKey, nStripes int) *Table {
	bits := uint(0)
	for 1<<bits < nStripes {
		bits++
	}
	t := &Table{
		ctx:     ctx,
		shift:   64 - bits,
		stripes: make([]stripe, 1<<bits),
		ids:     make(map[ownerKey]OwnerID),

		prefetchMin: prefetchMinSlots,
	}
	for i := range t.stripes {
		t.stripes[i].pos = i
	}
	t.view.Store(emptyView)
	return t
}

// stripeIndex is the position in t.stripes of the stripe holding hash h.
func (t *Table) stripeIndex(h uint64) int {
	if t.shift == 64 {
		return 0
	}
	return int(h >> t.shift)
}

// stripeFor is the stripe holding hash h.
func (t *Table) stripeFor(h uint64) *stripe { return &t.stripes[t.stripeIndex(h)] }

// Context returns the context the table indexes, so a caller holding only
// the table can report it (metrics, /global_view).
func (t *Table) Context() ContextKey { return t.ctx }

// PrefixCount returns the number of distinct keys held in any tier by
// anyone, the prefix_count of /global_view.
func (t *Table) PrefixCount() int {
	n := 0
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.RLock()
		n += s.nlive
		s.mu.RUnlock()
	}
	return n
}

// TierBlocks returns, per tier, the number of distinct keys someone holds in
// it; it exists for metrics and costs one read lock per stripe.
func (t *Table) TierBlocks() [4]int {
	var out [4]int
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.RLock()
		for k := range out {
			out[k] += s.tierKeys[k]
		}
		s.mu.RUnlock()
	}
	return out
}

// Instances returns the registered engine instances with their sorted dp
// ranks, as /global_view lists them. The map is freshly allocated.
func (t *Table) Instances() map[string][]int {
	v := t.view.Load()
	out := make(map[string][]int, len(v.insts))
	for _, sp := range v.insts {
		ranks := make([]int, 0, sp.hi-sp.lo)
		for _, o := range v.owners[sp.lo:sp.hi] {
			ranks = append(ranks, o.rank)
		}
		out[sp.name] = ranks
	}
	return out
}

// AddEngineOwner registers (instance, rank) as an engine owner and returns
// its id; registering again returns the same id. From now on the pair
// appears in query results, with zeros until it stores something. On a
// dropped table it returns 0, an id every operation ignores. It panics
// beyond MaxEngineOwners live owners, which no deployment approaches.
func (t *Table) AddEngineOwner(instance string, rank int) OwnerID {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	k := ownerKey{instance, rank}
	if id, ok := t.ids[k]; ok {
		return id
	}
	if t.dropped {
		return 0
	}
	var sl int
	if n := len(t.freeSlots); n > 0 {
		sl = t.freeSlots[n-1]
		t.freeSlots = t.freeSlots[:n-1]
	} else {
		if len(t.slots) == MaxEngineOwners {
			panic("index: too many engine owners in one context")
		}
		sl = len(t.slots)
		t.slots = append(t.slots, slotInfo{})
	}
	info := &t.slots[sl]
	info.gen = info.gen%(1<<genBits-1) + 1
	info.id = info.gen<<slotBits | OwnerID(sl)
	info.key = k
	t.ids[k] = info.id
	t.publishLocked()
	t.notifyOwner(OwnerUpdated, instance)
	return info.id
}

// RemoveEngineOwner retracts everything the owner holds and forgets it, for
// /unregister. It is safe against concurrent Stores for the same id: the
// owner leaves the view first and each stripe re-checks it under its lock.
// The slot is reissued only after every stripe has been cleaned.
func (t *Table) RemoveEngineOwner(id OwnerID) {
	t.regMu.Lock()
	sl := id.slot()
	if id == 0 || sl >= len(t.slots) || t.slots[sl].id != id {
		t.regMu.Unlock()
		return
	}
	inst := t.slots[sl].key.instance
	delete(t.ids, t.slots[sl].key)
	t.forgetLayout(id)
	t.slots[sl].id = 0
	t.publishLocked()
	t.regMu.Unlock()
	t.notifyOwner(OwnerCleared, inst)

	if t.reap != nil && t.reap.enqueue(t, id) {
		return
	}
	t.clearOwner(id, engineBit, nil)
	t.releaseSlot(id)
}

// releaseSlot makes a removed owner's slot reusable once its entries are
// gone; a slot is never reissued while entries of its old generation remain.
func (t *Table) releaseSlot(id OwnerID) {
	t.regMu.Lock()
	if !t.dropped {
		t.freeSlots = append(t.freeSlots, id.slot())
	}
	t.regMu.Unlock()
}

// publishLocked rebuilds the registration snapshot. Registration changes
// are rare, so a full rebuild keeps the query path free of locks.
func (t *Table) publishLocked() {
	v := &ownerView{
		bySlot: make([]uint64, len(t.slots)),
		owners: make([]ownerRef, 0, len(t.ids)),
	}
	for k, id := range t.ids {
		v.owners = append(v.owners, ownerRef{id: id, instance: k.instance, rank: k.rank})
	}
	slices.SortFunc(v.owners, func(a, b ownerRef) int {
		if c := cmp.Compare(a.instance, b.instance); c != 0 {
			return c
		}
		return cmp.Compare(a.rank, b.rank)
	})
	for i, o := range v.owners {
		v.bySlot[o.id.slot()] = uint64(o.id)<<32 | uint64(i)
		if n := len(v.insts); n == 0 || v.insts[n-1].name != o.instance {
			v.insts = append(v.insts, instSpan{name: o.instance, lo: i, hi: i + 1})
		} else {
			v.insts[n-1].hi = i + 1
		}
	}
	v.hybrid = t.layoutsFor(v.owners)
	t.view.Store(v)
}

// position returns id's index in v.owners, or -1 when id is not a
// registered owner of this snapshot.
func (v *ownerView) position(id OwnerID) int {
	if sl := id.slot(); sl < len(v.bySlot) {
		if e := v.bySlot[sl]; OwnerID(e>>32) == id && id != 0 {
			return int(uint32(e))
		}
	}
	return -1
}

// registered reports whether id is a current engine owner. Callers hold the
// stripe lock, which is what orders it against RemoveEngineOwner.
func (t *Table) registered(id OwnerID) bool {
	return t.view.Load().position(id) >= 0
}

// drop forgets everything and turns every later operation into a no-op, so
// goroutines still holding the table after DropTable cannot resurrect it.
func (t *Table) drop() {
	t.regMu.Lock()
	t.dropped = true
	clear(t.ids)
	t.layouts = nil
	t.slots, t.freeSlots = nil, nil
	t.view.Store(emptyView)
	t.regMu.Unlock()
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		t.changing(s)
		s.dead = true
		s.slots, s.blocks, s.ext, s.extFre, s.owned, s.groups, s.sharedGroups = nil, nil, nil, nil, nil, nil, nil
		s.publishSlots()
		s.publishBlocks()
		s.sets = holderSets{}
		s.orphanAllRefs()
		s.releaseAll()
		s.nlive, s.free, s.tombs, s.tierKeys = 0, 0, 0, [numTiers]int{}
		s.mu.Unlock()
	}
	if t.ix != nil {
		t.ix.detach(t)
	}
}
