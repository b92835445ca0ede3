package codec

import (
	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// TokenMemo remembers the token arrays of recent /query bodies under their
// packed bytes, so that a body repeating a prefix seen before (a system
// prompt, the previous turn of a conversation) has that prefix copied
// rather than decoded.
//
// Decoding is the one cost of a warm query that the prefix memo cannot
// remove: Python's packer gives each id the smallest integer format, so
// where an id starts depends on every id before it, and decoding is a chain
// of dependent loads, about 4 ns per id here; it is a third of a warm 8K
// query. Comparing and copying the same bytes runs at memory speed.
//
// Entries are filed under fingerprints of the array's first 256, 512,
// 1024, … packed bytes and under one of the whole body they came in (see
// fingerprints), which a query computes from a few bytes of its body
// without decoding anything; the deepest is looked up first. A
// candidate is then verified with memcmp: only tokens whose bytes lie
// inside the common byte prefix are reused, at a granularity of memoChunk
// tokens (or the whole remembered array). MessagePack values delimit
// themselves, so equal bytes are equal tokens: a reused prefix is exactly
// what decoding would give, and it was validated when it was first
// decoded. The rest of the array is
// decoded and checked as usual, so a body that is malformed anywhere is
// rejected with the same error as without the memo.
//
// Memory is bounded by a byte budget with roughly oldest-first eviction;
// entries hold only pointer-free slices, and an entry's token array may
// also be kept by the prefix memo (see QueryRequest.TokensShared), so the
// two budgets count it twice. Safe for concurrent use.
type TokenMemo memostore.Store[*packedEntry]

// store is the memo's store: the same pointer, nil for a nil memo.
func (m *TokenMemo) store() *memostore.Store[*packedEntry] {
	return (*memostore.Store[*packedEntry])(m)
}

const (
	// memoMinTokens: shorter arrays decode in less time than a lookup.
	memoMinTokens = 256
	// memoChunk is the number of tokens between the byte offsets an entry
	// records (memostore.Chunk).
	memoChunk      = memostore.Chunk
	packedOverhead = 160
)

// packedEntry is one remembered token array. It is immutable once published.
type packedEntry struct {
	memostore.Record
	raw  []byte   // the array's elements exactly as they were packed
	toks []int32  // what raw decodes to
	ends []uint32 // ends[j]: the offset in raw just past token (j+1)·memoChunk−1
}

func (e *packedEntry) Rec() *memostore.Record { return &e.Record }

// NewTokenMemo returns a memo holding about maxBytes of token arrays;
// maxBytes <= 0 returns nil, which decodes every body in full.
func NewTokenMemo(maxBytes int) *TokenMemo {
	if maxBytes <= 0 {
		return nil
	}
	return (*TokenMemo)(memostore.New[*packedEntry](maxBytes))
}

// Reset forgets every remembered array; the service calls it when the last
// context is unregistered, so that memory returns to its idle size.
func (m *TokenMemo) Reset() { m.store().Reset() }

// Bytes returns the memory the remembered arrays account for.
func (m *TokenMemo) Bytes() int { return m.store().Bytes() }

// Stats returns how many tokens of accepted /query bodies were copied from
// the memo (hits) and how many were decoded while it was consulted (misses;
// arrays too short to look up are not counted).
func (m *TokenMemo) Stats() (hits, misses uint64) { return m.store().Stats() }

// DecodeQuery is codec.DecodeQuery consulting the memo: the result, and the
// error for a malformed body, are the same. q.Tokens may then be a
// remembered array, which must not be modified. A nil memo decodes in full.
// The memo learns the body's array only through Remember.
func (m *TokenMemo) DecodeQuery(body []byte, lim Limits, q *QueryRequest) *Error {
	q.memo = m
	e := decodeQueryBody(body, lim, q)
	q.memo = nil
	if e != nil || m == nil || q.learn.fps == 0 {
		return e
	}
	l := &q.learn
	m.store().Count(uint64(l.reused), uint64(len(q.Tokens)-l.reused))
	if len(q.Tokens)-l.reused >= memoChunk {
		q.packed = body[l.start:l.end]
	}
	return nil
}

// Remember lets the memo learn the token array q was just decoded from,
// if it holds enough tokens the memo did not have. The server calls it
// once it knows the query has a context to be answered from, so that
// queries for nothing (a model not registered, or no longer) do not fill
// the memo. The body q was decoded from must still be intact.
func (m *TokenMemo) Remember(q *QueryRequest) {
	packed := q.packed
	q.packed = nil
	if m == nil || packed == nil {
		return
	}
	if m.remember(packed, q.buf[:len(q.Tokens)], q.ends, q.fps[:q.learn.fps]) {
		// The entry took the buffer (see remember): q.Tokens is now a
		// remembered array, and the next decode gets a new one.
		q.buf = nil
	}
}

// TokensShared reports whether q.Tokens is a token memo's remembered
// array, which is never modified and may be kept (hashing.Chain.KeepTokens)
// for as long as anyone needs it.
func (q *QueryRequest) TokensShared() bool {
	return len(q.Tokens) > 0 && (len(q.buf) == 0 || &q.buf[0] != &q.Tokens[0])
}

// memoLearn describes the token array of the body being decoded, for the
// memo to remember once the whole body is accepted.
type memoLearn struct {
	start, end int // the array's elements in the body
	reused     int // leading tokens copied from the memo
	fps        int // fingerprints computed (0: the memo was not consulted)
}

// fingerprints appends the fingerprints of rest's spans that an array of
// n elements could span (at most 9 bytes each), then, if there were any,
// the body's locator: a fingerprint of all of rest, so of the whole array
// and the body after it (memostore.SpanFingerprints).
func fingerprints(rest []byte, n int, dst []uint64) []uint64 {
	return memostore.SpanFingerprints(rest, 9*n, dst)
}

// match finds the remembered array sharing the most leading tokens with the
// n-element array packed at the start of rest: it returns that entry, the
// number of tokens k it supplies and the packed length off they span.
func (m *TokenMemo) match(rest []byte, n int, fps []uint64) (best *packedEntry, k, off int) {
	for j := len(fps) - 1; j >= 0 && k == 0; j-- {
		m.store().Lookup(fps[j], func(e *packedEntry) bool {
			if ek, eoff := e.usable(rest, n); ek > k {
				best, k, off = e, ek, eoff
			}
			return true
		})
	}
	return best, k, off
}

// usable is how many leading tokens of e an n-element array packed at the
// start of rest shares, and the packed length they span.
func (e *packedEntry) usable(rest []byte, n int) (k, off int) {
	common := memostore.CommonPrefix(rest, e.raw)
	if common == len(e.raw) && len(e.toks) <= n {
		return len(e.toks), len(e.raw)
	}
	// Chunks whose bytes all lie in the common prefix, and within the
	// query's own array (the bytes after it may happen to match too).
	c := min(memostore.ChunksWithin(e.ends, common), n/memoChunk)
	if c == 0 {
		return 0, 0
	}
	return c * memoChunk, int(e.ends[c-1])
}

// remember files an accepted array (a copy of raw, its tokens, and the
// offsets of its chunk ends) under the fingerprints that lie inside it and
// its body's locator, the last of fps (see fingerprints). It
// takes toks itself rather than a copy when toks is about as long as its
// capacity, and reports whether it did: the caller must then never write
// to toks again.
func (m *TokenMemo) remember(raw []byte, toks []int32, ends []uint32, fps []uint64) (took bool) {
	nf := memostore.SpansWithin(len(raw), len(fps))
	if nf == 0 {
		return false
	}
	e := &packedEntry{
		raw:  append([]byte(nil), raw...),
		ends: append([]uint32(nil), ends...),
	}
	if took = cap(toks) <= len(toks)+len(toks)/4; took {
		e.toks = toks[:len(toks):len(toks)]
	} else {
		e.toks = append([]int32(nil), toks...)
	}
	e.Fps = memostore.FiledUnder(fps, nf)
	e.Size = packedOverhead + len(e.raw) + 4*cap(e.toks) + 4*len(e.ends) + 8*len(e.Fps)
	m.store().Insert(e, e.extends)
	return took
}

// extends reports whether e holds o's whole array as its own prefix, so a
// query finds at least as much in e (up to the last partial chunk).
func (e *packedEntry) extends(o *packedEntry) bool {
	return len(o.toks) <= len(e.toks) && memostore.Extends(e.raw, o.raw)
}
