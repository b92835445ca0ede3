package hashing

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Links remembers the digests of blocks ingest verified, so that a query
// can take them instead of computing SHA-256
// (docs/architecture.md#verified-links).
//
// A vLLM block's digest is a function of its parent's digest, its token
// ids and the extras a query carries (the encoding, the LoRA name, and
// the salt, which enters a chain's first block only); so block i's digest
// is a function of (encoding, LoRA, salt, the first i+1 blocks' tokens).
// Links files it under a 128-bit prefix id of exactly those, chained
// block by block (LinkScope.Next), which a query computes from its tokens
// alone.
//
// Ingest fills it: for each block of a vLLM BlockStored event it hashes
// the block from its parent's digest, its tokens and the extras the event
// states, and keeps the digest only when its key is the one the engine
// published. An entry is therefore a remembered SHA-256 result, never
// something an engine asserted, and a query taking one gets exactly the
// digest hashing would give; verification only decides which results are
// worth keeping (a multimodal block's published key includes image hashes
// a query cannot know, so its recomputed digest does not match and is not
// kept). Engines name a parent by its key, so Links also maps a verified
// block's key to its prefix id.
//
// The blocks an event verifies are kept as a run, their ids and digests
// side by side in arrays, and indexed by id. A query looks its first block
// up and then walks the run, comparing each next block's id with the
// run's: one random memory access per run instead of one per block, which
// on a table larger than the caches is what a per-block lookup would cost
// (more than the SHA-256 it saves).
//
// The ids are xxh3-128 under a seed drawn at start-up (docs/architecture.md,
// "Verified links"): two different prefixes share an id with probability
// 2^-128, far below the 2^-64 of two blocks sharing the index keys
// everything already rests on, and nobody outside the process can aim for
// a collision without the seed.
//
// Memory is bounded by a byte budget: the links live in two generations,
// and when the current one has used half the budget the older one is
// dropped whole (a block stored again is refreshed into the current one,
// so what engines keep storing stays). Safe for concurrent use.
type Links struct {
	seed     uint64
	maxBytes int

	mu        sync.RWMutex
	cur, prev *linkGen
	bytes     atomic.Int64 // cur's and prev's

	preparing              atomic.Bool // a Record is faulting in a table's next slots
	hits, misses, recorded atomic.Uint64
	shed                   atomic.Uint64 // blocks ingest left unverified (NoteShed)
	pending                atomic.Int64  // blocks whose verification waits (NotePending)
	backlog, backlogMax    atomic.Int64  // bytes the sources' waiting verification holds, and its bound (TakeBacklog)
	sink                   uint32        // keeps touch's loads (under mu)
	anon                   LinkWriter    // for Record without a writer (under mu)
}

// LinkID identifies a chain prefix within a scope (see Links).
type LinkID = xxh3.Uint128

// LinkBytes is what a verified block costs in a full generation: its
// prefix id, digest, key, tokens' id, block hint and child flag in a run
// (69 bytes) and a 16-byte slot in each of the two tables at the load of
// 3/4 their last size is made for (linkGen.maxSlots).
// BenchmarkLinksMemory measures it.
const LinkBytes = int(unsafe.Sizeof(LinkID{})) + 32 + 8 + 8 + 4 + 1 + 2*posSlotBytes*4/3

// NewLinks returns a table that holds at most maxBytes of links; a budget
// too small for generations of a few chunks returns nil, which disables
// links.
func NewLinks(maxBytes int) *Links {
	if maxBytes/2 < 4*int(unsafe.Sizeof(runChunk{})) {
		return nil
	}
	// A generation addresses at most 2^16 chunks (runPos).
	maxBytes = min(maxBytes, 2*(1<<16-1)*chunkBlocks*LinkBytes)
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return &Links{seed: binary.LittleEndian.Uint64(b[:]), maxBytes: maxBytes}
}

// Reset forgets every link. The service calls it when the last context is
// unregistered, with the memos, so that memory returns to its idle size.
func (l *Links) Reset() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.cur, l.prev, l.anon = nil, nil, LinkWriter{}
	l.bytes.Store(0)
	l.mu.Unlock()
}

// Bytes is the memory the links hold (runs and tables, every slot
// allocated): at most the budget given to NewLinks.
func (l *Links) Bytes() int {
	if l == nil {
		return 0
	}
	return int(l.bytes.Load())
}

// Len is the number of verified blocks held.
func (l *Links) Len() int {
	if l == nil {
		return 0
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := 0
	for _, g := range []*linkGen{l.cur, l.prev} {
		if g != nil {
			n += g.index.n
		}
	}
	return n
}

// Stats returns how many query blocks took a verified digest (hits), how
// many queries looked for one and found none, hashing on from there
// (misses), and how many blocks ingest verified and recorded.
func (l *Links) Stats() (hits, misses, recorded uint64) {
	if l == nil {
		return 0, 0, 0
	}
	return l.hits.Load(), l.misses.Load(), l.recorded.Load()
}

// Scope returns the scope of profile p. Only vLLM profiles have links:
// SGLang engines publish no extras to verify a page against, and the last
// page of an SGLang prompt may be partial.
func (l *Links) Scope(p *Profile) LinkScope {
	if l == nil || p == nil || !p.kind.vllm() {
		return LinkScope{}
	}
	return LinkScope{l: l, kind: p.kind, root: p.RootDigest}
}

// find looks block id up in the current generation, then in the older
// one; old says the older one was asked. Under l.mu.
func (l *Links) find(id LinkID) (ch *runChunk, off int, old, ok bool) {
	if g := l.cur; g != nil {
		if ch, off, ok = g.find(id); ok {
			return ch, off, false, true
		}
	}
	if g := l.prev; g != nil {
		ch, off, ok = g.find(id)
		return ch, off, true, ok
	}
	return nil, 0, false, false
}
