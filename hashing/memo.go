package hashing

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Memo remembers the digest chains of recent queries, so that a warm query
// (a system prompt shared by thousands of requests, the next turn of a
// conversation) reuses the digests of the longest prefix it shares with one
// of them instead of hashing those blocks again.
//
// Entries are found by a fingerprint of everything that starts a chain —
// encoding, block size, root digest, LoRA name, salt and the tokens of the
// first block — and then verified exactly: the header fields are compared,
// and only blocks whose tokens lie inside the common token prefix (compared
// with memcmp) are reused. A reused digest is therefore exactly the one
// SHA-256 would produce; a per-block memo was tried first and lost to
// hashing on SHA-NI hardware, because it paid two random memory reads per
// block, while this pays one lookup and one sequential comparison per query.
//
// Memory is bounded by a byte budget per shard with oldest-first eviction;
// entries hold only pointer-free slices, so the garbage collector never
// scans their contents. Safe for concurrent use.
type Memo struct {
	shards [memoShards]memoShard
	budget int // bytes per shard
	hits   atomic.Uint64
	misses atomic.Uint64
}

const (
	memoShards = 64
	// memoBucket bounds the chains kept per first block (e.g. one system
	// prompt continued by many conversations); the newest are kept.
	memoBucket = 8
	// MaxMemoNames bounds len(lora)+len(salt) of memoized queries.
	MaxMemoNames  = 4096
	entryOverhead = 160
)

type memoShard struct {
	mu      sync.RWMutex
	buckets map[uint64][]*prefixEntry
	order   []*prefixEntry // insertion order, for eviction
	bytes   int
}

// prefixEntry is one remembered chain. It is immutable once published.
type prefixEntry struct {
	fp      uint64
	kind    kind
	bs      int
	root    [32]byte
	lora    string
	salt    string
	tokens  []int32    // every token the stored blocks read
	digests [][32]byte // D_0 … D_{m-1}, full blocks only
	dead    bool       // evicted or superseded (under the shard lock)
}

func (e *prefixEntry) size() int {
	return entryOverhead + 4*len(e.tokens) + 32*len(e.digests) + len(e.lora) + len(e.salt)
}

// NewMemo returns a memo that holds about maxBytes of chains; maxBytes <= 0
// returns nil, which disables memoization.
func NewMemo(maxBytes int) *Memo {
	if maxBytes <= 0 {
		return nil
	}
	m := &Memo{budget: max(maxBytes/memoShards, 64<<10)}
	for i := range m.shards {
		m.shards[i].buckets = make(map[uint64][]*prefixEntry)
	}
	return m
}

// Stats returns how many block digests were served from the memo (hits)
// and how many were hashed while a memo was in use (misses). Chains report
// theirs when they are reset or released.
func (m *Memo) Stats() (hits, misses uint64) {
	if m == nil {
		return 0, 0
	}
	return m.hits.Load(), m.misses.Load()
}

// readEnd is the number of leading tokens block i of a chain reads: bigram
// pages read one token past their end.
func readEnd(k kind, bs, i int) int {
	if k == kindSGLangBigram {
		return (i+1)*bs + 1
	}
	return (i + 1) * bs
}

// fingerprint hashes a chain's header and first block; ok is false when the
// query cannot use the memo (no full first block, names too long).
func (c *Chain) fingerprint() (uint64, bool) {
	first := readEnd(c.kind, c.bs, 0)
	if len(c.lora)+len(c.salt) > MaxMemoNames || len(c.tokens) < first || c.limit < c.bs {
		return 0, false
	}
	var d xxhash.Digest
	d.Reset()
	var hdr [9]byte
	hdr[0] = byte(c.kind)
	binary.LittleEndian.PutUint64(hdr[1:], uint64(c.bs))
	d.Write(hdr[:])
	d.Write(c.root[:])
	d.WriteString(c.lora)
	d.Write([]byte{0})
	d.WriteString(c.salt)
	d.Write(int32Bytes(c.tokens[:first]))
	return d.Sum64(), true
}

func int32Bytes(t []int32) []byte {
	if len(t) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&t[0])), 4*len(t))
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	ab, bb := int32Bytes(a[:n]), int32Bytes(b[:n])
	// Compare in large chunks first; memcmp through string equality is
	// far faster than a token loop.
	lo := 0
	for step := 4096; step >= 4; step /= 4 {
		for lo+step <= 4*n && string(ab[lo:lo+step]) == string(bb[lo:lo+step]) {
			lo += step
		}
	}
	return lo / 4
}

// usable is how many leading blocks of e the chain c may reuse.
func (c *Chain) usable(e *prefixEntry) int {
	if e.kind != c.kind || e.bs != c.bs || e.root != c.root || e.lora != c.lora || e.salt != c.salt {
		return 0
	}
	common := commonPrefix(c.tokens, e.tokens)
	k := 0
	for k < len(e.digests) && readEnd(c.kind, c.bs, k) <= common && (k+1)*c.bs <= c.limit {
		k++
	}
	return k
}

// findPrefix picks the remembered chain sharing the most blocks with this
// query.
func (c *Chain) findPrefix() {
	fp, ok := c.fingerprint()
	if !ok {
		return
	}
	c.fp, c.fpOK = fp, true
	s := &c.memo.shards[fp%memoShards]
	s.mu.RLock()
	for _, e := range s.buckets[fp] {
		if k := c.usable(e); k > c.reuseK {
			c.reuse, c.reuseK = e, k
		}
	}
	s.mu.RUnlock()
}

// rememberPrefix stores this query's chain if it hashed full blocks the
// memo did not have. It runs when the chain is released, while the
// caller's tokens are still intact.
func (c *Chain) rememberPrefix() {
	if c.memo == nil || !c.fpOK || len(c.digs) <= c.reuseK {
		return
	}
	m := len(c.digs)
	e := &prefixEntry{
		fp: c.fp, kind: c.kind, bs: c.bs, root: c.root, lora: c.lora, salt: c.salt,
		tokens:  append([]int32(nil), c.tokens[:min(readEnd(c.kind, c.bs, m-1), len(c.tokens))]...),
		digests: append([][32]byte(nil), c.digs...),
	}
	c.memo.insert(e)
}

func (m *Memo) insert(e *prefixEntry) {
	s := &m.shards[e.fp%memoShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.buckets[e.fp]
	kept := make([]*prefixEntry, 0, min(len(old)+1, memoBucket))
	kept = append(kept, e)
	for _, o := range old {
		if len(kept) == memoBucket {
			o.dead = true
			continue
		}
		// An entry the new one extends is redundant.
		if o.kind == e.kind && o.bs == e.bs && o.root == e.root && o.lora == e.lora && o.salt == e.salt &&
			len(o.tokens) <= len(e.tokens) && commonPrefix(o.tokens, e.tokens) == len(o.tokens) {
			o.dead = true
			continue
		}
		kept = append(kept, o)
	}
	s.buckets[e.fp] = kept
	s.order = append(s.order, e)
	s.bytes += e.size()
	// Evict oldest first; dead entries only release their bytes.
	for len(s.order) > 0 && (s.bytes > m.budget || s.order[0].dead) {
		o := s.order[0]
		s.order[0] = nil
		s.order = s.order[1:]
		s.bytes -= o.size()
		if !o.dead {
			o.dead = true
			s.drop(o)
		}
	}
	if cap(s.order) > 2*len(s.order)+64 {
		s.order = append([]*prefixEntry(nil), s.order...)
	}
}

// drop removes o from its bucket.
func (s *memoShard) drop(o *prefixEntry) {
	b := s.buckets[o.fp]
	for i, x := range b {
		if x == o {
			b = append(b[:i:i], b[i+1:]...)
			break
		}
	}
	if len(b) == 0 {
		delete(s.buckets, o.fp)
	} else {
		s.buckets[o.fp] = b
	}
}

// flushMemoStats adds the chain's counts to its memo once per query.
func (c *Chain) flushMemoStats() {
	if c.memo != nil && (c.memoHits|c.memoMisses) != 0 {
		c.memo.hits.Add(c.memoHits)
		c.memo.misses.Add(c.memoMisses)
	}
	c.memoHits, c.memoMisses = 0, 0
}

// endMemoQuery closes the current query's use of the memo; store says
// whether its chain may be remembered (only on release, see rememberPrefix).
func (c *Chain) endMemoQuery(store bool) {
	if store {
		c.rememberPrefix()
	}
	c.flushMemoStats()
	c.reuse, c.reuseK, c.lookedUp, c.fpOK = nil, 0, false, false
	c.digs = c.digs[:0]
}
