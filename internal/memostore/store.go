// Package memostore keeps the entries of a query memo: immutable records of
// recent queries, each filed under fingerprints of its first 1, 2, 4, …
// units and of the whole query it came from, held within a byte budget and
// evicted roughly oldest first.
//
// Two memos use it: the token memo both doors share (tokenmemo), which
// remembers decoded token arrays by their packed bytes with the
// byte-level helpers of packed.go, and the prefix memo (hashing), which
// remembers digest chains by their tokens. They differ in what an entry holds and how a candidate is
// verified, not in how entries are filed, bounded, counted and retired,
// which is what lives here.
package memostore

import (
	"sync"
	"sync/atomic"
)

// shards spreads fingerprints over independently locked maps, so queries
// looking up different prompts do not contend.
const shards = 64

// BucketCap bounds the entries filed under one fingerprint (one system
// prompt continued by many conversations); the newest are kept. An entry
// dropped from a shallow bucket stays reachable through its deeper ones.
const BucketCap = 8

// Record is the bookkeeping every entry carries. Fps and Size are set before
// the entry is inserted and never change after.
type Record struct {
	// Fps are the fingerprints the entry is filed under, shallowest first
	// (a memo's whole-query fingerprint last).
	Fps []uint64
	// Size is the memory the entry accounts for against the budget.
	Size int
	dead atomic.Bool
}

// Dead reports whether the entry was evicted, superseded or reset. A
// lookup may still hold and use a dead entry: entries are immutable.
func (r *Record) Dead() bool { return r.dead.Load() }

// Entry is a pointer to a memo's entry type, which embeds a Record.
type Entry interface {
	comparable
	Rec() *Record
}

type shard[E Entry] struct {
	mu      sync.RWMutex
	buckets map[uint64][]E
	order   []E // entries this shard accounts for, oldest first
}

// Store is a bounded set of entries; the zero Store is not usable, see New.
// Safe for concurrent use. A memo is a type defined on a Store (type Memo
// memostore.Store[*entry]), so a nil memo is a nil store, and Reset,
// Bytes and Stats, nil-safe here, are written once for all of them.
//
// The budget is the store's, not a shard's: a long prompt's entry (a
// 128K-token array is over a megabyte) may be larger than a 64th of it,
// and would never be kept under per-shard budgets. Each entry is accounted
// in one shard; an insert that takes the store over budget evicts the
// oldest entries of its own shard first, then of the others in turn.
type Store[E Entry] struct {
	shards [shards]shard[E]
	budget int64         // bytes in all
	bytes  atomic.Int64  // accounted in all shards
	next   atomic.Uint32 // the shard the next eviction sweep starts after its own
	// resetMu keeps Reset and Insert apart (inserts share it). An insert
	// files an entry shard by shard and only then orders it for the
	// budget; a Reset sweeping the shards in between would mark it dead
	// through the order yet leave it filed where it had already passed,
	// outside any budget.
	resetMu sync.RWMutex
	// hits and misses are the memo's counts (Count, Stats).
	hits, misses atomic.Uint64
}

// MinBytes is the smallest budget New grants.
const MinBytes = 4 << 20

// New returns a store holding about maxBytes of entries (at least
// MinBytes): at most that plus the entry being inserted.
func New[E Entry](maxBytes int) *Store[E] {
	s := &Store[E]{budget: int64(max(maxBytes, MinBytes))}
	for i := range s.shards {
		s.shards[i].buckets = make(map[uint64][]E)
	}
	return s
}

// Lookup calls f with each live entry filed under fp, under the shard's
// read lock, until f returns false. f must not call back into the store.
func (s *Store[E]) Lookup(fp uint64, f func(E) bool) {
	sh := &s.shards[fp%shards]
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	for _, e := range sh.buckets[fp] {
		if !f(e) {
			return
		}
	}
}

// Insert files e under each of its fingerprints, then retires the entries
// that e supersedes (extends(old) reports that e holds everything old does)
// and the oldest ones over the budget. Shard locks are taken one at a time,
// never nested, and extends runs under one of them.
func (s *Store[E]) Insert(e E, extends func(old E) bool) {
	fps := e.Rec().Fps
	if len(fps) == 0 || int64(e.Rec().Size) > s.budget {
		return // nothing to file it under, or it could never be kept
	}
	s.resetMu.RLock()
	defer s.resetMu.RUnlock()
	var retired []E
	for _, fp := range fps {
		sh := &s.shards[fp%shards]
		sh.mu.Lock()
		old := sh.buckets[fp]
		kept := make([]E, 0, min(len(old)+1, BucketCap))
		kept = append(kept, e)
		for _, o := range old {
			switch {
			case o.Rec().Dead():
			case o != e && extends(o):
				retired = append(retired, o)
			case len(kept) == BucketCap:
			default:
				kept = append(kept, o)
			}
		}
		sh.buckets[fp] = kept
		sh.mu.Unlock()
	}
	if e.Rec().Dead() {
		// Superseded by a concurrent insert while it was being filed:
		// that insert's retire may have swept the buckets before e
		// reached them all, so e leaves them itself.
		s.unfile(e)
		for _, o := range retired {
			s.retire(o)
		}
		return
	}
	// The entry is accounted in the shard of its deepest fingerprint: the
	// shallow ones are shared by every prompt with the same opening, and
	// would pile a whole fleet's entries into one shard.
	home := int(fps[len(fps)-1] % shards)
	sh := &s.shards[home]
	sh.mu.Lock()
	sh.order = append(sh.order, e)
	s.bytes.Add(int64(e.Rec().Size))
	retired = sh.evict(retired, s, false, e)
	sh.mu.Unlock()
	// Over budget: the oldest entries go, this shard's first, then the
	// other shards' in turn (one lock at a time); e itself stays.
	for i := 0; i < shards && s.bytes.Load() > s.budget; i++ {
		sh := &s.shards[home]
		if i > 0 {
			sh = &s.shards[(home+int(s.next.Add(1)))%shards]
		}
		sh.mu.Lock()
		retired = sh.evict(retired, s, true, e)
		sh.mu.Unlock()
	}
	for _, o := range retired {
		s.retire(o)
	}
}

// evict pops the shard's dead entries at the head of its order and, when
// overBudget, its oldest live ones while the store is over budget, stopping
// at keep (the entry being inserted); the popped entries are appended to
// retired. It must be called with the shard's lock held.
func (sh *shard[E]) evict(retired []E, s *Store[E], overBudget bool, keep E) []E {
	var zero E
	for len(sh.order) > 0 && sh.order[0] != keep &&
		(sh.order[0].Rec().Dead() || overBudget && s.bytes.Load() > s.budget) {
		o := sh.order[0]
		sh.order[0] = zero
		sh.order = sh.order[1:]
		s.bytes.Add(-int64(o.Rec().Size))
		retired = append(retired, o)
	}
	if cap(sh.order) > 2*len(sh.order)+64 {
		sh.order = append([]E(nil), sh.order...)
	}
	return retired
}

// retire marks o dead and removes it from every bucket it is filed under,
// so nothing but the budget's eviction order still references it (its
// bytes leave the budget when that order reaches it). It must be called
// with no shard lock held.
func (s *Store[E]) retire(o E) {
	if !o.Rec().dead.Swap(true) {
		s.unfile(o)
	}
}

// unfile removes o from every bucket it is filed under.
func (s *Store[E]) unfile(o E) {
	for _, fp := range o.Rec().Fps {
		sh := &s.shards[fp%shards]
		sh.mu.Lock()
		b := sh.buckets[fp]
		for i, x := range b {
			if x == o {
				b = append(b[:i:i], b[i+1:]...)
				break
			}
		}
		if len(b) == 0 {
			delete(sh.buckets, fp)
		} else {
			sh.buckets[fp] = b
		}
		sh.mu.Unlock()
	}
}

// Reset forgets every entry, so memory returns to its idle size. Lookups
// running meanwhile are unaffected: an entry they hold stays valid. The
// hit and miss counts go on. A nil store (a memo turned off) has nothing
// to forget.
func (s *Store[E]) Reset() {
	if s == nil {
		return
	}
	s.resetMu.Lock()
	defer s.resetMu.Unlock()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.order {
			e.Rec().dead.Store(true)
		}
		sh.buckets = make(map[uint64][]E)
		sh.order = nil
		sh.mu.Unlock()
	}
	s.bytes.Store(0) // no insert runs: it would hold resetMu
}

// Bytes returns the memory the entries account for: it grows to the budget
// under varied traffic and drops to zero after Reset (0 for a nil store).
func (s *Store[E]) Bytes() int {
	if s == nil {
		return 0
	}
	return int(s.bytes.Load())
}

// Count adds to the memo's hit and miss counts, in the unit its Stats
// document (tokens, digests, lookups).
func (s *Store[E]) Count(hits, misses uint64) {
	if hits != 0 {
		s.hits.Add(hits)
	}
	if misses != 0 {
		s.misses.Add(misses)
	}
}

// Stats returns the counts Count added up (0, 0 for a nil store).
func (s *Store[E]) Stats() (hits, misses uint64) {
	if s == nil {
		return 0, 0
	}
	return s.hits.Load(), s.misses.Load()
}

// FiledUnder returns the fingerprints of an entry that covers the first n
// of a query's fingerprinted depths (shallowest first): those n, and the
// query's deepest, its whole-query fingerprint, when it is not among them.
// Filing under the whole query lets the same query find the entry again
// even when every depth it covers is shared by many prompts, whose
// buckets keep only their newest BucketCap entries.
func FiledUnder(fps []uint64, n int) []uint64 {
	out := append(make([]uint64, 0, n+1), fps[:n]...)
	if n < len(fps) {
		out = append(out, fps[len(fps)-1])
	}
	return out
}

// CommonPrefix is the length of the longest common prefix of a and b, the
// exact check both memos make of a candidate entry. It compares in large
// chunks first: string equality is memcmp, far faster than a byte loop.
func CommonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	lo := 0
	for step := 4096; step >= 1; step /= 8 {
		for lo+step <= n && string(a[lo:lo+step]) == string(b[lo:lo+step]) {
			lo += step
		}
	}
	return lo
}
