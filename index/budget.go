package index

import (
	"sync"
	"sync/atomic"
	"time"
)

// The index's memory budget (docs/index-memory.md). Every stripe counts
// the bytes its entries account for (acct.bytes, under the stripe lock) and
// passes the changes on to the index's budget in batches of flushBytes, so
// the hot path pays a plain addition per structural change and an atomic
// add only once per flushBytes. When the accounted total reaches
// highWater of the limit the evictor (evict.go) wakes and removes the
// least recently stored entries until the total is back at lowWater;
// writers that would add entries while the total is at hardWater wait for
// it (queries never wait: the evictor holds a stripe's write lock for at
// most evictChunk entries at a time).

// Accounted costs, in bytes. They are the live share of each structure
// (docs/index-memory.md#what-is-counted): slack of slices that grew by
// doubling, slab entries on a free list and the slot table's 64-80 % load
// are not counted, which is why the resident size may reach about twice
// the accounted one.
const (
	// blockBytes: a slab entry (24), its share of the slot table (~6)
	// and its recency stamp (4).
	blockBytes = 24 + 6 + 4
	// pairBytes: a holder beyond the first, in the block's overflow list.
	pairBytes = 8
	// extBytes: the overflow list's slice header, for a block with more
	// than one holder.
	extBytes = 24
	// ownedBytes: an engine holder's entry in its owner's reverse list.
	ownedBytes = 4
	// holderSetBytes: an interned holder list besides its words (the set
	// record and its map entry).
	holderSetBytes = 96
	// stripeBytes: a table's fixed cost per stripe (the stripe record and
	// its share of the table's registration state).
	stripeBytes = 320
)

// flushBytes is how far a stripe's unflushed change may grow before it is
// added to the budget's total.
const flushBytes = 1 << 10

// Watermarks, in per mille of the limit.
const (
	highWater = 950 // the evictor wakes
	hardWater = 980 // writers adding entries wait for the evictor
	lowWater  = 900 // the evictor stops
)

// epochsPerLimit is how many recency epochs fill the budget: the clock
// advances once per limit/epochsPerLimit bytes accounted, so "oldest" is
// resolved to about 1/64 of the budget's worth of stores.
const epochsPerLimit = 64

// EvictionKind says what kind of table an eviction came from, the label of
// conductor_index_evictions_total.
type EvictionKind uint8

const (
	// EvictedContext counts blocks evicted from engine contexts.
	EvictedContext EvictionKind = iota
	// EvictedScope counts blocks evicted from producer-fed scopes.
	EvictedScope
	numEvictionKinds
)

// String is the metric label.
func (k EvictionKind) String() string {
	if k == EvictedScope {
		return "scope"
	}
	return "context"
}

// EvictionKinds lists every kind, so exporters report each at zero.
var EvictionKinds = [...]EvictionKind{EvictedContext, EvictedScope}

// budget is an index's accounted memory and its limit.
type budget struct {
	limit           int64 // bytes; 0 is unbounded
	high, hard, low int64
	epochStep       int64
	used            atomic.Int64
	peak            atomic.Int64
	epoch           atomic.Uint32
	sinceEpoch      atomic.Int64
	evictions       [numEvictionKinds]atomic.Uint64
	// longestHold is the longest write-lock hold of an eviction chunk, in
	// nanoseconds: the most a query waited for eviction.
	longestHold atomic.Int64

	kick chan struct{} // wakes the evictor; capacity 1
	stop chan struct{}
	done chan struct{}

	// mu guards progress, closed when the evictor has made progress
	// (or given up), to wake writers waiting at hardWater.
	mu       sync.Mutex
	progress chan struct{}
	stuck    atomic.Bool // the evictor found nothing to evict over the limit
	closed   bool
}

func newBudget(limit int64) *budget {
	b := &budget{limit: max(limit, 0)}
	if b.limit > 0 {
		b.high = b.limit * highWater / 1000
		b.hard = b.limit * hardWater / 1000
		b.low = b.limit * lowWater / 1000
		b.epochStep = max(b.limit/epochsPerLimit, 1)
		b.kick = make(chan struct{}, 1)
		b.stop = make(chan struct{})
		b.done = make(chan struct{})
		b.progress = make(chan struct{})
	}
	b.epoch.Store(1)
	return b
}

// bounded reports whether entries are stamped and evicted.
func (b *budget) bounded() bool { return b != nil && b.limit > 0 }

// add applies a flushed change to the total, advances the recency clock by
// what was added, and wakes the evictor at the high watermark.
func (b *budget) add(d int64) {
	u := b.used.Add(d)
	if b.limit == 0 {
		return
	}
	if d > 0 {
		if b.stuck.Load() {
			b.stuck.Store(false)
		}
		for p := b.peak.Load(); u > p && !b.peak.CompareAndSwap(p, u); p = b.peak.Load() {
		}
		if b.sinceEpoch.Add(d) >= b.epochStep {
			b.sinceEpoch.Store(0)
			b.epoch.Add(1)
		}
	}
	if u >= b.high && !b.stuck.Load() {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// admit is called by a writer that may add entries, holding no lock: at
// the hard watermark it waits until the evictor has brought the total
// down, has found nothing more to evict, or is closed.
func (b *budget) admit() {
	if b == nil || b.limit == 0 {
		return
	}
	for b.used.Load() >= b.hard && !b.stuck.Load() {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		ch := b.progress
		b.mu.Unlock()
		select {
		case b.kick <- struct{}{}:
		default:
		}
		<-ch
	}
}

// signal wakes the writers waiting in admit.
func (b *budget) signal() {
	b.mu.Lock()
	if !b.closed {
		close(b.progress)
		b.progress = make(chan struct{})
	}
	b.mu.Unlock()
}

// close stops the evictor and releases every waiting writer for good.
func (b *budget) close() {
	if !b.bounded() {
		return
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.done
		return
	}
	b.closed = true
	close(b.progress)
	b.mu.Unlock()
	close(b.stop)
	<-b.done
}

// acct is a stripe's share of the budget, under the stripe's lock.
type acct struct {
	bud *budget // nil for a table built without an index
	// bytes is what the stripe's entries account for; pend is the part
	// not yet added to bud; sets is the holder sets' bytes last seen.
	bytes, pend, sets int64
	// stamps[i] is the recency epoch at which slab entry i was last
	// stored or re-announced (bounded budgets only).
	stamps []uint32
	kind   EvictionKind
}

// charge records a change of n accounted bytes in s.
func (s *stripe) charge(n int64) {
	a := &s.acct
	if d := s.sets.bytes - a.sets; d != 0 {
		a.sets = s.sets.bytes
		n += d
	}
	a.bytes += n
	a.pend += n
	if a.bud != nil && (a.pend >= flushBytes || a.pend <= -flushBytes) {
		a.bud.add(a.pend)
		a.pend = 0
	}
}

// flush passes every unflushed change on to the budget.
func (s *stripe) flush() {
	s.charge(0)
	if a := &s.acct; a.bud != nil && a.pend != 0 {
		a.bud.add(a.pend)
		a.pend = 0
	}
}

// stamp records that slab entry idx was stored or re-announced now.
func (s *stripe) stamp(idx int) {
	a := &s.acct
	if !a.bud.bounded() {
		return
	}
	if idx >= len(a.stamps) {
		// Grow with the slab, not by doubling on its own.
		n := max(cap(s.blocks), idx+1)
		if n <= cap(a.stamps) {
			a.stamps = a.stamps[:n]
		} else {
			grown := make([]uint32, n)
			copy(grown, a.stamps)
			a.stamps = grown
		}
	}
	a.stamps[idx] = a.bud.epoch.Load()
}

// moveStamp follows compact moving slab entry from to to.
func (s *stripe) moveStamp(to, from int) {
	if a := &s.acct; from < len(a.stamps) {
		a.stamps[to] = a.stamps[from]
	}
}

// trimStamps follows the slab shrinking to n entries (compact, emptying).
func (s *stripe) trimStamps(n int) {
	a := &s.acct
	if n == 0 {
		a.stamps = nil
	} else if n < len(a.stamps) {
		a.stamps = append([]uint32(nil), a.stamps[:n]...)
	}
}

// releaseAll gives back everything the stripe accounted for (a dropped
// table, an emptied stripe keeps its stripe record).
func (s *stripe) releaseAll() {
	a := &s.acct
	s.charge(0)
	if a.bud != nil {
		a.bud.add(-(a.bytes - a.pend)) // pend never reached it
	}
	a.bytes, a.pend, a.sets, a.stamps = 0, 0, 0, nil
}

// MemoryBytes is the index's accounted memory: every context's and
// producer scope's stripes, blocks, holders, reverse lists and holder
// sets. Stripes
// pass on their changes in batches, so it may lag the exact sum by up to
// flushBytes per stripe.
func (ix *Index) MemoryBytes() int64 { return ix.bud.used.Load() }

// PeakMemoryBytes is the highest MemoryBytes seen while bounded.
func (ix *Index) PeakMemoryBytes() int64 { return ix.bud.peak.Load() }

// LongestEvictionHold is the longest a stripe's write lock was held by
// one eviction chunk, which bounds how long a query waited for eviction.
func (ix *Index) LongestEvictionHold() time.Duration {
	return time.Duration(ix.bud.longestHold.Load())
}

// MemoryLimit is the budget in bytes, 0 when unbounded.
func (ix *Index) MemoryLimit() int64 { return ix.bud.limit }

// Evictions returns how many blocks the budget has evicted from tables of
// kind k.
func (ix *Index) Evictions(k EvictionKind) uint64 { return ix.bud.evictions[k].Load() }

// admit lets a writer that may add entries wait for the evictor when the
// budget is full (see budget.admit).
func (t *Table) admit() {
	if t.ix != nil {
		t.ix.bud.admit()
	}
}

// EstimateBytes is the least a table of blocks distinct keys and pairs
// (block, owner) pairs accounts for once stored: a snapshot's size against
// the budget (docs/index-memory.md#snapshots-and-peers). Shared tiers and
// holder sets add to it, so a snapshot within it may still evict a little.
func EstimateBytes(blocks, pairs int64) int64 {
	return blocks*blockBytes + pairs*ownedBytes + max(pairs-blocks, 0)*pairBytes
}

// EstimateRefBytes is the least an owned shared reference whose owner's
// record accounts for cost bytes adds once taken (Acquire), not
// counting its block or its holder's list, which other references may
// share.
func EstimateRefBytes(cost int64) int64 { return max(cost, 0) + refSlotBytes }
