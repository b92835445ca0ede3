package query

import (
	"bytes"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/memostore"
)

// MinAnswerTokens is the shortest prompt whose answer is remembered: below
// it the walk costs about what remembering and comparing would.
const MinAnswerTokens = 512

// Answers remembers recent lookup answers together with the table version
// (index.Version) each was computed at, so that a prompt asked again while
// its table is unchanged is answered by comparing its token ids with the
// remembered ones, without hashing or walking. An answer is used only at
// exactly its version: one registration or one stripe write since makes it
// miss, so every answer is the one a walk would give at that instant
// (docs/architecture.md, "Answer reuse"). Answers only help while a table
// is quiet, between bursts of events; under steady ingest they miss and
// cost one comparison per remembered prompt asked again.
//
// Memory is bounded by a byte budget, evicted roughly oldest first; Reset
// empties it. A nil *Answers remembers nothing. Safe for concurrent use.
type Answers struct {
	store        *memostore.Store[*answer]
	hits, misses atomic.Uint64
}

// answer is one remembered lookup. It is immutable once inserted.
type answer struct {
	memostore.Record
	tbl      *index.Table
	ver      index.Version
	instance string
	salt     string
	// tokens is the prompt; a token array the token memo remembered is
	// kept as it is (it is never modified), any other is copied.
	tokens []int32
	hits   []index.InstanceHits
}

func (a *answer) Rec() *memostore.Record { return &a.Record }

// NewAnswers returns a cache of about maxBytes; maxBytes <= 0 returns nil.
func NewAnswers(maxBytes int) *Answers {
	if maxBytes <= 0 {
		return nil
	}
	return &Answers{store: memostore.New[*answer](maxBytes)}
}

// Reset forgets every answer, so memory returns to its idle size; the
// service calls it when the last context goes.
func (a *Answers) Reset() {
	if a != nil {
		a.store.Reset()
	}
}

// Bytes returns the memory the remembered answers account for.
func (a *Answers) Bytes() int {
	if a == nil {
		return 0
	}
	return a.store.Bytes()
}

// Stats returns how many lookups long enough to be remembered were
// answered from a remembered answer (hits) and how many walked (misses).
func (a *Answers) Stats() (hits, misses uint64) {
	if a == nil {
		return 0, 0
	}
	return a.hits.Load(), a.misses.Load()
}

// answerSample is how many token ids from each of the prompt's start,
// end and evenly spaced middle positions go into its fingerprint.
const answerSample = 32

// fingerprint files a lookup: the table, the filters, the length and a
// sample of the ids. Entries under one fingerprint are told apart by a
// full comparison, so the sample only has to spread prompts, not identify
// them; hashing all 32 KB of an 8K prompt would cost more than the
// comparison that follows anyway.
func fingerprint(tbl *index.Table, instance, salt string, tokens []int32) uint64 {
	var buf [8 * (3*answerSample + 2)]byte
	b := buf[:0]
	put := func(v uint64) {
		b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
	}
	put(uint64(uintptr(unsafe.Pointer(tbl))))
	put(uint64(len(tokens)))
	n := len(tokens)
	for i := range answerSample {
		put(uint64(uint32(tokens[i%n])) | uint64(uint32(tokens[n-1-i%n]))<<32)
		put(uint64(uint32(tokens[(i*n)/answerSample])))
	}
	d := xxhash.New()
	_, _ = d.Write(b)
	_, _ = d.WriteString(instance)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(salt)
	return d.Sum64()
}

// sameTokens compares two token arrays as bytes, which runs at memory
// speed where an element loop would not.
func sameTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	return bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*len(a)),
		unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b)))
}

func (e *answer) matches(tbl *index.Table, instance, salt string, tokens []int32) bool {
	return e.tbl == tbl && e.instance == instance && e.salt == salt && sameTokens(e.tokens, tokens)
}

// lookup copies into res the answer remembered for this prompt at the
// table's current version, if there is one.
func (a *Answers) lookup(fp uint64, tbl *index.Table, instance, salt string, tokens []int32, res *Result) bool {
	cur := tbl.Version()
	var found *answer
	a.store.Lookup(fp, func(e *answer) bool {
		if e.ver == cur && e.matches(tbl, instance, salt, tokens) {
			found = e
			return false
		}
		return true
	})
	if found == nil {
		a.misses.Add(1)
		return false
	}
	a.hits.Add(1)
	res.Instances = resize(res.Instances, len(found.hits))
	for i, src := range found.hits {
		dst := &res.Instances[i]
		dst.Instance, dst.Max = src.Instance, src.Max
		dst.Ranks = append(dst.Ranks[:0], src.Ranks...)
	}
	return true
}

// remember keeps res as the answer for this prompt at ver, replacing any
// older answer for the same prompt. shared says tokens may be kept as
// they are.
func (a *Answers) remember(fp uint64, tbl *index.Table, ver index.Version, instance, salt string, tokens []int32, shared bool, res *Result) {
	if !shared {
		tokens = append([]int32(nil), tokens...)
	}
	hits := make([]index.InstanceHits, len(res.Instances))
	size := 4*len(tokens) + 256
	for i, src := range res.Instances {
		hits[i] = index.InstanceHits{Instance: src.Instance, Max: src.Max,
			Ranks: append([]index.RankHits(nil), src.Ranks...)}
		size += 64 + len(src.Instance) + len(src.Ranks)*int(unsafe.Sizeof(index.RankHits{}))
	}
	e := &answer{tbl: tbl, ver: ver, instance: instance, salt: salt, tokens: tokens, hits: hits}
	e.Fps = []uint64{fp}
	e.Size = size
	a.store.Insert(e, func(old *answer) bool { return old.matches(tbl, instance, salt, tokens) })
}

// resize returns s with length n, reusing its backing array (and the
// elements' own buffers beyond the old length) when large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return append(s[:cap(s)], make([]T, n-cap(s))...)
}
