package index

// Block hints (docs/architecture.md#verified-links): a lookup that knows
// where a key's block lay in its stripe's slab checks that entry first and
// skips the probe of the slot table. On a table larger than the CPU's
// caches that is one cache miss per block instead of two, and the entry
// can be requested before the stripe is locked (prefetchAt), so a batch's
// misses overlap.
//
// A hint is the block's slab index plus one (0: none). Slab indices are
// stable while a block lives (the owners' reverse lists rely on that), and
// change only when the block is deleted or the stripe compacted; a hint is
// only ever trusted after holdsAt has compared the key under the stripe's
// lock, so a stale or foreign hint costs one wasted line and the usual
// probe, never a wrong answer. Verified links keep one per block
// (hashing.Links), the one Store returned when ingest stored it.

// Locate writes to hints[i] the hint of keys[i]'s block (its slab index
// plus one), or 0 when no block of that key is held, for a caller that did
// not store the keys itself (Store gives the hint on the way). hints
// must be at least as long as keys.
func (t *Table) Locate(keys []uint64, hints []uint32) {
	hints = hints[:len(keys)]
	for i, k := range keys {
		h := mix(k)
		s := t.stripeFor(h)
		s.mu.RLock()
		idx := -1
		if !s.dead {
			idx = s.find(k, h)
		}
		s.mu.RUnlock()
		hints[i] = uint32(idx + 1)
	}
}
