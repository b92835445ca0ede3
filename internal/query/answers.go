package query

import (
	"crypto/rand"
	"encoding/binary"
	"slices"
	"strings"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// MinAnswerTokens is the shortest prompt whose answer is remembered: below
// it the walk costs about what hashing the ids and remembering would.
const MinAnswerTokens = 512

// Answers remembers recent lookup answers together with the table version
// (index.Version) each was computed at, so that a prompt asked again while
// its table is unchanged is answered by one 128-bit hash of its token ids
// (promptID) and a map lookup, without hashing blocks or walking. An answer
// is used only at exactly its version: one registration or one stripe
// write since makes it miss, so every answer is the one a walk would give
// at that instant (docs/architecture.md, "Answer reuse"). Answers only
// help while a table is quiet, between bursts of events; under steady
// ingest they miss, at the cost of that hash (BENCHMARKS.md, parts).
//
// Memory is bounded by a byte budget, evicted roughly oldest first; Reset
// empties it. A nil *Answers remembers nothing. Safe for concurrent use.
type Answers memostore.Store[*answer]

// store is the cache's store: the same pointer, nil for a nil cache.
func (a *Answers) store() *memostore.Store[*answer] {
	return (*memostore.Store[*answer])(a)
}

// answer is one remembered lookup. It is immutable once inserted.
type answer struct {
	memostore.Record
	tbl      *index.Table
	ver      index.Version
	instance string
	salt     string
	id       xxh3.Uint128 // the prompt's (promptID)
	hits     []index.InstanceHits
	fp       [1]uint64 // Fps's array
}

func (a *answer) Rec() *memostore.Record { return &a.Record }

// NewAnswers returns a cache of about maxBytes; maxBytes <= 0 returns nil.
func NewAnswers(maxBytes int) *Answers {
	if maxBytes <= 0 {
		return nil
	}
	return (*Answers)(memostore.New[*answer](maxBytes))
}

// Reset forgets every answer, so memory returns to its idle size; the
// service calls it when the last context goes.
func (a *Answers) Reset() { a.store().Reset() }

// Bytes returns the memory the remembered answers account for.
func (a *Answers) Bytes() int { return a.store().Bytes() }

// Stats returns how many lookups long enough to be remembered were
// answered from a remembered answer (hits) and how many walked (misses).
func (a *Answers) Stats() (hits, misses uint64) { return a.store().Stats() }

// seed keys the prompt hash per process, so that nobody outside can
// choose two prompts with the same hash.
var seed = func() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("query: no randomness for the answer cache's seed: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}()

// promptID identifies a lookup's token ids: a 128-bit xxh3 of their bytes
// under the process's seed. Two different prompts share an id with
// probability 2^-128, far below that of two different blocks sharing the
// 64-bit keys the index itself is built on, and hashing a prompt just
// decoded (so in cache) is cheaper than comparing it with a remembered copy
// that no longer is, a copy an answer then need not keep either.
func promptID(tokens []int32) xxh3.Uint128 {
	if len(tokens) == 0 {
		return xxh3.Hash128Seed(nil, seed)
	}
	return xxh3.Hash128Seed(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)), seed)
}

// fingerprint files a lookup: its prompt id with the table and the
// filters folded in.
func fingerprint(tbl *index.Table, instance, salt string, id xxh3.Uint128) uint64 {
	return id.Lo ^ uint64(uintptr(unsafe.Pointer(tbl)))*0x9e3779b97f4a7c15 ^
		xxh3.HashString(instance)*0xbf58476d1ce4e5b9 ^ xxh3.HashString(salt)*0x94d049bb133111eb
}

func (e *answer) matches(tbl *index.Table, instance, salt string, id xxh3.Uint128) bool {
	return e.id == id && e.tbl == tbl && e.instance == instance && e.salt == salt
}

// lookup copies into res the answer remembered for this prompt at the
// table's current version, if there is one.
func (a *Answers) lookup(fp uint64, tbl *index.Table, instance, salt string, id xxh3.Uint128, res *Result) bool {
	var found *answer
	var cur index.Version
	read := false
	a.store().Lookup(fp, func(e *answer) bool {
		if !e.matches(tbl, instance, salt, id) {
			return true
		}
		// The version costs a load per stripe: read it only once a
		// remembered answer is for this very lookup.
		if !read {
			cur, read = tbl.Version(), true
		}
		if e.ver == cur {
			found = e
			return false
		}
		return true
	})
	if found == nil {
		a.store().Count(0, 1)
		return false
	}
	a.store().Count(1, 0)
	// Grown from empty, so a reused result keeps its rank buffers.
	res.Instances = slices.Grow(res.Instances[:0], len(found.hits))[:len(found.hits)]
	for i, src := range found.hits {
		dst := &res.Instances[i]
		dst.Instance, dst.Max = src.Instance, src.Max
		dst.Ranks = append(dst.Ranks[:0], src.Ranks...)
	}
	return true
}

// remember keeps res as the answer for this prompt at ver, replacing any
// older answer for the same prompt.
func (a *Answers) remember(fp uint64, tbl *index.Table, ver index.Version, instance, salt string, id xxh3.Uint128, res *Result) {
	// Most lookups are cold (a prompt asked once), so an answer costs
	// three allocations: itself, its instances and all their ranks.
	hits := make([]index.InstanceHits, len(res.Instances))
	nr := 0
	for _, src := range res.Instances {
		nr += len(src.Ranks)
	}
	ranks := make([]index.RankHits, 0, nr)
	size := answerOverhead + len(instance) + len(salt)
	for i, src := range res.Instances {
		from := len(ranks)
		ranks = append(ranks, src.Ranks...)
		hits[i] = index.InstanceHits{Instance: src.Instance, Max: src.Max, Ranks: ranks[from:len(ranks):len(ranks)]}
		size += int(unsafe.Sizeof(src)) + len(src.Instance) + len(src.Ranks)*int(unsafe.Sizeof(index.RankHits{}))
	}
	// instance and salt are copied: /query decodes them as views of the
	// request body, whose buffer is reused once the request is answered,
	// and an answer whose filters changed under it would never match its
	// own prompt again.
	e := &answer{tbl: tbl, ver: ver, instance: strings.Clone(instance), salt: strings.Clone(salt), id: id, hits: hits}
	e.fp[0] = fp
	e.Fps = e.fp[:]
	e.Size = size
	a.store().Insert(e, func(old *answer) bool { return old.matches(tbl, instance, salt, id) })
}

// answerOverhead is what an answer costs besides its strings and hits: the
// entry, its fingerprint slice and the store's references to it.
const answerOverhead = 256
