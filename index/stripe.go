package index

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// Tier bits inside a pair's mask and a block's union mask, in the
// contract's cumulative order: tier t's count admits a block held in any
// tier up to t.
const (
	bitDevice = 1 << Device
	bitLocal  = 1 << CPULocal
	bitShare  = 1 << CPUShare
	bitDisk   = 1 << Disk

	maskBits  = 4
	tierBits  = 1<<maskBits - 1
	engineBit = bitDevice | bitLocal | bitDisk
)

// pair is one holder's entry on a block, 8 bytes.
//
// own packs OwnerID<<4 | tier mask; own == 0 marks an empty pair. Shared
// holders use owner id 0 and exactly one of bitShare/bitDisk, and keep their
// reference count in aux. Engine owners keep in aux the position of the block
// in the owner's reverse list of the same stripe, so that list supports O(1)
// removal without a map.
type pair struct {
	own uint32
	aux uint32
}

func (p pair) id() OwnerID { return OwnerID(p.own >> maskBits) }
func (p pair) mask() uint8 { return uint8(p.own & tierBits) }

// block is one distinct key of a stripe, 24 bytes. The first holder lives
// inline because most blocks have exactly one; further holders live in an
// overflow list addressed by ext.
type block struct {
	key   uint64
	first pair
	// ext is a 1-based index into stripe.ext (0: no overflow). While the
	// block sits on the free list it holds the 1-based next free block.
	ext uint32
	// meta packs the id of the block's interned holder list (holderSets;
	// 0 with a single holder or an uninterned list) above maskBits, and
	// below them the union of the tiers any holder has, kept so per-tier
	// key counts change only when a tier's first holder arrives or last
	// leaves. Packing keeps the block at 24 bytes.
	meta uint32
}

// maxHolderID is the largest id meta can hold; holderSets stops interning
// new lists in a stripe that has that many.
const maxHolderID = 1<<(32-maskBits) - 1

func (b *block) mask() uint8      { return uint8(b.meta & tierBits) }
func (b *block) holderID() uint32 { return b.meta >> maskBits }

func (b *block) setMaskBits(m uint8) { b.meta = b.meta&^tierBits | uint32(m) }
func (b *block) setHolderID(id uint32) {
	b.meta = id<<maskBits | b.meta&tierBits
}

// stripe is one independently locked shard of a table: an open-addressing
// index of uint32 over a slab of blocks with stable indices (the owners'
// reverse lists refer to slab indices, so the index may rehash freely).
type stripe struct {
	mu sync.RWMutex
	// dead is set when the table is dropped; every later operation is a no-op.
	dead bool
	// slots is a linear-probing table: 0 empty, a zero index part a
	// tombstone, otherwise a fingerprint in the bits above idxBits and slab
	// index + 1 below. Its length is arbitrary (fastrange addressing),
	// which lets it grow in 25% steps; live entries plus tombstones stay
	// at or under 80%.
	slots   []uint32
	tombs   int // deleted slots awaiting the next resize
	idxBits uint
	idxMask uint32
	blocks  []block
	nlive   int
	free    uint32 // 1-based head of the free block list
	ext     [][]pair
	extFre  []uint32
	// owned[slot] lists the slab indices of blocks the engine owner in that
	// registration slot holds here (see OwnerID's layout in table.go).
	owned [][]uint32
	// groups[slot], when not nil, runs parallel to owned[slot]: the
	// KV-cache groups of each held block per tier (groups.go).
	groups [][]uint32
	// sharedGroups counts shared references of KV-cache groups other
	// than 0 by key (groups.go); nil until a hybrid model's Mooncake
	// object arrives.
	sharedGroups map[uint64]*sharedGroupRefs
	tierKeys     [numTiers]int
	// sets interns the holder lists of blocks with overflow (see block.meta).
	sets holderSets
	// refs lists, per shared holder, the owned references counted in it
	// (sharedref.go); nil until the first.
	refs map[refKey][]*SharedRef
	// slotsAt and slotsLen mirror slots for prefetchSlot, which reads them
	// without the lock; see there.
	slotsAt  atomic.Uintptr
	slotsLen atomic.Int64
	// blocksAt and blocksCap mirror the slab for prefetchAt, likewise.
	blocksAt  atomic.Uintptr
	blocksCap atomic.Int64
	// pos is the stripe's position in its table; cutEpoch is the last cut
	// it was copied for (see Cut), under mu.
	pos      int
	cutEpoch uint64
	// acct is the stripe's accounted memory and recency stamps (budget.go).
	acct acct
	_    [64]byte // keep neighbouring stripes' locks off one cache line
}

// mix is the splitmix64 finalizer: projected keys from tests or odd
// publishers need not be uniform, and the stripe and slot both come from it.
func mix(k uint64) uint64 {
	k ^= k >> 30
	k *= 0xbf58476d1ce4e5b9
	k ^= k >> 27
	k *= 0x94d049bb133111eb
	k ^= k >> 31
	return k
}

// home maps a hash to a slot of a table of n slots without a power-of-two
// restriction.
func home(h uint64, n int) int {
	return int((uint64(uint32(h)) * uint64(n)) >> 32)
}

// fingerprint is the tag a key's hash leaves in the slot bits above the
// slab index; probes compare it before touching the slab, so a miss (every
// new key, every query's last block) costs no slab cache misses.
func (s *stripe) fingerprint(h uint64) uint32 {
	return uint32(h>>32) << s.idxBits
}

// publishSlots mirrors slots for prefetchSlot; writers call it, under the
// lock, whenever they replace slots.
func (s *stripe) publishSlots() {
	if len(s.slots) == 0 {
		s.slotsLen.Store(0)
		return
	}
	s.slotsAt.Store(uintptr(unsafe.Pointer(&s.slots[0])))
	s.slotsLen.Store(int64(len(s.slots)))
}

// publishBlocks mirrors the slab for prefetchAt; writers call it, under
// the lock, whenever the slab's backing array may have changed.
func (s *stripe) publishBlocks() {
	if cap(s.blocks) == 0 {
		s.blocksCap.Store(0)
		return
	}
	s.blocksAt.Store(uintptr(unsafe.Pointer(unsafe.SliceData(s.blocks))))
	s.blocksCap.Store(int64(cap(s.blocks)))
}

// prefetchAt starts loading slab entry idx without the lock, for a lookup
// that has a hint of where its block lies (locate.go). Like
// prefetchSlot it is only a hint: a stale mirror loads a useless line.
func (s *stripe) prefetchAt(idx uint32) {
	if int64(idx) < s.blocksCap.Load() {
		prefetch(s.blocksAt.Load() + uintptr(idx)*unsafe.Sizeof(block{}))
	}
}

// holdsAt reports whether the live block of key lies at slab index idx, a
// hint (locate.go); the caller holds the lock. A free entry has no
// holder (and a zero key), so a hint to a block deleted since, or to an
// entry reused for another key, fails and the caller probes as usual.
func (s *stripe) holdsAt(key uint64, idx uint32) bool {
	return int(idx) < len(s.blocks) && s.blocks[idx].key == key && s.blocks[idx].first.own != 0
}

// prefetchSlot starts loading the slot where a lookup of hash h begins,
// without taking the lock, so the cache miss overlaps other work (a
// query hashes its next block meanwhile). It is only a hint: the mirror
// may be stale or torn between its two words while a writer resizes, and
// a prefetch of an address that is no longer the table's, or not mapped,
// loads a useless line or nothing; it never faults.
func (s *stripe) prefetchSlot(h uint64) {
	if n := s.slotsLen.Load(); n > 0 {
		prefetch(s.slotsAt.Load() + uintptr(home(h, int(n)))*4)
	}
}

// prefetchBlock starts loading the slab entry of the first slot, from
// hash h's home on, whose fingerprint is h's: the block find will compare
// first. The caller holds the lock; the probe reads slots only, so a key
// that is absent costs nothing more.
func (s *stripe) prefetchBlock(h uint64) {
	n := len(s.slots)
	if n == 0 {
		return
	}
	fp, mask := s.fingerprint(h), s.idxMask
	for i := home(h, n); ; {
		v := s.slots[i]
		if v == 0 {
			return
		}
		if v&^mask == fp && v&mask != 0 {
			prefetch(uintptr(unsafe.Pointer(&s.blocks[int(v&mask)-1])))
			return
		}
		if i++; i == n {
			i = 0
		}
	}
}

// tombstone marks a deleted slot: a zero index part, which no live slot has.
// Deleting by tombstone needs no other key's hash, where backward-shift
// deletion would read a slab entry (a cache miss) per displaced neighbour.
func (s *stripe) tombstone() uint32 { return ^s.idxMask }

// find returns the slab index of key, or -1.
func (s *stripe) find(key, h uint64) int {
	n := len(s.slots)
	if n == 0 {
		return -1
	}
	fp, mask := s.fingerprint(h), s.idxMask
	i := home(h, n)
	for {
		v := s.slots[i]
		if v == 0 {
			return -1
		}
		if v&^mask == fp && v&mask != 0 {
			if idx := int(v&mask) - 1; s.blocks[idx].key == key {
				return idx
			}
		}
		if i++; i == n {
			i = 0
		}
	}
}

// findOrInsert returns the slab index of key, creating an empty block.
func (s *stripe) findOrInsert(key, h uint64) int {
	if (s.nlive+s.tombs+1)*5 > len(s.slots)*4 {
		s.resize(s.nlive + 1)
	}
	n := len(s.slots)
	fp, mask := s.fingerprint(h), s.idxMask
	i, reuse := home(h, n), -1
	for {
		v := s.slots[i]
		if v == 0 {
			break
		}
		switch {
		case v&mask == 0:
			if reuse < 0 {
				reuse = i
			}
		case v&^mask == fp:
			if idx := int(v&mask) - 1; s.blocks[idx].key == key {
				s.stamp(idx)
				return idx
			}
		}
		if i++; i == n {
			i = 0
		}
	}
	if reuse >= 0 {
		i = reuse
		s.tombs--
	}
	var idx uint32
	if s.free != 0 {
		idx = s.free - 1
		s.free = s.blocks[idx].ext
		s.blocks[idx] = block{key: key}
	} else {
		idx = uint32(len(s.blocks))
		if len(s.blocks) == cap(s.blocks) {
			s.growBlocks()
		}
		s.blocks = append(s.blocks, block{key: key})
	}
	s.slots[i] = fp | (idx + 1)
	s.nlive++
	s.stamp(int(idx))
	s.charge(blockBytes)
	return int(idx)
}

// growBlocks doubles the slab's capacity. append would grow a large slab
// by a quarter, copying it about four times over and taking fresh memory
// five times its size on the way; doubling copies it about once and takes
// twice its size. The first touch of fresh memory (a page fault) costs more
// than storing a block, and the capacity not yet used is not touched.
func (s *stripe) growBlocks() {
	nb := make([]block, len(s.blocks), max(2*cap(s.blocks), 16))
	copy(nb, s.blocks)
	s.blocks = nb
	s.publishBlocks()
}

// resize rebuilds slots for want live keys at 64% load, dropping
// tombstones: growth steps are 25%, so the table never holds more than
// ~1.56 slots per key (≤ 6.25 B). It also re-splits the slot word: the slab
// index gets just enough bits for the slab to reach the next resize, the
// fingerprint the rest.
func (s *stripe) resize(want int) {
	n := want * 100 / 64
	if n < 8 {
		n = 8
	}
	// The slab grows only while the free list is empty, i.e. to at most
	// 80% of n blocks before the next resize.
	s.idxBits = 1
	for limit := uint64(max(len(s.blocks), n)) + 1; uint64(1)<<s.idxBits <= limit; {
		s.idxBits++
	}
	if s.idxBits > 31 { // 2^31 blocks (48 GiB) in one stripe
		panic("index: stripe too large; use more Options.Stripes")
	}
	s.idxMask = uint32(uint64(1)<<s.idxBits - 1)
	slots := make([]uint32, n)
	// Walk the slab rather than the old slots: sequential reads of keys
	// instead of one cache miss per entry.
	for idx := range s.blocks {
		b := &s.blocks[idx]
		if b.first.own == 0 { // free (a live block always has a holder here)
			continue
		}
		h := mix(b.key)
		i := home(h, n)
		for slots[i] != 0 {
			if i++; i == n {
				i = 0
			}
		}
		slots[i] = s.fingerprint(h) | uint32(idx+1)
	}
	s.slots, s.tombs = slots, 0
	s.publishSlots()
}

// deleteBlock removes an empty block from the index and puts its slab entry
// on the free list.
func (s *stripe) deleteBlock(idx int, h uint64) {
	n, mask := len(s.slots), s.idxMask
	i := home(h, n)
	for s.slots[i]&mask != uint32(idx+1) {
		if i++; i == n {
			i = 0
		}
	}
	s.slots[i] = s.tombstone()
	s.tombs++
	if b := &s.blocks[idx]; b.ext != 0 {
		s.freeExt(b.ext)
	}
	s.blocks[idx] = block{ext: s.free}
	s.free = uint32(idx + 1)
	s.nlive--
	s.charge(-blockBytes)
	if s.nlive == 0 {
		// Give everything back when a stripe empties (e.g. after a drop of
		// all owners); a steady-state cache never gets here.
		s.slots, s.blocks, s.free, s.ext, s.extFre, s.tombs = nil, nil, 0, nil, nil, 0
		s.publishSlots()
		s.publishBlocks()
		s.sets = holderSets{epoch: s.sets.epoch + 1}
		s.trimStamps(0)
		s.charge(0)
	} else if len(s.blocks) > 256 && s.nlive*4 < len(s.blocks) {
		s.compact()
	}
}

// compact moves live blocks down into free holes and reallocates the slab,
// the overflow handles and the index at their live size. Without it a
// stripe would keep its peak memory forever; it runs only after three
// quarters of the slab have been freed, so its cost is amortised over those
// deletions.
func (s *stripe) compact() {
	hole := 0
	for j := s.nlive; j < len(s.blocks); j++ {
		b := &s.blocks[j]
		if b.first.own == 0 {
			continue
		}
		for s.blocks[hole].first.own != 0 {
			hole++
		}
		// Repoint every owner's reverse-list entry; the index is rebuilt
		// from the slab below.
		if p := b.first; p.id() != 0 {
			s.owned[p.id().slot()][p.aux] = uint32(hole)
		}
		for _, p := range s.overflow(b) {
			if p.id() != 0 {
				s.owned[p.id().slot()][p.aux] = uint32(hole)
			}
		}
		s.blocks[hole] = *b
		s.moveStamp(hole, j)
	}
	blocks := make([]block, s.nlive)
	copy(blocks, s.blocks)
	var ext [][]pair
	for i := range blocks {
		if b := &blocks[i]; b.ext != 0 {
			ext = append(ext, s.ext[b.ext-1])
			b.ext = uint32(len(ext))
		}
	}
	s.blocks, s.free, s.ext, s.extFre = blocks, 0, ext, nil
	s.publishBlocks()
	s.trimStamps(s.nlive)
	s.resize(s.nlive)
}

// overflow returns the block's holders after the first.
func (s *stripe) overflow(b *block) []pair {
	if b.ext == 0 {
		return nil
	}
	return s.ext[b.ext-1]
}

// pairAt addresses a holder: k == -1 is the inline pair, k >= 0 overflow[k].
func (s *stripe) pairAt(b *block, k int) *pair {
	if k < 0 {
		return &b.first
	}
	return &s.ext[b.ext-1][k]
}

const noPair = -2

// findEngine returns the position of engine owner id's pair, or noPair.
func (s *stripe) findEngine(b *block, id OwnerID) int {
	if id == 0 { // the shared pseudo-owner is never an engine owner
		return noPair
	}
	if b.first.own != 0 && b.first.id() == id {
		return -1
	}
	for k, p := range s.overflow(b) {
		if p.id() == id {
			return k
		}
	}
	return noPair
}

// findShared returns the position of the shared pair for one tier bit.
func (s *stripe) findShared(b *block, bit uint32) int {
	if b.first.own == bit {
		return -1
	}
	for k, p := range s.overflow(b) {
		if p.own == bit {
			return k
		}
	}
	return noPair
}

// addPair appends a holder to the block and re-interns its holder list
// (a lone holder has none).
func (s *stripe) addPair(b *block, p pair) {
	if b.first.own == 0 {
		b.first = p
		return
	}
	if b.ext == 0 {
		if n := len(s.extFre); n > 0 {
			b.ext = s.extFre[n-1]
			s.extFre = s.extFre[:n-1]
		} else {
			s.ext = append(s.ext, nil)
			b.ext = uint32(len(s.ext))
		}
		s.charge(extBytes)
	}
	s.ext[b.ext-1] = append(s.ext[b.ext-1], p)
	s.charge(pairBytes)
	s.reinternAdded(b, p)
}

// removePair deletes the holder at k, keeping the inline pair filled while
// any overflow remains (so "first empty" means "block empty").
func (s *stripe) removePair(b *block, k int) {
	ov := s.overflow(b)
	last := len(ov) - 1
	switch {
	case last < 0:
		b.first = pair{}
		return
	case k < 0:
		b.first = ov[last]
	default:
		ov[k] = ov[last]
	}
	ov = ov[:last]
	s.ext[b.ext-1] = ov
	s.charge(-pairBytes)
	if last == 0 {
		s.freeExt(b.ext)
		b.ext = 0
	}
}

func (s *stripe) freeExt(e uint32) {
	if cap(s.ext[e-1]) > 8 {
		s.ext[e-1] = nil
	} else {
		s.ext[e-1] = s.ext[e-1][:0]
	}
	s.extFre = append(s.extFre, e)
	s.charge(-extBytes)
}

// union recomputes the tiers held by anyone.
func (s *stripe) union(b *block) uint8 {
	m := b.first.mask()
	for _, p := range s.overflow(b) {
		m |= p.mask()
	}
	return m
}

// setMask records the block's new union and adjusts per-tier key counts.
func (s *stripe) setMask(b *block, m uint8) {
	if d := b.mask() ^ m; d != 0 {
		for t := range numTiers {
			if d&(1<<t) != 0 {
				if m&(1<<t) != 0 {
					s.tierKeys[t]++
				} else {
					s.tierKeys[t]--
				}
			}
		}
		b.setMaskBits(m)
	}
}

// ownerAppend records that id holds slab index idx and returns its position.
func (s *stripe) ownerAppend(id OwnerID, idx int) uint32 {
	sl := id.slot()
	if sl >= len(s.owned) {
		owned := make([][]uint32, max(sl+1, 2*len(s.owned)))
		copy(owned, s.owned)
		s.owned = owned
	}
	s.owned[sl] = append(s.owned[sl], uint32(idx))
	s.charge(ownedBytes)
	s.groupsAppend(sl)
	return uint32(len(s.owned[sl]) - 1)
}

// ownerList returns the slab indices id holds in this stripe.
func (s *stripe) ownerList(id OwnerID) []uint32 {
	if sl := id.slot(); sl < len(s.owned) {
		return s.owned[sl]
	}
	return nil
}

// ownerRemoveAt deletes position pos of id's list by moving the last entry
// into it and fixing that entry's back-pointer.
func (s *stripe) ownerRemoveAt(id OwnerID, pos uint32) {
	sl := id.slot()
	list := s.owned[sl]
	last := len(list) - 1
	if int(pos) != last {
		moved := list[last]
		list[pos] = moved
		mb := &s.blocks[moved]
		s.pairAt(mb, s.findEngine(mb, id)).aux = pos
	}
	s.groupsRemoveAt(sl, pos, uint32(last))
	list = list[:last]
	if cap(list) > 64 && len(list)*4 < cap(list) {
		list = append([]uint32(nil), list...)
	}
	s.owned[sl] = list
	s.charge(-ownedBytes)
}

// settle refreshes a changed block's union mask and interned holder list,
// and deletes the block when nobody holds it any more.
func (s *stripe) settle(idx int, b *block) {
	s.setMask(b, s.union(b))
	s.reintern(b)
	if b.first.own == 0 {
		s.deleteBlock(idx, mix(b.key))
	}
}

// clearBudget bounds how many of an owner's blocks one write-lock hold of a
// stripe clears. Clearing a large owner's share of a stripe in one hold
// stalls a concurrent query, which walks the stripes in hash order and
// keeps running into the sweep (BenchmarkQueryDuringRemoval); a few
// hundred entries keep each hold short.
const clearBudget = 256

// clearOwner removes tiers from at most budget of the blocks id holds in this
// stripe, working down its list from position from (exclusive; -1 for the
// whole list), and returns the position to resume from, 0 once done. Between
// calls the caller releases the stripe; resuming is safe because only id's
// own writer changes id's list, and it is the one clearing.
func (s *stripe) clearOwner(id OwnerID, tiers uint8, from, budget int) int {
	list := s.ownerList(id)
	if len(list) == 0 || s.findEngine(&s.blocks[list[0]], id) == noPair {
		// Nothing held, or the slot's list belongs to a later generation
		// (a stale id): a slot is reissued only once fully cleaned, so one
		// entry tells whose list it is.
		return 0
	}
	if from < 0 || from > len(list) {
		from = len(list)
	}
	stop := max(0, from-budget)
	if tiers&engineBit == engineBit {
		// Everything goes: taking entries off the end of the list keeps
		// the others' positions, so no back-pointer needs fixing.
		for _, idx := range list[stop:from] {
			b := &s.blocks[idx]
			s.removePair(b, s.findEngine(b, id))
			s.settle(int(idx), b)
		}
		s.charge(-ownedBytes * int64(from-stop))
		if stop == 0 {
			s.owned[id.slot()] = nil
		} else {
			s.owned[id.slot()] = list[:stop]
		}
		s.groupsTruncate(id.slot(), stop)
		return stop
	}
	for i := from - 1; i >= stop; i-- {
		idx := s.owned[id.slot()][i]
		b := &s.blocks[idx]
		k := s.findEngine(b, id)
		p := s.pairAt(b, k)
		p.own &^= uint32(tiers)
		s.groupsClearTiers(id.slot(), uint32(i), tiers)
		if p.mask() == 0 {
			s.ownerRemoveAt(id, uint32(i))
			s.removePair(b, k)
		}
		s.settle(int(idx), b)
	}
	return stop
}
