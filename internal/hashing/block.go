package hashing

// BlockHasher recomputes single blocks from a known parent digest, the way
// an engine hashed the blocks it reports in a BlockStored event. The query
// path never needs this (it always hashes from the chain's start); event
// checking does, because an event carries only its own blocks and a parent
// link. A BlockHasher reuses one Chain's hash state and buffers, so steady
// use allocates nothing. It is not safe for concurrent use.
type BlockHasher struct{ c Chain }

// Digest returns the digest of one block under p. parent is the previous
// block's full digest, or nil for the first block of a chain (vLLM then
// chains on p's root and hashes salt into the block; SGLang seeds the chain
// from salt when it is not empty). lora enters every vLLM block and no
// SGLang page.
//
// words are the block's token ids: all of a vLLM block's, or an SGLang
// page's (one page of 1 to block_size positions). For sglang_bigram, words
// are the page's positions as pairs, flattened, which is how SGLang events
// carry them: SHA-256 then covers exactly those words.
//
// ok is false when the block cannot be hashed: no words, a zero Profile, an
// SGLang page with a negative id, or an odd word count for sglang_bigram.
func (h *BlockHasher) Digest(p *Profile, parent *[32]byte, words []int32, lora, salt string) (d [32]byte, ok bool) {
	if p == nil || len(words) == 0 {
		return d, false
	}
	q := *p
	if q.kind == kindSGLangBigram {
		if len(words)%2 != 0 {
			return d, false
		}
		// The pairs are already spelled out: hash the words as they are.
		q.kind = kindSGLang
	}
	c := &h.c
	c.Reset(&q, len(words), words, lora, salt)
	if parent != nil {
		// A later block: chained on its parent, and vLLM's salt and
		// SGLang's salt seed belong to a chain's first block only.
		c.parent = *parent
		c.havePr = true
		c.block = 1
	}
	_, _, ok = c.Next()
	if ok {
		d = c.parent
	}
	c.tokens, c.lora, c.salt = nil, "", ""
	return d, ok
}

// Digests appends to out the digests of the consecutive vLLM blocks in
// tokens (len(tokens)/blockSize full blocks; a partial tail is ignored),
// the first chained on parent (nil: a chain's first block, salted with
// salt), each later one on the block before it: Digest for a run of
// blocks, encoding the extras once. A non-vLLM profile appends nothing.
func (h *BlockHasher) Digests(p *Profile, blockSize int, parent *[32]byte, tokens []int32, lora, salt string, out [][32]byte) [][32]byte {
	if p == nil || !p.kind.vllm() || blockSize <= 0 {
		return out
	}
	c := &h.c
	if parent != nil {
		salt = "" // the salt enters a chain's first block only
	}
	c.Reset(p, blockSize, tokens, lora, salt)
	if parent != nil {
		c.parent = *parent
		c.havePr = true
		c.block = 1
	}
	for {
		if _, _, ok := c.Next(); !ok {
			break
		}
		out = append(out, c.parent)
	}
	c.tokens, c.lora, c.salt = nil, "", ""
	return out
}

// Key projects a digest to its index key under p (zero for a zero Profile).
func (p *Profile) Key(d *[32]byte) uint64 {
	c := Chain{kind: p.kind}
	if p.kind == kindNone {
		return 0
	}
	return c.key(d)
}

// Digest returns the full digest of the block Next last returned, the
// value an engine publishes in full (vLLM's bin form: Profile.DigestBytes
// of it, as an XXH3-128 digest fills only the last 16 bytes) and the
// parent of the next block. It is the zero array before the first Next.
func (c *Chain) Digest() [32]byte {
	switch {
	case c.block == 0:
		return [32]byte{}
	case c.block <= c.reuseK:
		return c.reuse.digests[c.block-1]
	case c.linked > 0:
		return *c.pend.Digest(c.linked - 1)
	}
	return c.parent
}
