package grpcapi

import (
	"encoding/binary"
	"math/bits"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// tokenMemo remembers the packed token_ids of recent lookups with the ids
// they decode to, so a lookup repeating a prefix seen before (a system
// prompt, the previous turn) copies those ids instead of decoding them —
// what the HTTP side's token memo does for MessagePack bodies. Decoding
// 8K varints is a chain of dependent loads and the largest part of a warm
// lookup; comparing and copying the same bytes runs at memory speed.
//
// A varint ends at its first byte below 0x80, so equal packed bytes are
// equal ids: a remembered entry is checked against the request byte for
// byte (memcmp), and only ids whose bytes lie inside the common prefix are
// reused, in chunks of memostore.Chunk ids (or the whole entry). The rest is
// decoded as usual. Entries are filed under fingerprints of the run's first
// 256, 512, 1024, … bytes and of the whole run (memostore), found without
// decoding anything. Memory is bounded by the store's byte budget.
type tokenMemo memostore.Store[*tmEntry]

// store is the memo's store: the same pointer, nil for a nil memo.
func (m *tokenMemo) store() *memostore.Store[*tmEntry] {
	return (*memostore.Store[*tmEntry])(m)
}

// tmOverhead is the memory an entry accounts for besides its slices.
const tmOverhead = 160

// tmEntry is one remembered run; immutable once inserted.
type tmEntry struct {
	memostore.Record
	raw  []byte   // the packed run
	toks []uint32 // what it decodes to
	ends []uint32 // ends[j]: offset in raw just past id (j+1)·memostore.Chunk−1
	fits bool     // every id is at most MaxInt32
}

func (e *tmEntry) Rec() *memostore.Record { return &e.Record }

func newTokenMemo(maxBytes int) *tokenMemo {
	if maxBytes <= 0 {
		return nil
	}
	return (*tokenMemo)(memostore.New[*tmEntry](maxBytes))
}

// reset forgets every remembered run, so the memo's memory returns to its
// idle size; lookups decoding meanwhile keep the entries they hold.
func (m *tokenMemo) reset() { m.store().Reset() }

// bytes is the memory the remembered runs account for.
func (m *tokenMemo) bytes() int { return m.store().Bytes() }

// usable is how many leading ids of e run shares, and their packed length.
func (e *tmEntry) usable(run []byte) (k, off int) {
	common := memostore.CommonPrefix(run, e.raw)
	if common == len(e.raw) {
		return len(e.toks), len(e.raw)
	}
	c := memostore.ChunksWithin(e.ends, common)
	if c == 0 {
		return 0, 0
	}
	return c * memostore.Chunk, int(e.ends[c-1])
}

// decodeRun appends the ids packed in run to dst (as uint32, truncating as
// protobuf does), copying a remembered prefix when the memo has one. When
// it decoded a chunk or more itself, it notes in l what remembering the run
// takes (the first such run of a request only), for learn once the lookup
// proved to have a context. ok is false for a malformed run, exactly when
// decoding it in full would fail. lent says the result is the memo's own
// array (read-only, never to be reused); narrow, that every id appended is
// known to fit an int32.
func (m *tokenMemo) decodeRun(dst []uint32, run []byte, l *tmLearn) (out []uint32, lent, narrow, ok bool) {
	if m == nil || len(run) < memostore.FirstSpan {
		out, narrow, ok = appendPacked(dst, run)
		return out, false, narrow, ok
	}
	var fpBuf [24]uint64
	fps := memostore.SpanFingerprints(run, len(run), fpBuf[:0])
	var best *tmEntry
	k, off := 0, 0
	for j := len(fps) - 1; j >= 0 && k == 0; j-- {
		m.store().Lookup(fps[j], func(e *tmEntry) bool {
			if ek, eoff := e.usable(run); ek > k {
				best, k, off = e, ek, eoff
			}
			return true
		})
	}
	base := len(dst)
	if off == len(run) { // the whole run was remembered
		m.store().Count(uint64(k), 0)
		if base == 0 {
			// The entry is immutable and the request only reads its
			// ids: share them (capped, so an append would copy).
			return best.toks[:k:k], true, best.fits, true
		}
		return append(dst, best.toks[:k]...), false, best.fits, true
	}
	rest := varintCount(run[off:]) // only the bytes not reused are counted
	dst = growTo(dst, k+rest)
	if best != nil {
		dst = append(dst, best.toks[:k]...)
	}
	var restNarrow bool
	if dst, restNarrow, ok = appendCounted(dst, run[off:], rest); !ok {
		return dst, false, false, false
	}
	narrow = restNarrow && (best == nil || best.fits)
	m.store().Count(uint64(k), uint64(rest))
	if rest >= memostore.Chunk && !l.pending {
		// Worth remembering. The run is copied: the transport reuses
		// its buffer once the decode returns. The ids stay in dst,
		// which the request keeps.
		l.pending, l.narrow, l.off, l.k = true, narrow, off, k
		l.raw = append(l.raw[:0], run...)
		l.toks = dst[base:len(dst):len(dst)]
		l.fps = append(l.fps[:0], fps...)
		l.reused = nil
		if best != nil {
			l.reused = best.ends[:k/memostore.Chunk]
		}
	}
	return dst, false, narrow, true
}

// tmLearn is what remembering a decoded run takes, kept from the decode
// (decodeRun) until the server knows the lookup has a context to answer
// from (learn): lookups for unknown tenants, models or schemes must not
// fill the memo. A pooled lookup call holds one, reused by its lookups.
type tmLearn struct {
	pending bool
	narrow  bool
	raw     []byte   // a copy of the run
	toks    []uint32 // its ids, in the request's array
	fps     []uint64 // its fingerprints (memostore.SpanFingerprints)
	reused  []uint32 // chunk ends of the ids copied from an entry (the entry's)
	off, k  int      // the packed length and number of those ids
}

// forget drops the pending run, and the views into a request and an entry
// it holds; raw is kept for the next decode unless it grew too large.
func (l *tmLearn) forget() {
	l.pending, l.toks, l.reused = false, nil, nil
	if cap(l.raw) > maxPooledBytes {
		l.raw = nil
	}
}

// learn remembers the run l notes, if any: with the chunk ends of its ids,
// those it reused taken from the entry they came from, the rest found in
// its bytes. The request l's ids lie in must still be intact.
func (m *tokenMemo) learn(l *tmLearn) {
	if m == nil || !l.pending {
		return
	}
	ends := make([]uint32, 0, len(l.toks)/memostore.Chunk)
	ends = append(ends, l.reused...)
	ends = appendChunkEnds(ends, l.raw, l.off, l.k)
	m.remember(l.raw, l.toks, ends, l.fps, l.narrow)
	l.forget()
}

// appendChunkEnds appends to ends the offset just past every memostore.Chunk-th
// varint of run, counting seen varints before offset i. It steps eight
// bytes at a time, counting their final bytes at once, and looks at single
// bytes only in the words where a chunk ends: a byte at a time this was
// nearly half the cost of decoding a run the memo lacked.
func appendChunkEnds(ends []uint32, run []byte, i, seen int) []uint32 {
	next := (seen/memostore.Chunk + 1) * memostore.Chunk // the count at which the next chunk ends
	for {
		stop := len(run)
		if i+8 <= len(run) {
			c := 8 - bits.OnesCount64(binary.LittleEndian.Uint64(run[i:])&0x8080808080808080)
			if seen+c < next {
				seen, i = seen+c, i+8
				continue
			}
			stop = i + 8
		}
		for ; i < stop; i++ {
			if run[i] < 0x80 {
				if seen++; seen == next {
					ends = append(ends, uint32(i+1))
					next += memostore.Chunk
				}
			}
		}
		if i >= len(run) {
			return ends
		}
	}
}

// remember files a decoded run under the fingerprints of the spans it
// covers and its whole-run fingerprint. It copies run and toks, and keeps
// ends itself.
func (m *tokenMemo) remember(run []byte, toks []uint32, ends []uint32, fps []uint64, narrow bool) {
	e := &tmEntry{
		raw:  append([]byte(nil), run...),
		toks: append([]uint32(nil), toks...),
		ends: ends, // the caller's own, made for the entry
	}
	// Checked once here, so a lookup the entry serves need not.
	e.fits = narrow || fitInt32(e.toks)
	e.Fps = memostore.FiledUnder(fps, memostore.SpansWithin(len(run), len(fps)))
	e.Size = tmOverhead + len(e.raw) + 4*len(e.toks) + 4*len(e.ends) + 8*len(e.Fps)
	m.store().Insert(e, func(o *tmEntry) bool { return memostore.Extends(e.raw, o.raw) })
}
