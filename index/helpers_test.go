package index

import (
	"fmt"
	"slices"
	"testing"
	"unsafe"
)

// keyChain is a precomputed Chain that counts how often it was advanced.
type keyChain struct {
	keys  []uint64
	cov   []int // nil: every block covers 16 tokens
	i     int
	calls int
}

func (c *keyChain) Next() (uint64, int, bool) {
	c.calls++
	if c.i >= len(c.keys) {
		return 0, 0, false
	}
	k, cv := c.keys[c.i], 16
	if c.cov != nil {
		cv = c.cov[c.i]
	}
	c.i++
	return k, cv, true
}

func (c *keyChain) reset() { c.i, c.calls = 0, 0 }

func chainOf(keys ...uint64) *keyChain { return &keyChain{keys: keys} }

// checkInvariants verifies every internal cross-reference of the table:
// index <-> slab, union masks and tier counts, owner lists <-> pair back
// pointers, shared reference counts, free lists.
func checkInvariants(t testing.TB, tb *Table) {
	t.Helper()
	if err := invariantErr(tb); err != nil {
		t.Fatal(err)
	}
}

func invariantErr(tb *Table) error {
	for si := range tb.stripes {
		s := &tb.stripes[si]
		s.mu.RLock()
		err := stripeErr(tb, s)
		s.mu.RUnlock()
		if err != nil {
			return fmt.Errorf("stripe %d: %w", si, err)
		}
	}
	return nil
}

func stripeErr(tb *Table, s *stripe) error {
	if s.dead {
		if s.nlive != 0 || len(s.blocks) != 0 || s.sets.sets != nil || s.slotsLen.Load() != 0 {
			return fmt.Errorf("dead stripe keeps data")
		}
		return nil
	}
	inIndex := map[int]bool{}
	tombs := 0
	for _, v := range s.slots {
		if v == 0 {
			continue
		}
		if v == s.tombstone() {
			tombs++
			continue
		}
		idx := int(v&s.idxMask) - 1
		if idx < 0 || idx >= len(s.blocks) {
			return fmt.Errorf("slot %#x outside the slab (%d)", v, len(s.blocks))
		}
		if v&^s.idxMask != s.fingerprint(mix(s.blocks[idx].key)) {
			return fmt.Errorf("slot %#x has a stale fingerprint", v)
		}
		if inIndex[idx] {
			return fmt.Errorf("slab %d indexed twice", idx)
		}
		inIndex[idx] = true
		b := &s.blocks[idx]
		if got := s.find(b.key, mix(b.key)); got != idx {
			return fmt.Errorf("key %d not findable (%d vs %d)", b.key, got, idx)
		}
		if tb.stripeFor(mix(b.key)) != s {
			return fmt.Errorf("key %d in wrong stripe", b.key)
		}
	}
	if tombs != s.tombs {
		return fmt.Errorf("%d tombstones, counted %d", tombs, s.tombs)
	}
	if len(inIndex) != s.nlive {
		return fmt.Errorf("nlive %d, indexed %d", s.nlive, len(inIndex))
	}
	nfree := 0
	for f := s.free; f != 0; f = s.blocks[f-1].ext {
		if inIndex[int(f-1)] {
			return fmt.Errorf("live block %d on free list", f-1)
		}
		if nfree++; nfree > len(s.blocks) {
			return fmt.Errorf("free list cycle")
		}
	}
	if nfree+s.nlive != len(s.blocks) {
		return fmt.Errorf("slab %d = free %d + live %d?", len(s.blocks), nfree, s.nlive)
	}
	if n := len(s.slots); int64(n) != s.slotsLen.Load() || n > 0 && s.slotsAt.Load() != uintptr(unsafe.Pointer(&s.slots[0])) {
		return fmt.Errorf("prefetch mirror %#x+%d, slots %d", s.slotsAt.Load(), s.slotsLen.Load(), n)
	}
	var tiers [numTiers]int
	pairs := map[OwnerID]int{}
	refs := map[uint32]uint32{}
	for idx := range inIndex {
		b := &s.blocks[idx]
		if b.first.own == 0 {
			return fmt.Errorf("empty block %d indexed", idx)
		}
		all := append([]pair{b.first}, s.overflow(b)...)
		if b.ext != 0 && len(all) == 1 {
			return fmt.Errorf("block %d keeps an empty overflow", idx)
		}
		seen := map[uint32]bool{}
		var m uint8
		for _, p := range all {
			if p.mask() == 0 {
				return fmt.Errorf("block %d has a maskless pair", idx)
			}
			m |= p.mask()
			if p.id() == 0 {
				if p.mask() != bitShare && p.mask() != bitDisk || p.aux == 0 {
					return fmt.Errorf("bad shared pair %+v", p)
				}
				if seen[p.own] {
					return fmt.Errorf("duplicate shared pair")
				}
				seen[p.own] = true
				continue
			}
			if p.mask()&^engineBit != 0 {
				return fmt.Errorf("engine pair with shared bit %+v", p)
			}
			key := uint32(p.id()) << maskBits
			if seen[key] {
				return fmt.Errorf("owner %d twice on block %d", p.id(), idx)
			}
			seen[key] = true
			pairs[p.id()]++
			l := s.ownerList(p.id())
			if int(p.aux) >= len(l) || l[p.aux] != uint32(idx) {
				return fmt.Errorf("owner %d back pointer %d broken", p.id(), p.aux)
			}
			if !tb.registered(p.id()) {
				return fmt.Errorf("unregistered owner %d holds block %d", p.id(), idx)
			}
		}
		if m != b.mask() {
			return fmt.Errorf("block %d mask %b, union %b", idx, b.mask(), m)
		}
		if err := holderIDErr(s, b, all, refs); err != nil {
			return fmt.Errorf("block %d: %w", idx, err)
		}
		for k := range numTiers {
			if m&(1<<k) != 0 {
				tiers[k]++
			}
		}
	}
	if err := holderSetsErr(&s.sets, refs); err != nil {
		return err
	}
	if tiers != s.tierKeys {
		return fmt.Errorf("tierKeys %v, actual %v", s.tierKeys, tiers)
	}
	bySlot := map[int]int{}
	for id, n := range pairs {
		bySlot[id.slot()] += n
	}
	for sl, l := range s.owned {
		if len(l) != bySlot[sl] {
			return fmt.Errorf("slot %d list %d, pairs %d", sl, len(l), bySlot[sl])
		}
	}
	return nil
}

// readyChain is a keyChain whose first ready keys count as produced without
// hashing (a memo hit), so Query takes them in one batch (ReadyChain).
type readyChain struct {
	*keyChain
	ready int
}

func (c *readyChain) Ready() int { return max(0, c.ready-c.i) }

// asReady wraps c so its first ready keys are batched; ready 0 returns c
// itself. want is what a reference walk allows (see walkCalls), and the
// result is how many times the walk advances the chain.
func asReady(c *keyChain, ready, want int) (Chain, int) {
	calls := walkCalls(want, len(c.keys), ready)
	if ready == 0 {
		return c, calls
	}
	return &readyChain{c, ready}, calls
}

// hintedChain is a readyChain that hands its ready keys over in batches
// with block hints (BatchChain): right, stale or wrong ones, none of which
// may change an answer or how far the chain is advanced.
type hintedChain struct {
	*readyChain
	hints []uint32
}

func (c *hintedChain) TakeReady(n int, keys []uint64, covs []int, hints []uint32) ([]uint64, []int, []uint32) {
	for range min(n, c.Ready()) {
		i := c.i
		k, cov, _ := c.Next()
		keys, covs, hints = append(keys, k), append(covs, cov), append(hints, c.hints[i])
	}
	return keys, covs, hints
}

// hintModes are the hints a test chain carries: none, those Locate gives
// now, those it gave some time before (stale), and arbitrary ones.
const (
	hintsNone = iota
	hintsNow
	hintsStale
	hintsWrong
	numHintModes
)

// hintsFor returns the hints of keys under mode, drawing arbitrary ones
// from r; stale maps keys to hints located earlier, and takes the ones
// located now.
func hintsFor(tb *Table, keys []uint64, mode int, stale map[uint64]uint32, r func(n int) int) []uint32 {
	now := make([]uint32, len(keys))
	tb.Locate(keys, now)
	defer func() {
		for i, k := range keys {
			stale[k] = now[i]
		}
	}()
	switch mode {
	case hintsNow:
		return now
	case hintsStale:
		old := make([]uint32, len(keys))
		for i, k := range keys {
			old[i] = stale[k]
		}
		return old
	case hintsWrong:
		h := make([]uint32, len(keys))
		for i := range h {
			h[i] = uint32(r(64))
		}
		return h
	}
	return nil
}

// asHinted is asReady with block hints (nil: none) on the batched keys.
func asHinted(c *keyChain, ready, want int, hints []uint32) (Chain, int) {
	ch, calls := asReady(c, ready, want)
	if rc, ok := ch.(*readyChain); ok && hints != nil {
		return &hintedChain{rc, hints}, calls
	}
	return ch, calls
}

// walkCalls is how many times a walk advances a chain of n keys whose first
// ready keys come as a batch, given decide, the number of blocks it
// decides on: up to and including the block that ends the walk, n+1 when
// the chain runs out (its last Next says so), 0 when no owner is reported.
// A batch takes all its ready keys and looks no further; key by key the
// walk hashes one block ahead (walkKeys).
func walkCalls(decide, n, ready int) int {
	switch {
	case decide == 0:
		return 0
	case decide <= ready:
		return min(ready, n+1)
	default:
		return min(decide+1, n+1)
	}
}

// holderIDErr checks that block b, whose holders are all, refers to the
// interned list of exactly its holders' words, or to none when it has a
// single holder (or more than are interned), and counts the reference.
func holderIDErr(s *stripe, b *block, all []pair, refs map[uint32]uint32) error {
	id := b.holderID()
	if len(all) == 1 || len(all) > maxInternedHolders {
		if id != 0 {
			return fmt.Errorf("%d holders but holder list %d", len(all), id)
		}
		return nil
	}
	if id == 0 || int(id) > len(s.sets.sets) {
		return fmt.Errorf("%d holders, holder list id %d of %d", len(all), id, len(s.sets.sets))
	}
	var want []uint32
	for _, p := range all {
		want = append(want, p.own)
	}
	slices.Sort(want)
	if got := s.sets.wordsOf(id); !slices.Equal(got, want) {
		return fmt.Errorf("holder list %d is %x, holders %x", id, got, want)
	}
	refs[id]++
	return nil
}

// holderSetsErr checks reference counts, the free list and the hash chains.
func holderSetsErr(hs *holderSets, refs map[uint32]uint32) error {
	free := map[uint32]bool{}
	for _, id := range hs.free {
		if free[id] || hs.sets[id-1].words != nil {
			return fmt.Errorf("holder list %d on the free list twice or live", id)
		}
		free[id] = true
	}
	chained := 0
	for h, head := range hs.byHash {
		for id := head; id != 0; id = hs.sets[id-1].next {
			if set := hs.sets[id-1]; set.hash != h || set.words == nil || hashWords(set.words) != h {
				return fmt.Errorf("holder list %d misfiled under hash %x", id, h)
			}
			if chained++; chained > len(hs.sets) {
				return fmt.Errorf("holder list hash chain cycle")
			}
		}
	}
	live, unused := 0, 0
	for i, set := range hs.sets {
		id := uint32(i + 1)
		if free[id] {
			continue
		}
		live++
		if set.refs == 0 {
			unused++
		}
		if set.refs != refs[id] {
			return fmt.Errorf("holder list %d has %d references, %d blocks", id, set.refs, refs[id])
		}
	}
	if live != chained {
		return fmt.Errorf("%d live holder lists, %d reachable by hash", live, chained)
	}
	if unused != hs.unused {
		return fmt.Errorf("%d unreferenced holder lists, counted %d", unused, hs.unused)
	}
	return nil
}
