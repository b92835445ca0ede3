// Package tokenmemo is the token memo both doors share: it remembers the
// token ids of recent requests under their packed bytes, so a request
// repeating a prefix seen before (a system prompt, the previous turn of a
// conversation) has those ids copied instead of decoded.
//
// Decoding is the one cost of a warm lookup that the prefix memo cannot
// remove: MessagePack's smallest-format integers (/query) and protobuf's
// varints (LookupRoute's token_ids) both place each id where every id
// before it ends, so decoding is a chain of dependent loads, while
// comparing and copying the same bytes runs at memory speed.
//
// One Memo serves both doors: one instance, one byte budget, one pair of
// hit and miss counts. An entry is one token array, held once, with its
// packed form in each wire format (Format) a door has looked arrays up in
// (Match, or Use): the form of the door that decoded it, exactly as it
// arrived, and the other's canonical encoding of the same ids, so a
// prompt one door learned is a hit on the other. A door that is open but
// has never looked an array up (the gRPC door serving only block hashes,
// say) costs the entries nothing. Each form is filed under fingerprints of
// its own bytes in its own format's domain, and a candidate is verified
// against the form of the request's format byte for byte: equal bytes in
// one format are equal ids, whereas the same bytes in the other format
// may be other ids, so formats never share a form.
//
// Nothing else changes what bytes decode to: the model, tenant, hash
// scheme or profile, block size, salt and adapter of a request choose
// what its ids are looked up in (the query engine, the prefix memo), not
// what they are. So an entry is keyed by its bytes and format alone, and
// the same ids asked for in different contexts share it.
//
// A door reaches the memo only through Door and a Session per request
// (door.go): the decoders take the ids it knows through a hook
// (codec.TokenHook, or the gRPC door's run decoder) and keep none of its
// state, and the query engine never sees it.
//
// Memory is bounded by the store's byte budget with roughly oldest-first
// eviction (memostore); entries hold only pointer-free slices. Safe for
// concurrent use. A nil *Memo is a memo turned off.
package tokenmemo

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// Format is a wire format token ids arrive packed in.
type Format uint8

const (
	// MsgPack is the elements of a MessagePack array of integers (/query's
	// token_ids), each in any integer format a packer chose.
	MsgPack Format = iota
	// Varint is a protobuf packed run of varints (LookupRoute's
	// token_ids, a repeated uint32).
	Varint
	numFormats
)

func (f Format) String() string {
	switch f {
	case MsgPack:
		return "msgpack"
	case Varint:
		return "varint"
	}
	return "unknown"
}

// domain separates the fingerprints of the formats: the same bytes in two
// formats get different fingerprints, so a lookup in one format does not
// even meet the other's forms (it would reject them anyway: see usable).
var domain = [numFormats]uint64{MsgPack: 0, Varint: 0x9e3779b97f4a7c15}

// Chunk is how many ids lie between the byte offsets a form records: the
// granularity at which a partly shared prefix is reused.
const Chunk = memostore.Chunk

// entryOverhead is the memory an entry accounts for besides its slices.
const entryOverhead = 160

// Memo is the token memo; see the package comment.
type Memo struct {
	store *memostore.Store[*Entry]
	// used holds, by Format, whether a door decoding that format has
	// looked an array up: entries get a form in each format in use.
	used [numFormats]atomic.Bool
}

// Entry is one remembered token array; immutable once inserted, and may be
// held and read by a lookup after it was evicted.
type Entry struct {
	memostore.Record
	toks  []int32 // the ids
	forms [numFormats]form
}

// form is an entry's array packed in one format.
type form struct {
	raw  []byte   // the packed ids (nil: the entry has no form in this format)
	ends []uint32 // ends[j]: offset in raw just past id (j+1)·Chunk−1
}

func (e *Entry) Rec() *memostore.Record { return &e.Record }

// Tokens is the entry's ids, never to be modified; they may be kept for as
// long as anyone needs them.
func (e *Entry) Tokens() []int32 { return e.toks }

// Ends is the chunk ends of the entry's form in f (see form.ends).
func (e *Entry) Ends(f Format) []uint32 { return e.forms[f].ends }

// New returns a memo holding about maxBytes of entries (at least
// memostore.MinBytes); maxBytes <= 0 returns nil, a memo turned off.
func New(maxBytes int) *Memo {
	if maxBytes <= 0 {
		return nil
	}
	return &Memo{store: memostore.New[*Entry](maxBytes)}
}

// Use says a door decoding format f consults the memo: from then on, every
// entry learned is also packed in f, so that door finds what the others
// learned. Match calls it on a door's first lookup.
func (m *Memo) Use(f Format) {
	if m != nil {
		m.used[f].Store(true)
	}
}

// Reset forgets every entry; the service calls it once nothing is left to
// look up, so that memory returns to its idle size. Lookups holding an
// entry keep it.
func (m *Memo) Reset() {
	if m != nil {
		m.store.Reset()
	}
}

// Bytes is the memory the entries account for (0 for a nil memo).
func (m *Memo) Bytes() int {
	if m == nil {
		return 0
	}
	return m.store.Bytes()
}

// Count adds to the memo's counts: ids copied from an entry (hits) and ids
// decoded while it was consulted (misses).
func (m *Memo) Count(hits, misses uint64) { m.store.Count(hits, misses) }

// Stats returns how many ids of accepted requests, on both doors, were
// copied from the memo (hits) and how many were decoded while it was
// consulted (misses; arrays too short to look up are not counted).
func (m *Memo) Stats() (hits, misses uint64) {
	if m == nil {
		return 0, 0
	}
	return m.store.Stats()
}

// Fingerprints appends the fingerprints of b, packed in f, that a lookup
// and an entry learned from it are filed under: those of its first 256,
// 512, … bytes for spans ending within limit, then the locator, one of all
// of b (memostore.SpanFingerprints). b starts at the first id; it may go
// on past the array (a /query body's later members), which only the
// locator reads.
func Fingerprints(f Format, b []byte, limit int, dst []uint64) []uint64 {
	n := len(dst)
	dst = memostore.SpanFingerprints(b, limit, dst)
	for i := n; i < len(dst); i++ {
		dst[i] ^= domain[f]
	}
	return dst
}

// Match finds the entry sharing the most leading ids with the n-id array
// packed in f at the start of b (n: an upper bound when the caller has not
// counted them; b may go on past the array): it returns that entry, the
// number of ids k it supplies and the packed length off they span. fps are
// Fingerprints(f, b, …); the deepest is tried first.
func (m *Memo) Match(f Format, b []byte, n int, fps []uint64) (best *Entry, k, off int) {
	if m == nil {
		return nil, 0, 0
	}
	if !m.used[f].Load() {
		m.Use(f)
	}
	for j := len(fps) - 1; j >= 0 && k == 0; j-- {
		m.store.Lookup(fps[j], func(e *Entry) bool {
			if ek, eoff := e.usable(f, b, n); ek > k {
				best, k, off = e, ek, eoff
			}
			return true
		})
	}
	return best, k, off
}

// usable is how many leading ids of e an n-id array packed in f at the
// start of b shares, and the packed length they span: only ids whose bytes
// lie inside the common prefix of b and e's form in f, in whole chunks (or
// all of e), and within the array itself (the bytes after it may happen to
// match too). An entry with no form in f shares none.
func (e *Entry) usable(f Format, b []byte, n int) (k, off int) {
	fm := &e.forms[f]
	if fm.raw == nil {
		return 0, 0
	}
	common := memostore.CommonPrefix(b, fm.raw)
	if common == len(fm.raw) && len(e.toks) <= n {
		return len(e.toks), len(fm.raw)
	}
	c := min(memostore.ChunksWithin(fm.ends, common), n/Chunk)
	if c == 0 {
		return 0, 0
	}
	return c * Chunk, int(fm.ends[c-1])
}

// Remember files an accepted array: toks, decoded from raw packed in f,
// with ends its chunk ends in raw and fps the request's Fingerprints in f
// (the locator last). The entry copies raw and ends. It takes toks itself
// rather than a copy when own allows it and toks is about as long as its
// capacity, and reports whether it did: the caller must then never write
// to toks again. The entry is also packed in every other format in use
// whose encoding can hold the ids. The memo must not be nil.
func (m *Memo) Remember(f Format, raw []byte, toks []int32, ends []uint32, fps []uint64, own bool) (took bool) {
	nf := memostore.SpansWithin(len(raw), len(fps))
	if nf == 0 {
		return false
	}
	e := &Entry{}
	if took = own && cap(toks) <= len(toks)+len(toks)/4; took {
		e.toks = toks[:len(toks):len(toks)]
	} else {
		e.toks = append([]int32(nil), toks...)
	}
	e.forms[f] = form{raw: append([]byte(nil), raw...), ends: append([]uint32(nil), ends...)}
	var filed []uint64
	size := entryOverhead + 4*cap(e.toks)
	for g := range numFormats {
		if g == f || !m.used[g].Load() {
			continue
		}
		fm, ok := encode(g, e.toks)
		if !ok || len(fm.raw) < memostore.FirstSpan {
			continue
		}
		e.forms[g] = fm
		gfps := Fingerprints(g, fm.raw, len(fm.raw), nil)
		filed = append(filed, memostore.FiledUnder(gfps, memostore.SpansWithin(len(fm.raw), len(gfps)))...)
	}
	// The learning format's fingerprints come last: the store accounts an
	// entry in the shard of its last one, the request's own locator.
	if own := memostore.FiledUnder(fps, nf); filed == nil {
		filed = own
	} else {
		filed = append(filed, own...)
	}
	e.Fps = filed
	for g := range numFormats {
		size += len(e.forms[g].raw) + 4*len(e.forms[g].ends)
	}
	e.Size = size + 8*len(e.Fps)
	m.store.Insert(e, e.extends)
	return took
}

// extends reports whether e serves every lookup o serves: in each format o
// has a form in, e's form begins with all of o's bytes (the same ids, packed
// the same way; a body packed otherwise finds o, not e). A lookup then
// finds at least as much in e (up to the last partial chunk).
func (e *Entry) extends(o *Entry) bool {
	if len(o.toks) > len(e.toks) {
		return false
	}
	for g := range numFormats {
		if o.forms[g].raw != nil && !memostore.Extends(e.forms[g].raw, o.forms[g].raw) {
			return false
		}
	}
	return true
}

// encode packs ids in g as the canonical packer of that format does, with
// the chunk ends: MessagePack in each integer's smallest format (as
// Python's packer writes), varints as protobuf writes a uint32. ok is false
// when g cannot carry the ids (a negative id is no uint32). It packs into
// a pooled buffer of the largest size the ids could take and copies the
// result out, so the entry holds exactly its bytes without a pass to
// measure them first.
func encode(g Format, ids []int32) (fm form, ok bool) {
	if g == Varint {
		for _, v := range ids {
			if v < 0 {
				return form{}, false
			}
		}
	}
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	if cap(*bp) < 5*len(ids) {
		*bp = make([]byte, 5*len(ids))
	}
	buf := (*bp)[:5*len(ids)]
	ends := make([]uint32, 0, len(ids)/Chunk)
	at := 0
	for c := 0; c < len(ids); c += Chunk {
		chunk := ids[c:min(c+Chunk, len(ids))]
		switch g {
		case MsgPack:
			at = putMsgPack(buf, at, chunk)
		case Varint:
			at = putVarints(buf, at, chunk)
		}
		if len(chunk) == Chunk {
			ends = append(ends, uint32(at))
		}
	}
	if cap(*bp) > maxScratch {
		*bp = nil // a rare huge array does not stay pooled
	}
	return form{raw: append([]byte(nil), buf[:at]...), ends: ends}, true
}

// scratch holds encode's buffers; maxScratch bounds the one it keeps.
var scratch = sync.Pool{New: func() any { return new([]byte) }}

const maxScratch = 1 << 20

// putVarints writes ids (none negative) at buf[at:] as protobuf varints,
// each at most 5 bytes, and returns the offset past them.
// Each id's length is chosen once and its bytes written at fixed offsets:
// a loop over its bytes cost as much as decoding them.
func putVarints(buf []byte, at int, ids []int32) int {
	for _, v := range ids {
		u := uint32(v)
		b := buf[at : at+5 : at+5] // one bounds check for the id
		switch {
		case u < 1<<7:
			b[0] = byte(u)
			at++
		case u < 1<<14:
			b[0], b[1] = byte(u)|0x80, byte(u>>7)
			at += 2
		case u < 1<<21:
			b[0], b[1], b[2] = byte(u)|0x80, byte(u>>7)|0x80, byte(u>>14)
			at += 3
		case u < 1<<28:
			b[0], b[1], b[2], b[3] = byte(u)|0x80, byte(u>>7)|0x80, byte(u>>14)|0x80, byte(u>>21)
			at += 4
		default:
			b[0], b[1], b[2], b[3], b[4] = byte(u)|0x80, byte(u>>7)|0x80, byte(u>>14)|0x80, byte(u>>21)|0x80, byte(u>>28)
			at += 5
		}
	}
	return at
}

// putMsgPack writes ids at buf[at:] each in its smallest MessagePack
// integer format, at most 5 bytes, and returns the offset past them.
func putMsgPack(buf []byte, at int, ids []int32) int {
	for _, v := range ids {
		b := buf[at : at+5 : at+5] // one bounds check for the id
		switch {
		case v >= 0 && v <= 0x7f:
			b[0] = byte(v)
			at++
		case v >= -32 && v < 0:
			b[0] = byte(int8(v))
			at++
		case v >= 0 && v <= 0xff:
			b[0], b[1] = 0xcc, byte(v)
			at += 2
		case v >= 0 && v <= 0xffff:
			b[0], b[1], b[2] = 0xcd, byte(v>>8), byte(v)
			at += 3
		case v >= 0:
			b[0], b[1], b[2], b[3], b[4] = 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
			at += 5
		case v >= math.MinInt8:
			b[0], b[1] = 0xd0, byte(int8(v))
			at += 2
		case v >= math.MinInt16:
			b[0], b[1], b[2] = 0xd1, byte(v>>8), byte(v)
			at += 3
		default:
			b[0], b[1], b[2], b[3], b[4] = 0xd2, byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
			at += 5
		}
	}
	return at
}
