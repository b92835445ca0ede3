package hashing

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Memo remembers SHA-256 digests of blocks, so that warm queries (a
// system prompt shared by thousands of requests, a growing conversation)
// skip SHA-256 for every block they have seen before.
//
// It is keyed by everything that determines a block's hashed bytes: the
// profile's encoding, the parent digest, the block's raw tokens and the
// encoded LoRA/salt tail (Chain.memoKey). A cheap hash (xxhash) only finds
// the slot; byte equality of the stored key decides a hit, so a hit returns
// exactly the digest SHA-256 would, and tenants, salts and LoRA names can
// never share an entry unless their hashed bytes are identical.
//
// Memory is bounded and fixed at creation, in the manner of fastcache:
// entries are appended to a ring buffer per shard and the oldest are
// overwritten when it wraps; a direct-mapped slot table (xxhash -> ring
// position) finds them, and a colliding newer entry simply takes the slot.
// Both live outside the Go heap (anonymous mmap), so the garbage collector
// neither scans them nor grows its heap goal by their size: resident memory
// is about the configured size once the memo is full. Safe for concurrent
// use.
type Memo struct {
	shards [memoShards]memoShard
	hits   atomic.Uint64
	misses atomic.Uint64
	mapped [][]byte // off-heap regions, unmapped by the finalizer
}

const (
	memoShards = 64
	// MaxMemoInput is the largest memo key; blocks with larger keys (long
	// LoRA names or salts, huge block sizes) bypass the memo rather than
	// crowd out everything else.
	MaxMemoInput = 1024
	memoEntryHdr = 4  // u32 key length
	memoDigest   = 32 // digest after the key
	// memoSlotEvery is ring bytes per slot: entries take ~100-170 bytes,
	// so slots outnumber entries and collisions stay rare.
	memoSlotEvery = 64
)

type memoShard struct {
	mu sync.RWMutex
	// slots holds pairs (xxhash, absolute ring position + 1); 0 is empty.
	// Positions older than pos-len(ring) have been overwritten.
	slots []uint64
	ring  []byte
	pos   uint64 // absolute write position (never wraps back)
}

// NewMemo returns a memo using about maxBytes of memory; maxBytes <= 0
// returns nil, which disables memoization.
func NewMemo(maxBytes int) *Memo {
	if maxBytes <= 0 {
		return nil
	}
	perShard := max(maxBytes/memoShards, 8*(MaxMemoInput+memoEntryHdr+memoDigest))
	ringLen := perShard * memoSlotEvery / (memoSlotEvery + 16)
	nSlots := max(ringLen/memoSlotEvery, 1)
	m := &Memo{}
	for i := range m.shards {
		ring := offHeap(ringLen)
		slotBytes := offHeap(16 * nSlots)
		m.mapped = append(m.mapped, ring, slotBytes)
		m.shards[i].ring = ring
		m.shards[i].slots = unsafe.Slice((*uint64)(unsafe.Pointer(&slotBytes[0])), 2*nSlots)
	}
	runtime.SetFinalizer(m, (*Memo).release)
	return m
}

// offHeap returns n zeroed bytes from an anonymous mapping, or from the Go
// heap where mapping fails.
func offHeap(n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return make([]byte, n)
	}
	return b
}

func (m *Memo) release() {
	for _, b := range m.mapped {
		_ = syscall.Munmap(b) // heap fallbacks fail harmlessly with EINVAL
	}
	m.mapped = nil
}

// Stats returns the hit and miss counts since creation (chains report theirs
// when they are reset or released).
func (m *Memo) Stats() (hits, misses uint64) {
	if m == nil {
		return 0, 0
	}
	return m.hits.Load(), m.misses.Load()
}

// slot is the index in s.slots of the pair for h. The shard was chosen by
// h's low bits, so the slot uses the high ones.
func (s *memoShard) slot(h uint64) int {
	return int((h>>32)%uint64(len(s.slots)/2)) * 2
}

// lookup copies the digest stored for key into out and reports whether it
// was known.
func (m *Memo) lookup(key []byte, h uint64, out *[32]byte) bool {
	s := &m.shards[h%memoShards]
	i := s.slot(h)
	s.mu.RLock()
	ok := false
	if s.slots[i] == h && s.slots[i+1] != 0 {
		if at := s.slots[i+1] - 1; s.pos-at <= uint64(len(s.ring)) {
			ok = s.matches(at, key, out)
		}
	}
	s.mu.RUnlock()
	return ok
}

// matches compares the entry at absolute position at with key and, on a
// match, copies its digest. Entries never straddle the ring's end.
func (s *memoShard) matches(at uint64, key []byte, out *[32]byte) bool {
	off := at % uint64(len(s.ring))
	e := s.ring[off:]
	n := int(binary.LittleEndian.Uint32(e))
	if n != len(key) || string(e[memoEntryHdr:memoEntryHdr+n]) != string(key) {
		return false
	}
	copy(out[:], e[memoEntryHdr+n:memoEntryHdr+n+memoDigest])
	return true
}

// store records digest for key.
func (m *Memo) store(key []byte, h uint64, digest *[32]byte) {
	s := &m.shards[h%memoShards]
	size := uint64(memoEntryHdr + len(key) + memoDigest)
	ringLen := uint64(len(s.ring))
	i := s.slot(h)
	s.mu.Lock()
	off := s.pos % ringLen
	if off+size > ringLen {
		// Entries never straddle the end: skip to the next lap.
		s.pos += ringLen - off
		off = 0
	}
	e := s.ring[off : off+size]
	binary.LittleEndian.PutUint32(e, uint32(len(key)))
	copy(e[memoEntryHdr:], key)
	copy(e[memoEntryHdr+len(key):], digest[:])
	s.slots[i], s.slots[i+1] = h, s.pos+1
	s.pos += size
	s.mu.Unlock()
}

// flushMemoStats adds the chain's hit and miss counts to its memo once per
// query instead of once per block.
func (c *Chain) flushMemoStats() {
	if c.memo != nil && (c.memoHits|c.memoMisses) != 0 {
		c.memo.hits.Add(c.memoHits)
		c.memo.misses.Add(c.memoMisses)
	}
	c.memoHits, c.memoMisses = 0, 0
}

// memoKey builds in c.mkey the memo key of block [start, end): everything
// that determines the block's hashed bytes, without encoding them (encoding
// costs as much as the lookup saves): the profile kind, whether a prior is
// hashed, the prior, the raw token words the block reads (one past the end
// for bigram pages) and, for vLLM, the pre-encoded LoRA/salt tail. It
// reports false when the block should bypass the memo (names too large).
func (c *Chain) memoKey(start, end int) bool {
	var tail []byte
	switch c.kind {
	case kindVLLMCBOR, kindVLLMPickle:
		tail = c.tail()
		if c.bigNames {
			return false
		}
	case kindSGLangBigram:
		end++ // the page's last pair reads the next token
	}
	need := 2 + 32 + 4*(end-start) + len(tail)
	if need > MaxMemoInput {
		return false
	}
	if cap(c.mkey) < MaxMemoInput {
		c.mkey = make([]byte, 0, MaxMemoInput)
	}
	k := append(c.mkey[:0], byte(c.kind), 0)
	if c.havePr {
		k[1] = 1
		k = append(k, c.parent[:]...)
	}
	for _, t := range c.tokens[start:end] {
		k = binary.LittleEndian.AppendUint32(k, uint32(t))
	}
	c.mkey = append(k, tail...)
	return true
}
