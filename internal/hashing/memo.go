package hashing

import (
	"encoding/binary"
	"strings"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// Memo remembers the digest chains of recent queries, so that a warm query
// (a system prompt shared by thousands of requests, the next turn of a
// conversation) reuses the digests of the longest prefix it shares with one
// of them instead of hashing those blocks again.
//
// Entries are filed under fingerprints of everything that determines a
// chain's first d blocks — encoding, block size, root digest, LoRA name,
// salt and the tokens those blocks read — for d = 1, 2, 4, 8, …, and under
// that of the whole query it was learned from. A query computes the same
// fingerprints from a few tokens of each span and looks up the deepest
// first, so a conversation that shares only a system prompt with thousands
// of others still finds its own previous turn. The whole-query fingerprint
// matters when a walk stopped soon after a shared opening (the rest of the
// prompt was never cached): such a chain covers only depths that a whole
// group of prompts shares, whose buckets keep only their newest entries,
// and asking the same prompt again would otherwise hash and store its
// chain anew every time. A
// candidate is then verified exactly: the header fields are compared, and
// only blocks whose tokens lie inside the common token prefix (compared with
// memcmp) are reused. A reused digest is therefore exactly the one
// SHA-256 would produce; a per-block memo was tried first and lost to
// hashing on SHA-NI hardware, because it paid two random memory reads per
// block, while this pays one lookup and one sequential comparison per query.
//
// Memory is bounded by a byte budget with roughly oldest-first eviction;
// entries hold only pointer-free slices, so the garbage collector never
// scans their contents. Safe for concurrent use.
type Memo memostore.Store[*prefixEntry]

// store is the memo's store: the same pointer, nil for a nil memo.
func (m *Memo) store() *memostore.Store[*prefixEntry] {
	return (*memostore.Store[*prefixEntry])(m)
}

const (
	// MaxMemoNames bounds len(lora)+len(salt) of memoized queries.
	MaxMemoNames  = 4096
	entryOverhead = 160
)

// prefixEntry is one remembered chain. It is immutable once published.
type prefixEntry struct {
	memostore.Record // filed under its first 1, 2, 4, … blocks and its whole query
	kind             kind
	bs               int
	root             [32]byte
	lora             string
	salt             string
	tokens           []int32    // every token the stored blocks read
	digests          [][32]byte // D_0 … D_{m-1}, full blocks only
}

func (e *prefixEntry) Rec() *memostore.Record { return &e.Record }

func (e *prefixEntry) size() int {
	// cap: a kept token array is held whole.
	return entryOverhead + 4*cap(e.tokens) + 32*len(e.digests) + 16*len(e.Fps) + len(e.lora) + len(e.salt)
}

// NewMemo returns a memo that holds about maxBytes of chains; maxBytes <= 0
// returns nil, which disables memoization.
func NewMemo(maxBytes int) *Memo {
	if maxBytes <= 0 {
		return nil
	}
	return (*Memo)(memostore.New[*prefixEntry](maxBytes))
}

// Reset forgets every remembered chain. The service calls it when the last
// context is unregistered, so that memory returns to its idle size; chains
// are otherwise not tied to contexts and leave only through the budget.
// Queries running meanwhile are unaffected: an entry they hold stays valid.
func (m *Memo) Reset() { m.store().Reset() }

// Bytes returns the memory the remembered chains account for, for the
// service's metrics: it grows to the budget under varied traffic and drops
// to zero after Reset.
func (m *Memo) Bytes() int { return m.store().Bytes() }

// Stats returns how many block digests were served from the memo (hits)
// and how many were hashed while a memo was in use (misses). Chains report
// theirs when they are reset or released.
func (m *Memo) Stats() (hits, misses uint64) { return m.store().Stats() }

// readEnd is the number of leading tokens block i of a chain reads: bigram
// pages read one token past their end.
func readEnd(k kind, bs, i int) int {
	if k == kindSGLangBigram {
		return (i+1)*bs + 1
	}
	return (i + 1) * bs
}

// fpWindow is how many tokens at the end of each span its fingerprint
// reads.
const fpWindow = 16

// fingerprints fills c.fpVals with the fingerprint of the chain's first d
// blocks for d = 1, 2, 4, … up to the query's full blocks, then, if the
// last of those is not all of them, of all its full blocks: the deepest
// fingerprint always covers the whole query (see Memo). It leaves none
// when the query cannot use the memo (no full first block, long names).
//
// The header (encoding, block size, root, names) is hashed once; each span
// then adds only its last fpWindow tokens, chained to the fingerprint
// before it, so the cost does not grow with the prompt. Spans that differ
// only outside the windows share a bucket, which costs a comparison, never
// a wrong digest: candidates are verified token by token.
func (c *Chain) fingerprints() {
	c.fpVals = c.fpVals[:0]
	if len(c.lora)+len(c.salt) > MaxMemoNames || c.limit < c.bs || len(c.tokens) < readEnd(c.kind, c.bs, 0) {
		return
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
	fp := d.Sum64()
	var buf [8 + 4*fpWindow]byte
	fed := 0
	span := func(depth int) {
		end := readEnd(c.kind, c.bs, depth-1)
		from := max(fed, end-fpWindow)
		binary.LittleEndian.PutUint64(buf[:8], fp)
		w := copy(buf[8:], int32Bytes(c.tokens[from:end]))
		fp = xxhash.Sum64(buf[:8+w])
		fed = end
		c.fpVals = append(c.fpVals, fp)
	}
	depth := 1
	for ; 2*depth*c.bs <= c.limit; depth *= 2 {
		span(depth)
	}
	span(depth)
	if all := c.limit / c.bs; all > depth {
		span(all)
	}
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
	return memostore.CommonPrefix(int32Bytes(a[:n]), int32Bytes(b[:n])) / 4
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
// query, trying the deepest fingerprint first.
func (c *Chain) findPrefix() {
	c.fingerprints()
	for j := len(c.fpVals) - 1; j >= 0 && c.reuseK == 0; j-- {
		c.memo.store().Lookup(c.fpVals[j], func(e *prefixEntry) bool {
			if k := c.usable(e); k > c.reuseK {
				c.reuse, c.reuseK = e, k
			}
			return true
		})
	}
}

// rememberPrefix stores this query's chain if it hashed full blocks the
// memo did not have. It runs when the chain is released, while the
// caller's tokens are still intact.
func (c *Chain) rememberPrefix() {
	if c.memo == nil || len(c.fpVals) == 0 || len(c.digs) == 0 {
		return
	}
	m := c.reuseK + len(c.digs)
	n := 0 // fingerprints of the depths the stored chain covers
	for depth := 1; depth <= m && n < len(c.fpVals); depth *= 2 {
		n++
	}
	toks := c.tokens[:min(readEnd(c.kind, c.bs, m-1), len(c.tokens))]
	if !c.keepTokens {
		toks = append([]int32(nil), toks...)
	}
	digests := make([][32]byte, 0, m)
	if c.reuseK > 0 {
		digests = append(digests, c.reuse.digests[:c.reuseK]...)
	}
	e := &prefixEntry{
		// The names are copied: /query decodes them as views of a body
		// buffer that is reused once the request is answered, and an
		// entry whose names changed under it would no longer match the
		// queries it was made for; only its fingerprints, hashed from the
		// old names, would keep it from matching another tenant's.
		kind: c.kind, bs: c.bs, root: c.root, lora: strings.Clone(c.lora), salt: strings.Clone(c.salt),
		tokens:  toks,
		digests: append(digests, c.digs...),
	}
	// Filed under the whole query too, even where the walk stopped short
	// of it, so that asking again finds this very chain.
	e.Fps = memostore.FiledUnder(c.fpVals, n)
	e.Size = e.size()
	c.memo.store().Insert(e, e.extends)
}

// extends reports whether e holds o's whole chain, so o is redundant.
func (e *prefixEntry) extends(o *prefixEntry) bool {
	n := len(o.tokens)
	// Chains that share a system prompt and then part (a bucket of a
	// shallow depth holds many) differ at their ends: one comparison there
	// spares a scan of the common prefix for nearly all of them.
	return o.kind == e.kind && o.bs == e.bs && o.root == e.root && o.lora == e.lora && o.salt == e.salt &&
		len(o.digests) <= len(e.digests) && n <= len(e.tokens) && (n == 0 || o.tokens[n-1] == e.tokens[n-1]) &&
		commonPrefix(o.tokens, e.tokens) == n
}

// flushMemoStats adds the chain's counts to its memo once per query.
func (c *Chain) flushMemoStats() {
	if c.memo != nil && (c.memoHits|c.memoMisses) != 0 {
		c.memo.store().Count(c.memoHits, c.memoMisses)
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
	c.reuse, c.reuseK, c.lookedUp = nil, 0, false
	c.digs = c.digs[:0]
	c.fpVals = c.fpVals[:0]
}
