package index

import (
	"runtime"
	"time"
)

// The evictor (docs/index-memory.md#eviction): one goroutine per bounded
// index, woken when the accounted total reaches the high watermark. A round
// advances the recency clock (so entries stored from then on are newer than
// anything it may evict), reads every stripe's stamps under its read lock
// into a histogram of ages, picks the youngest age whose elder entries add
// up to what must go, then evicts every entry of that age or older, stripe
// by stripe, at most evictChunk entries per write-lock hold.

// evictChunk bounds the entries one write-lock hold evicts, and scanChunk
// the slab entries it reads, and histChunk the recency stamps read per
// read-lock hold: each hold stays short, so a query never waits long for
// eviction.
const (
	evictChunk = 256
	scanChunk  = 4096
	histChunk  = 16384
)

// maxAge is the histogram's last bucket; older entries share it.
const maxAge = 1023

// attach connects a new table's stripes to the index's budget and charges
// the table's fixed cost.
func (ix *Index) attach(t *Table, kind EvictionKind) {
	for i := range t.stripes {
		t.stripes[i].acct = acct{bud: ix.bud, kind: kind}
	}
	ix.bud.add(int64(len(t.stripes)) * stripeBytes)
}

// detach gives back a dropped table's fixed cost (its stripes gave back
// their entries' in drop).
func (ix *Index) detach(t *Table) {
	ix.bud.add(-int64(len(t.stripes)) * stripeBytes)
}

// runEvictor is the evictor goroutine; budget.close stops it.
func (ix *Index) runEvictor() {
	b := ix.bud
	defer close(b.done)
	for {
		select {
		case <-b.stop:
			return
		case <-b.kick:
		}
		for b.used.Load() > b.low {
			if ix.evictRound() == 0 {
				// Nothing evictable is left (the total is fixed costs and
				// charged tables): stop making writers wait until
				// something is stored again.
				b.stuck.Store(true)
				break
			}
			select {
			case <-b.stop:
				b.signal()
				return
			default:
			}
		}
		b.signal()
	}
}

// evictRound evicts the oldest entries until the total is at the low
// watermark or everything older than the round's start is gone, and
// returns how many it evicted.
func (ix *Index) evictRound() int {
	b := ix.bud
	now := b.epoch.Add(1) - 1 // entries stored from here on are younger
	tables := ix.allTables()
	var hist [maxAge + 1]int
	total := 0
	for _, t := range tables {
		for i := range t.stripes {
			s := &t.stripes[i]
			// In holds of histChunk entries: a writer waiting for the
			// stripe holds up the readers behind it (RWMutex), so no hold
			// may be long, however large the stripe.
			for from, done := 0, false; !done; from += histChunk {
				s.mu.RLock()
				n := min(len(s.acct.stamps), len(s.blocks))
				if s.dead || from >= n {
					done = true
				} else {
					for idx, st := range s.acct.stamps[from:min(from+histChunk, n)] {
						if s.blocks[from+idx].first.own == 0 || st > now {
							continue
						}
						hist[min(now-st, maxAge)]++
						total++
					}
				}
				s.mu.RUnlock()
			}
		}
	}
	if total == 0 {
		return 0
	}
	// How many entries must go, at the average accounted size of one.
	used := b.used.Load()
	excess := used - b.low
	if excess <= 0 {
		return 0
	}
	per := max(used/int64(total), 1)
	want := int((excess + per - 1) / per)
	cut, n := uint32(maxAge), 0
	for age := maxAge; age >= 0; age-- {
		n += hist[age]
		cut = uint32(age)
		if n >= want {
			break
		}
	}
	// Evict stamps <= now - cut (cut can be 0: everything up to now).
	limit := now - min(cut, now)
	evicted := 0
	for _, t := range tables {
		for i := range t.stripes {
			evicted += t.evictStripe(&t.stripes[i], limit)
			if b.used.Load() <= b.low {
				return max(evicted, 1)
			}
		}
	}
	return evicted
}

// allTables lists the contexts' and scopes' tables.
func (ix *Index) allTables() []*Table {
	var out []*Table
	for t := range ix.All() {
		out = append(out, t)
	}
	for _, t := range ix.scopes.load() {
		out = append(out, t)
	}
	return out
}

// evictStripe evicts every entry of s stamped at or before limit, in holds
// of at most evictChunk evictions and scanChunk slab entries.
func (t *Table) evictStripe(s *stripe, limit uint32) int {
	evicted := 0
	for from := 0; ; {
		s.mu.Lock()
		held := time.Now()
		if s.dead || from >= len(s.blocks) {
			s.mu.Unlock()
			return evicted
		}
		end, n := min(from+scanChunk, len(s.blocks)), 0
		for from < end && n < evictChunk {
			idx := from
			from++
			if s.blocks[idx].first.own == 0 || idx >= len(s.acct.stamps) || s.acct.stamps[idx] > limit {
				continue
			}
			if n == 0 {
				t.changing(s)
			}
			slab := len(s.blocks)
			t.evictBlock(s, idx)
			n++
			if len(s.blocks) != slab {
				// The stripe compacted (or emptied): live entries moved
				// down, so scan it again from the start.
				from = 0
				break
			}
		}
		s.flush()
		s.mu.Unlock()
		if d := int64(time.Since(held)); d > t.ix.bud.longestHold.Load() {
			t.ix.bud.longestHold.Store(d) // the evictor is the only writer
		}
		evicted += n
		if n > 0 {
			t.ix.bud.evictions[s.acct.kind].Add(uint64(n))
			t.ix.bud.signal()
			runtime.Gosched()
		}
	}
}

// evictBlock removes every holder of block idx, as if each had announced
// its removal: engine holders leave their reverse lists, shared references
// all go at once. The caller holds s's write lock and has called changing.
func (t *Table) evictBlock(s *stripe, idx int) {
	b := &s.blocks[idx]
	key := b.key
	for k := -1; k < len(s.overflow(b)); k++ {
		if p := *s.pairAt(b, k); p.id() != 0 {
			s.ownerRemoveAt(p.id(), p.aux)
			t.notify(KeyEvicted, p.id(), key)
		} else {
			s.evictRefs(refKey{key, p.own & tierBits})
			t.notify(KeyEvicted, 0, key)
		}
	}
	for b.first.own != 0 {
		s.removePair(b, -1)
	}
	s.settle(idx, b)
}
