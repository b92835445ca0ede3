package index

import (
	"sync"
	"sync/atomic"
)

// Shared references with owners (docs/index-memory.md#mooncake-bindings).
//
// A shared tier's holder counts references; a Mooncake object binding takes
// one and gives it back when the master removes the object. The evictor
// removes a holder whole, with every reference at once, so a binding that
// outlived its holder would release a later holder of the same key taken by
// another binding (removing what that binding still needs), and its own
// record in the decoder would never be counted or freed. A SharedRef closes
// both gaps: the index keeps the references themselves beside the holder,
// under the same stripe lock as the count, so
//
//   - the binding's bytes (SharedRef.cost) are charged to the budget while
//     the reference is held and given back the moment it is released or
//     evicted;
//   - an eviction (or the table's drop) marks each of the holder's
//     references gone and hands it to its owner's Orphans, so the owner can
//     forget the binding; a later release of a gone reference is a no-op and
//     never touches a newer holder of the key;
//   - a holder's count is the number of references it holds, so releasing
//     them all removes it: nothing is left that no binding can remove.

// Bytes the index itself keeps for owned references, on top of each
// reference's cost.
const (
	// refListBytes: a (key, tier) entry of a stripe's reference map (key,
	// slice header and the map's overhead).
	refListBytes = 64
	// refSlotBytes: a reference's slot in that entry's slice.
	refSlotBytes = 8
)

// refKey is a shared holder: a key and one shared tier bit.
type refKey struct {
	key uint64
	bit uint32
}

// SharedRef is one reference an outside owner holds on a key's shared tier
// for one KV-cache group. It belongs to one table: take it with
// Table.Acquire, give it back with Table.Release, each at most once.
//
// A reference of group 0 is owned and evictable as described above; those
// cover group 0, which every dense and hybrid model has. One of another
// group is a plain count of that group beside the key (the end of this
// file): the stripe is charged a fixed size per key for such counts instead
// of the reference's cost, and they are never evicted or orphaned.
type SharedRef struct {
	// Owner is the owner's record, for the owner to find it again when
	// Orphans hands the reference back.
	Owner any

	tier    Tier
	group   int
	key     uint64
	cost    int64
	orphans *Orphans
	// held and pos (its place in the stripe's list) are under the lock of
	// the stripe that holds key.
	held bool
	pos  uint32
	gone atomic.Bool
}

// Init makes r a reference, not taken, on key's shared tier for KV-cache
// group group, for owner, whose record accounts for cost bytes; orphans
// (may be nil) receives it if the index evicts it. Owners embed their
// reference, which saves an allocation per binding.
func (r *SharedRef) Init(owner any, tier Tier, group int, key uint64, cost int64, orphans *Orphans) {
	*r = SharedRef{Owner: owner, tier: tier, group: group, key: key, cost: max(cost, 0), orphans: orphans}
}

// Tier is the shared tier the reference is on.
func (r *SharedRef) Tier() Tier { return r.tier }

// Group is the KV-cache group the reference is on.
func (r *SharedRef) Group() int { return r.group }

// Key is the block key the reference is on.
func (r *SharedRef) Key() uint64 { return r.key }

// Gone reports that the index evicted the reference (or dropped its
// table): it no longer counts, and releasing it is a no-op.
func (r *SharedRef) Gone() bool { return r.gone.Load() }

// Orphans collects the references the index evicted, for their owner to
// forget. It is safe for concurrent use; the index adds to it while holding
// a stripe lock, so an owner must not call into the index while adding.
type Orphans struct {
	mu   sync.Mutex
	refs []*SharedRef
}

func (o *Orphans) add(r *SharedRef) {
	o.mu.Lock()
	o.refs = append(o.refs, r)
	o.mu.Unlock()
}

// Drain returns the references evicted since the last Drain and forgets
// them.
func (o *Orphans) Drain() []*SharedRef {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.refs
	o.refs = nil
	return out
}

// Len is how many evicted references wait for Drain.
func (o *Orphans) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.refs)
}

// Acquire takes reference r on its key's shared tier (CPUShare or Disk).
// A Mooncake binding takes one per object, so a block split into K and V
// objects holds two references and stays visible until both are released.
// A reference of group 0 charges its cost to the budget while it is held.
// Acquire reports false, taking nothing, for a dropped table, a tier that
// is not shared, a group outside [0, MaxGroups), or a reference already
// taken.
func (t *Table) Acquire(r *SharedRef) bool {
	if r.group != 0 {
		return t.acquireGroup(r)
	}
	bit := sharedTierBit(r.tier)
	if bit == 0 {
		return false
	}
	t.admit()
	h := mix(r.key)
	s := t.stripeFor(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || r.held || r.gone.Load() {
		return false
	}
	t.acquireSharedLocked(s, bit, r.key, h)
	rk := refKey{r.key, bit}
	if s.refs == nil {
		s.refs = make(map[refKey][]*SharedRef)
	}
	list := s.refs[rk]
	n := r.cost + refSlotBytes
	if len(list) == 0 {
		n += refListBytes
	}
	r.held, r.pos = true, uint32(len(list))
	s.refs[rk] = append(list, r)
	s.charge(n)
	return true
}

// Release gives back reference r: its cost leaves the budget and the key
// leaves the shared tier with its last reference. A reference not held
// (never taken, released already, or evicted) is a no-op, so it never
// takes a count another reference holds.
func (t *Table) Release(r *SharedRef) {
	if r.group != 0 {
		t.releaseGroup(r)
		return
	}
	bit := sharedTierBit(r.tier)
	if bit == 0 {
		return
	}
	h := mix(r.key)
	s := t.stripeFor(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || !r.held {
		return
	}
	s.unlinkRef(refKey{r.key, bit}, r)
	idx := s.find(r.key, h)
	if idx < 0 {
		return // unreachable: a held reference keeps its block
	}
	t.changing(s)
	b := &s.blocks[idx]
	k := s.findShared(b, bit)
	if k == noPair {
		return // unreachable: a held reference keeps its holder
	}
	p := s.pairAt(b, k)
	if p.aux--; p.aux == 0 {
		s.removePair(b, k)
		s.settle(idx, b)
		t.notify(KeyEvicted, 0, r.key)
	}
}

// unlinkRef takes held reference r out of rk's list and gives back what it
// accounted for.
func (s *stripe) unlinkRef(rk refKey, r *SharedRef) {
	list := s.refs[rk]
	last := len(list) - 1
	if moved := list[last]; moved != r {
		list[r.pos], moved.pos = moved, r.pos
	}
	list[last] = nil
	n := -(r.cost + refSlotBytes)
	if last == 0 {
		delete(s.refs, rk)
		n -= refListBytes
	} else {
		s.refs[rk] = list[:last]
	}
	r.held = false
	s.charge(n)
}

// refsHeld counts the owned references rk's holder has.
func (s *stripe) refsHeld(rk refKey) int { return len(s.refs[rk]) }

// evictRefs marks every owned reference of rk gone, hands each to its
// owner's Orphans and gives back what they accounted for: the holder they
// counted in is being evicted whole.
func (s *stripe) evictRefs(rk refKey) {
	list, ok := s.refs[rk]
	if !ok {
		return
	}
	n := int64(refListBytes)
	for _, r := range list {
		n += r.cost + refSlotBytes
		r.orphan()
	}
	delete(s.refs, rk)
	s.charge(-n)
}

// orphanAllRefs is evictRefs for every holder of a stripe being dropped
// (the stripe gives back its bytes in releaseAll).
func (s *stripe) orphanAllRefs() {
	for _, list := range s.refs {
		for _, r := range list {
			r.orphan()
		}
	}
	s.refs = nil
}

func (r *SharedRef) orphan() {
	r.held = false
	// Into the owner's orphans before it reads as gone, so that whoever
	// sees Gone also finds it there (TestMooncakeBindingFlood counts the
	// owner's bindings as live or orphaned while the evictor runs).
	if r.orphans != nil {
		r.orphans.add(r)
	}
	r.gone.Store(true)
}

// Adjust changes what held reference r of group 0 accounts for by delta
// bytes (its owner's record grew or shrank) and reports whether r is held;
// a reference not held, or of another group, is left alone.
func (t *Table) Adjust(r *SharedRef, delta int64) bool {
	if sharedTierBit(r.tier) == 0 || r.group != 0 {
		return false
	}
	if delta > 0 {
		t.admit()
	}
	s := t.stripeFor(mix(r.key))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || !r.held {
		return false
	}
	delta = max(delta, -r.cost)
	r.cost += delta
	s.charge(delta)
	return true
}

// acquireSharedLocked adds one reference to key's shared pair of tier bit
// in stripe s (whose write lock the caller holds and which is not dead),
// creating the pair and telling watchers of the key when it is the first;
// a saturated count stays saturated.
func (t *Table) acquireSharedLocked(s *stripe, bit uint32, key, h uint64) {
	t.changing(s)
	idx := s.findOrInsert(key, h)
	b := &s.blocks[idx]
	k := s.findShared(b, bit)
	if k != noPair {
		if p := s.pairAt(b, k); p.aux != ^uint32(0) {
			p.aux++
		}
	} else {
		s.addPair(b, pair{own: bit, aux: 1})
	}
	s.setMask(b, b.mask()|uint8(bit))
	if k == noPair {
		t.notify(KeyAdded, 0, key)
	}
}

// Shared references of KV-cache groups other than 0 (docs/hybrid.md#mooncake)
// are plain counts per key and group, which the hybrid walk reads beside
// the block's group 0 holders.

// sharedGroupBytes is the accounted cost of a key's counts of other groups
// (the map entry and its counts, budget.go).
const sharedGroupBytes = 8 + 8 + MaxGroups*8 + 48

// sharedGroupRefs are one key's shared references per KV-cache group
// (index 0 unused: group 0 is the block's shared pairs) and shared tier
// (CPUShare, Disk).
type sharedGroupRefs [MaxGroups][2]uint32

// word packs the groups with references: CPUShare's in the low groupBits,
// Disk's above; 0 for a nil r.
func (r *sharedGroupRefs) word() uint32 {
	if r == nil {
		return 0
	}
	var w uint32
	for g := 1; g < MaxGroups; g++ {
		if r[g][0] != 0 {
			w |= 1 << g
		}
		if r[g][1] != 0 {
			w |= 1 << (groupBits + g)
		}
	}
	return w
}

func sharedSlot(tier Tier) int {
	switch tier {
	case CPUShare:
		return 0
	case Disk:
		return 1
	}
	return -1
}

// lockSharedGroup returns key's stripe, write-locked, and tier's slot in
// a sharedGroupRefs, for a reference of group g; nil when tier or g is not
// one a group reference can have.
func (t *Table) lockSharedGroup(tier Tier, g int, key uint64) (*stripe, int) {
	i := sharedSlot(tier)
	if i < 0 || g < 0 || g >= MaxGroups {
		return nil, 0
	}
	s := t.stripeFor(mix(key))
	s.mu.Lock()
	return s, i
}

// acquireGroup is Acquire for a reference of a KV-cache group other than
// 0: a hybrid model's Mooncake object of that group, counted beside the
// block.
func (t *Table) acquireGroup(r *SharedRef) bool {
	s, i := t.lockSharedGroup(r.tier, r.group, r.key)
	if s == nil {
		return false
	}
	defer s.mu.Unlock()
	if s.dead || r.held {
		return false
	}
	t.changing(s)
	t.sharedGroups.Store(true)
	if s.sharedGroups == nil {
		s.sharedGroups = make(map[uint64]*sharedGroupRefs)
	}
	c := s.sharedGroups[r.key]
	if c == nil {
		c = new(sharedGroupRefs)
		s.sharedGroups[r.key] = c
		s.charge(sharedGroupBytes)
	}
	if c[r.group][i] != ^uint32(0) {
		c[r.group][i]++
	}
	r.held = true
	return true
}

// releaseGroup drops the count acquireGroup took.
func (t *Table) releaseGroup(r *SharedRef) {
	s, i := t.lockSharedGroup(r.tier, r.group, r.key)
	if s == nil {
		return
	}
	defer s.mu.Unlock()
	if !r.held {
		return
	}
	r.held = false
	c := s.sharedGroups[r.key]
	if s.dead || c == nil || c[r.group][i] == 0 {
		return
	}
	t.changing(s)
	c[r.group][i]--
	if *c == (sharedGroupRefs{}) {
		delete(s.sharedGroups, r.key)
		s.charge(-sharedGroupBytes)
	}
}
