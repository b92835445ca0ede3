package hashing

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/zeebo/xxh3"
)

// sglangSaltPrefix is "sglang-cache-salt-v1" and a zero byte; SHA-256 of it
// followed by the salt seeds a salted SGLang event chain
// (docs/hashing.md#sglang-salt).
const sglangSaltPrefix = "sglang-cache-salt-v1\x00"

// maxPooledBuf caps the encode buffer a released Chain keeps, so that one
// query with a giant block or LoRA name does not pin memory in the pool.
const maxPooledBuf = 256 << 10

// Chain yields a query's block keys one at a time, hashing block i only when
// Next is called for it: a prefix walk stops within a block of the first
// miss, and the blocks after it would be wasted SHA-256 work. Values are
// exactly those of the eager definition in docs/hashing.md, chained on full
// digests (32 bytes, or 16 for XXH3-128, kept right-aligned).
//
// A Chain owns one SHA-256 state and one encode buffer that are reused for
// every block and, through AcquireChain/ReleaseChain, across queries, so
// steady-state hashing allocates nothing. A Chain is not safe for concurrent
// use; it keeps a reference to the token slice given to Reset, which must not
// be modified until the caller is done with the chain. The zero Chain is
// usable, but pooled ones skip the warm-up allocations.
type Chain struct {
	h   hash.Hash
	buf []byte

	kind   kind
	bs     int
	tokens []int32
	lora   string
	salt   string

	pos   int // next unhashed position (token, or bigram pair)
	limit int // number of positions that get hashed
	block int // index of the next block
	// parent is the prior for the next block: the vLLM root, the SGLang
	// salt seed, or D_{i-1}, which is also the digest Next last returned.
	parent [32]byte
	havePr bool // parent is part of the next block's input

	// vLLM blocks end with the same encoded extra keys (and, for pickle,
	// the outer tuple and STOP) except block 0, which may add the salt.
	// Both variants are encoded once per query, at the first Next, into
	// tails: block 0's is tails[:tail0], every later block's tails[tail0:].
	// memo, when set, supplies the digests of a remembered chain sharing
	// this query's prefix (see Memo): reuse's first reuseK blocks. digs
	// records the full-block digests hashed after them, so the memo can
	// learn the chain.
	memo       *Memo
	root       [32]byte
	lookedUp   bool
	fpVals     []uint64 // fingerprints of the first 1, 2, 4, … blocks
	reuse      *prefixEntry
	reuseK     int
	digs       [][32]byte
	memoHits   uint64
	memoMisses uint64
	keepTokens bool // tokens are never modified: the memo may keep them

	// links, when set, holds the digests of blocks ingest verified (see
	// Links); linksOn says whether the next block may still look there (a
	// query stops at its first block without one). linkID is the prefix
	// id of blocks [0, linkPos) under linkSc, made at first use; pend
	// holds the keys, hints and digests of the next blocks, followed in
	// one batch (resolve), pend.Keys[pendI] being block c.block's; the
	// digests are the links' own, read in place (Digest) except the
	// last, the parent of the first block hashed after them.
	links     *Links
	linkSc    LinkScope
	linksOn   bool
	linkHits  uint64
	linkID    LinkID
	linkPos   int
	linkBatch int
	pend      Followed
	pendI     int
	linked    int // 1 + pend's index of the block Next returned last, if linked (0: not)

	tails    []byte
	tail0    int
	tailsSet bool
	bigNames bool // a name ≥ 64 KiB: pickle must use the general framer

	seed uint64 // rfc1527's seed
	// std holds rfc1527 keys hashed ahead in batches (Ready), std[stdI]
	// being block c.block's: XXH3 is cheap enough that hashing a batch
	// ahead costs less than walking block by block, one stripe lock
	// each, and the walk then reads the batch stripe by stripe.
	std      []uint64
	stdI     int
	stdBatch int
}

var chainPool = sync.Pool{New: func() any { return newChain() }}

func newChain() *Chain {
	return &Chain{h: sha256.New(), buf: make([]byte, 0, 512)}
}

// AcquireChain returns a Chain from a process-wide pool; pair it with
// ReleaseChain so that buffers and hash states are recycled across queries.
func AcquireChain() *Chain {
	return chainPool.Get().(*Chain)
}

// ReleaseChain returns c to the pool. It drops c's references to the query
// (tokens, names) so the pool does not keep them alive; c must not be used
// afterwards. A nil c is ignored.
func ReleaseChain(c *Chain) {
	if c == nil {
		return
	}
	c.endMemoQuery(true) // the caller's tokens are still intact here
	c.endLinks()
	c.tokens, c.lora, c.salt = nil, "", ""
	c.kind, c.limit, c.pos = kindNone, 0, 0
	c.keepTokens = false
	c.memo = nil
	if cap(c.buf) > maxPooledBuf {
		c.buf = nil // the next query regrows it to the size it needs
	}
	if cap(c.tails) > maxPooledBuf {
		c.tails = nil
	}
	chainPool.Put(c)
}

// Reset prepares c to produce the blocks of one query under profile p with
// the given block size (the registered block_size). An empty lora or salt
// means absent, matching the contract ("Empty means no salt") and vLLM's
// truthiness test. No hashing happens here; Next does it lazily.
//
// A nil or zero Profile, or blockSize ≤ 0, yields no blocks. So does an
// SGLang query containing a negative token id, which SGLang cannot hash
// (docs/hashing.md#negative-token-ids).
func (c *Chain) Reset(p *Profile, blockSize int, tokens []int32, lora, salt string) {
	// The previous query's tokens may have been reused by the caller, so
	// only ReleaseChain lets the memo learn a chain.
	c.endMemoQuery(false)
	c.endLinks()
	c.keepTokens = false
	c.tokens, c.lora, c.salt = tokens, lora, salt
	c.bs, c.pos, c.block, c.limit = blockSize, 0, 0, 0
	c.havePr, c.tailsSet = false, false
	c.kind = kindNone
	c.std, c.stdI, c.stdBatch = c.std[:0], 0, 0
	if p == nil || blockSize <= 0 {
		return
	}
	c.kind = p.kind
	c.root = p.RootDigest
	n := len(tokens)
	switch c.kind {
	case kindVLLMCBOR, kindVLLMPickle, kindVLLMXXHCBOR, kindVLLMXXHPickle:
		// Only full blocks are hashed; the partial tail never matches.
		c.limit = n - n%blockSize
		c.parent = p.RootDigest
		c.havePr = true
	case kindSGLang, kindSGLangBigram:
		if anyNegative(tokens) {
			return
		}
		c.limit = n
		if c.kind == kindSGLangBigram {
			c.limit = max(n-1, 0)
		}
	case kindRFC1527:
		// Full blocks only, as Dynamo hashes them. The standard hash has
		// no salt: a salted query can match no block an engine stored
		// for it, so it matches none (docs/hashing.md#standard-hash-rfc1527).
		c.seed = p.seed
		if salt == "" {
			c.limit = n - n%blockSize
		}
	}
}

// UseMemo makes this query consult m (nil disables it); call it after
// Reset. The keys are identical with and without a memo; only the cost
// changes. The memo learns the query's chain when the chain is released.
func (c *Chain) UseMemo(m *Memo) {
	c.endMemoQuery(false)
	if c.kind == kindRFC1527 {
		m = nil // XXH3 costs less than a memo lookup would
	}
	c.memo = m
}

// UseLinks makes this query take the digests of blocks ingest verified
// from l instead of hashing them (nil disables it); call it after Reset.
// As with the memo, the keys are identical with and without links; only
// the cost changes.
func (c *Chain) UseLinks(l *Links) {
	c.endLinks()
	if l != nil && c.kind.vllm() {
		c.links, c.linksOn = l, true
	}
}

// endLinks closes the current query's use of the links, adding its counts.
func (c *Chain) endLinks() {
	if c.links != nil {
		if c.linkHits != 0 {
			c.links.hits.Add(c.linkHits)
		}
		if !c.linksOn {
			c.links.misses.Add(1)
		}
	}
	c.links, c.linkSc, c.linksOn, c.linkHits = nil, LinkScope{}, false, 0
	c.linkPos, c.linkBatch, c.pendI = 0, 0, 0
	c.pend.Reset() // the links' memory, not to be kept by the pool
	c.linked = 0
}

const (
	firstLinkBatch = 128
	maxLinkBatch   = 1024
)

// resolve follows the verified links of up to the next batch of full
// blocks, from block c.block on, into pend, and returns how many it took
// (the blocks before the first one without a link; that block ends the
// query's use of links). Links.Follow computes no prefix id past that
// block; the batch bounds what a walk that ends early (the index no
// longer holds a linked block) reads in vain, and grows fourfold.
func (c *Chain) resolve() int {
	full := c.limit / c.bs
	if !c.linksOn || c.block >= full {
		return 0
	}
	if c.linkSc.l == nil {
		c.linkSc = c.links.Scope(&Profile{kind: c.kind, RootDigest: c.root})
		c.linkID, c.buf = c.linkSc.Root(c.lora, c.salt, c.buf)
		c.linkPos = 0
	}
	for c.linkPos < c.block { // blocks the memo served
		c.linkID, c.buf = c.linkSc.Next(c.linkID, c.tokens[c.linkPos*c.bs:(c.linkPos+1)*c.bs], c.buf)
		c.linkPos++
	}
	c.linkBatch = min(max(4*c.linkBatch, firstLinkBatch), maxLinkBatch)
	n := min(c.linkBatch, full-c.block)
	c.pend.Reset()
	c.pendI, c.linked = 0, 0
	c.buf = c.linkSc.Follow(c.linkID, c.tokens[c.block*c.bs:(c.block+n)*c.bs], c.bs, &c.pend, c.buf)
	k := len(c.pend.Keys)
	if k < n {
		c.linksOn = false
	}
	if k > 0 {
		c.linkID, c.linkPos = c.pend.ID, c.block+k
	}
	return k
}

// KeepTokens promises that the token slice given to Reset is never
// modified again, so the memo may keep it instead of a copy when it learns
// this query's chain (a token memo's remembered array is such a slice).
// Call it after Reset.
func (c *Chain) KeepTokens() { c.keepTokens = true }

// Next computes the next block and returns its 64-bit index key (the
// profile's projection of the block digest) and the number of query tokens
// it accounts for in a hit count: B for vLLM, the page's real size for
// SGLang's final partial page, and bigram positions for sglang_bigram, so
// that counts never exceed n (n−1 for bigram). ok is false once the chain is
// exhausted; further calls keep returning false.
func (c *Chain) Next() (key uint64, covered int, ok bool) {
	if c.pos >= c.limit {
		return 0, 0, false
	}
	if c.block < c.reuseK {
		k, covered := c.takeRemembered()
		return k, covered, true
	}
	if c.stdI < len(c.std) {
		return c.takeStd(), c.bs, true
	}
	start := c.pos
	end := c.limit
	if end-start > c.bs {
		end = start + c.bs
	}
	if c.h == nil && c.kind != kindRFC1527 && !c.kind.xxh() {
		c.h = sha256.New() // a zero Chain that did not come from the pool
	}
	if c.kind == kindNone {
		return 0, 0, false
	}
	if c.memo != nil {
		c.lookUp()
	}
	if c.block < c.reuseK { // the memo lookup just above found a prefix
		return c.Next()
	}
	if (c.kind == kindSGLang || c.kind == kindSGLangBigram) && c.block == 0 && c.salt != "" {
		c.seedSGLangSalt()
	}
	if c.pendI < len(c.pend.Keys) || (c.links != nil && c.resolve() > 0) {
		return c.takeLinked(), c.bs, true
	}
	c.linked = 0
	c.hashBlock(start, end)
	if c.memo != nil {
		c.memoMisses++
		if len(c.fpVals) > 0 && end-start == c.bs && len(c.digs) == c.block-c.reuseK {
			// Record the digests hashed after the reused prefix, for the
			// memo to learn; the prefix itself is taken from reuse only
			// then (see rememberPrefix), so a fully warm query copies
			// nothing.
			c.digs = append(c.digs, c.parent)
		}
	}
	c.havePr = true
	c.pos = end
	c.block++
	return c.key(&c.parent), end - start, true
}

// takeLinked is Next for a block verified links serve (see Links): its
// key from pend, and the last one's digest copied as the parent of the
// block hashed after them (Digest reads the others where they lie). Such
// a block is not recorded for the memo, which does not learn a chain
// links served (rememberPrefix).
func (c *Chain) takeLinked() uint64 {
	i := c.pendI
	c.pendI++
	c.linkHits++
	if c.memo != nil {
		c.memoMisses++
	}
	c.linked = c.pendI
	if c.pendI == len(c.pend.Keys) {
		c.parent = *c.pend.Digest(i)
	}
	c.havePr = true
	c.pos += c.bs
	c.block++
	return c.pend.Keys[i]
}

// takeRemembered is Next for a block of the memo's remembered prefix
// (always a full one). Only the prefix's last digest is copied: it is the
// parent of the first block hashed after it.
func (c *Chain) takeRemembered() (uint64, int) {
	d := &c.reuse.digests[c.block]
	if c.block == c.reuseK-1 {
		c.parent = *d
	}
	c.linked = 0
	c.memoHits++
	c.havePr = true
	start := c.pos
	c.pos = min(start+c.bs, c.limit)
	c.block++
	return c.key(d), c.pos - start
}

// TakeReady is Next for up to n of the blocks Ready counts, in one call
// (index.BatchChain): it appends their keys, the tokens each covers (a
// whole block) and their block hints (0 for none) to keys, covs and
// hints; it stops early at a block that needs hashing.
func (c *Chain) TakeReady(n int, keys []uint64, covs []int, hints []uint32) ([]uint64, []int, []uint32) {
	if k := min(n, len(c.std)-c.stdI); k > 0 {
		keys = append(keys, c.std[c.stdI:c.stdI+k]...)
		for range k {
			covs, hints = append(covs, c.bs), append(hints, 0)
		}
		c.stdI += k
		c.pos += k * c.bs
		c.block += k
		if c.stdI == len(c.std) {
			c.parent = [32]byte{}
			binary.BigEndian.PutUint64(c.parent[:8], c.std[c.stdI-1])
			c.havePr = true
		}
		return keys, covs, hints
	}
	for ; n > 0 && c.pos < c.limit && c.block < c.reuseK; n-- {
		k, cov := c.takeRemembered()
		keys, covs, hints = append(keys, k), append(covs, cov), append(hints, 0)
	}
	if k := min(n, len(c.pend.Keys)-c.pendI); k > 0 {
		// Linked blocks in bulk: Next's bookkeeping (takeLinked) once.
		i, j := c.pendI, c.pendI+k
		keys, hints = append(keys, c.pend.Keys[i:j]...), append(hints, c.pend.Hints[i:j]...)
		for range k {
			covs = append(covs, c.bs)
		}
		c.pendI, c.linkHits = j-1, c.linkHits+uint64(k-1)
		if c.memo != nil {
			c.memoMisses += uint64(k - 1)
		}
		c.pos, c.block = c.pos+(k-1)*c.bs, c.block+k-1
		c.takeLinked() // the last, which sets what a Next would
	}
	return keys, covs, hints
}

// key is a block digest's 64-bit index key: vLLM projects its low 64 bits
// (low64_be), SGLang its first 64 (first64_be).
func (c *Chain) key(d *[32]byte) uint64 {
	if c.kind.vllm() {
		return binary.BigEndian.Uint64(d[24:]) // right-aligned: any digest size
	}
	return binary.BigEndian.Uint64(d[:8])
}

// lookUp consults the memo for this query's longest remembered prefix, once
// per query and only when it is first needed (an answered query may never
// need a block).
func (c *Chain) lookUp() {
	if !c.lookedUp {
		c.lookedUp = true
		c.findPrefix()
	}
}

// Ready reports how many of the next Next calls are served without
// hashing (index.ReadyChain): from the memo, looking it up first if this
// chain has not yet, or from verified links, looking up the next batch.
func (c *Chain) Ready() int {
	if c.kind == kindNone || c.pos >= c.limit {
		return 0
	}
	if c.kind == kindRFC1527 {
		return c.readyStd()
	}
	if c.memo != nil {
		c.lookUp()
		if r := c.reuseK - c.block; r > 0 {
			return r
		}
	}
	if c.links == nil {
		return 0
	}
	if r := len(c.pend.Keys) - c.pendI; r > 0 {
		return r
	}
	return c.resolve()
}

// hashBlock encodes block [start, end) and sets c.parent to its digest.
func (c *Chain) hashBlock(start, end int) {
	if c.kind != kindRFC1527 && !c.kind.xxh() {
		c.h.Reset()
	}
	switch c.kind {
	case kindVLLMCBOR:
		// Streams the first SHA-256 block while encoding the rest.
		c.buf = encodeCBORBlock(c.buf, c.h, c.parent[:], c.tokens[start:end], c.tail())
	case kindVLLMPickle:
		c.encodePickle(start, end)
		c.h.Write(c.buf)
	case kindVLLMXXHCBOR, kindVLLMXXHPickle:
		// The same values, their parent the 16-byte digest, hashed with
		// XXH3-128 in one call (docs/hashing.md#vllm-algorithms).
		if c.kind == kindVLLMXXHCBOR {
			c.buf = encodeCBORBlock(c.buf, nil, c.parent[32-xxhDigestLen:], c.tokens[start:end], c.tail())
		} else {
			c.encodePickle(start, end)
		}
		putXXH(&c.parent, xxh3.Hash128(c.buf))
		return
	case kindSGLang, kindSGLangBigram:
		c.buf = c.encodeSGLangPage(start, end)
		c.h.Write(c.buf)
	case kindRFC1527:
		var h uint64
		h, c.buf = StdLocal(c.seed, c.tokens[start:end], nil, c.buf)
		if c.havePr {
			h = StdNext(c.seed, binary.BigEndian.Uint64(c.parent[:8]), h)
		}
		c.parent = [32]byte{}
		binary.BigEndian.PutUint64(c.parent[:8], h)
		return
	}
	c.h.Sum(c.parent[:0])
}

// encodePickle encodes vLLM block [start, end) as CPython's pickle into
// c.buf, in one frame when it fits (encodePickleBlockFast).
func (c *Chain) encodePickle(start, end int) {
	parent := c.parent[32-c.kind.digestLen():]
	fast := false
	if tail := c.tail(); !c.bigNames {
		c.buf, fast = encodePickleBlockFast(c.buf, parent, c.tokens[start:end], tail)
	}
	if !fast {
		c.buf = encodePickleBlockGeneral(c.buf, parent, c.tokens[start:end], c.lora, c.vllmSalt())
	}
}

// tail returns the encoded end of the next vLLM block (see Chain.tails).
// It is small enough to inline; buildTails runs once per query.
func (c *Chain) tail() []byte {
	if !c.tailsSet {
		c.buildTails()
	}
	if c.block == 0 {
		return c.tails[:c.tail0]
	}
	return c.tails[c.tail0:]
}

// buildTails encodes both tail variants of the current query.
func (c *Chain) buildTails() {
	c.tailsSet = true
	c.bigNames = len(c.lora) >= frameTarget || len(c.salt) >= frameTarget
	t := c.tails[:0]
	c.tail0 = 0
	switch {
	case c.kind.cbor():
		t = appendCBORExtras(t, c.lora, c.salt)
		c.tail0 = len(t)
		t = appendCBORExtras(t, c.lora, "")
	case !c.bigNames: // pickle; large names go through the general framer
		t = appendPickleTail(t, c.lora, c.salt)
		c.tail0 = len(t)
		t = appendPickleTail(t, c.lora, "")
	}
	c.tails = t
}

// vllmSalt is the salt that enters the next vLLM block: block 0 only.
func (c *Chain) vllmSalt() string {
	if c.block == 0 {
		return c.salt
	}
	return ""
}

// seedSGLangSalt sets P_0 = SHA256("sglang-cache-salt-v1\0" ‖ salt).
func (c *Chain) seedSGLangSalt() {
	need := len(sglangSaltPrefix) + len(c.salt)
	if cap(c.buf) < need {
		c.buf = make([]byte, 0, need)
	}
	c.buf = append(append(c.buf[:0], sglangSaltPrefix...), c.salt...)
	c.h.Reset()
	c.h.Write(c.buf)
	c.h.Sum(c.parent[:0])
	c.h.Reset() // Next is about to hash page 0 with the same state
	c.havePr = true
}

// encodeSGLangPage builds P_i ‖ u32le words of positions [start, end).
func (c *Chain) encodeSGLangPage(start, end int) []byte {
	words := end - start
	if c.kind == kindSGLangBigram {
		words *= 2
	}
	need := 32 + 4*words
	if cap(c.buf) < need {
		c.buf = make([]byte, 0, need+need/4)
	}
	b := c.buf[:0]
	if c.havePr {
		b = append(b, c.parent[:]...)
	}
	w := len(b)
	b = b[:w+4*words]
	if c.kind == kindSGLangBigram {
		for p := start; p < end; p++ {
			binary.LittleEndian.PutUint64(b[w:], uint64(uint32(c.tokens[p]))|uint64(uint32(c.tokens[p+1]))<<32)
			w += 8
		}
	} else {
		for _, t := range c.tokens[start:end] {
			binary.LittleEndian.PutUint32(b[w:], uint32(t))
			w += 4
		}
	}
	return b
}

// anyNegative reports whether any id is negative. It ORs all ids together
// (the sign bit survives) instead of branching per token, because the check
// must see the whole prompt before the first page is returned.
func anyNegative(toks []int32) bool {
	var acc int32
	for _, t := range toks {
		acc |= t
	}
	return acc < 0
}

const (
	firstStdBatch = 32
	maxStdBatch   = 1024
)

// readyStd hashes the next batch of rfc1527 blocks ahead, when none is
// waiting, and reports how many wait. Batches grow fourfold, so a walk
// that ends at an early miss hashed at most a few blocks in vain.
func (c *Chain) readyStd() int {
	if r := len(c.std) - c.stdI; r > 0 {
		return r
	}
	full := c.limit / c.bs
	n := min(max(4*c.stdBatch, firstStdBatch), maxStdBatch, full-c.block)
	if n <= 0 {
		return 0
	}
	c.stdBatch = n
	c.std, c.stdI = c.std[:0], 0
	parent, have := binary.BigEndian.Uint64(c.parent[:8]), c.havePr
	for i := range n {
		start := (c.block + i) * c.bs
		var h uint64
		h, c.buf = StdLocal(c.seed, c.tokens[start:start+c.bs], nil, c.buf)
		if have {
			h = StdNext(c.seed, parent, h)
		}
		parent, have = h, true
		c.std = append(c.std, h)
	}
	return n
}

// takeStd is Next for a block readyStd hashed ahead.
func (c *Chain) takeStd() uint64 {
	h := c.std[c.stdI]
	c.stdI++
	c.pos += c.bs
	c.block++
	if c.stdI == len(c.std) {
		// The batch's last block is the parent of the next one hashed.
		c.parent = [32]byte{}
		binary.BigEndian.PutUint64(c.parent[:8], h)
		c.havePr = true
	}
	return h
}
