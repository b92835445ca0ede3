package hashing

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
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
// Memory is bounded: entries live in fixed-size ring buffers (one per
// shard, no pointers, so the garbage collector never scans them), and the
// oldest entries are overwritten when a ring wraps. Safe for concurrent use.
type Memo struct {
	shards [memoShards]memoShard
	hits   atomic.Uint64
	misses atomic.Uint64
}

const (
	memoShards = 64
	// MaxMemoInput is the largest memo key; blocks with larger keys (long
	// LoRA names or salts, huge block sizes) bypass the memo rather than
	// crowd out everything else.
	MaxMemoInput = 1024
	memoEntryHdr = 4  // u32 input length
	memoDigest   = 32 // digest after the input
)

type memoShard struct {
	mu sync.RWMutex
	// index maps an input's xxhash to the absolute ring position of its
	// entry; positions older than pos-len(ring) have been overwritten.
	index map[uint64]uint64
	ring  []byte
	pos   uint64 // absolute write position (never wraps back)
}

// NewMemo returns a memo using about maxBytes of memory for entries (plus
// about 24 bytes of index per entry); maxBytes <= 0 returns nil, which
// disables memoization.
func NewMemo(maxBytes int) *Memo {
	if maxBytes <= 0 {
		return nil
	}
	per := max(maxBytes/memoShards, 4*(MaxMemoInput+memoEntryHdr+memoDigest))
	m := &Memo{}
	for i := range m.shards {
		m.shards[i].ring = make([]byte, per)
		m.shards[i].index = make(map[uint64]uint64)
	}
	return m
}

// Stats returns the hit and miss counts since creation (chains report theirs
// when they are reset or released).
func (m *Memo) Stats() (hits, misses uint64) {
	if m == nil {
		return 0, 0
	}
	return m.hits.Load(), m.misses.Load()
}

// lookup copies the digest of input into out and reports whether it was
// known.
func (m *Memo) lookup(input []byte, h uint64, out *[32]byte) bool {
	s := &m.shards[h%memoShards]
	s.mu.RLock()
	at, ok := s.index[h]
	if ok && s.pos-at <= uint64(len(s.ring)) {
		ok = s.matches(at, input, out)
	} else {
		ok = false
	}
	s.mu.RUnlock()
	return ok
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

// matches compares the entry at absolute position at with input and, on a
// match, copies its digest. Entries never straddle the ring's end.
func (s *memoShard) matches(at uint64, input []byte, out *[32]byte) bool {
	off := at % uint64(len(s.ring))
	e := s.ring[off:]
	n := int(binary.LittleEndian.Uint32(e))
	if n != len(input) || string(e[memoEntryHdr:memoEntryHdr+n]) != string(input) {
		return false
	}
	copy(out[:], e[memoEntryHdr+n:memoEntryHdr+n+memoDigest])
	return true
}

// store records digest as the SHA-256 of input.
func (m *Memo) store(input []byte, h uint64, digest *[32]byte) {
	s := &m.shards[h%memoShards]
	size := uint64(memoEntryHdr + len(input) + memoDigest)
	ringLen := uint64(len(s.ring))
	s.mu.Lock()
	off := s.pos % ringLen
	if off+size > ringLen {
		// Entries never straddle the end: skip to the next lap, and
		// forget what that lap overwrites.
		s.pos += ringLen - off
		off = 0
		s.sweep()
	}
	e := s.ring[off : off+size]
	binary.LittleEndian.PutUint32(e, uint32(len(input)))
	copy(e[memoEntryHdr:], input)
	copy(e[memoEntryHdr+len(input):], digest[:])
	s.index[h] = s.pos
	s.pos += size
	s.mu.Unlock()
}

// sweep drops index entries whose ring space the new lap will overwrite, so
// the index stays proportional to the ring. It runs once per lap.
func (s *memoShard) sweep() {
	ringLen := uint64(len(s.ring))
	for h, at := range s.index {
		if s.pos-at >= ringLen {
			delete(s.index, h)
		}
	}
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
