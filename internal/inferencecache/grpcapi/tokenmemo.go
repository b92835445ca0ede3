package grpcapi

import (
	"encoding/binary"
	"math/bits"

	"math"
	"unsafe"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
)

// The door's token_ids are looked up in, and taught to, the token memo
// both doors share (internal/tokenmemo), in its Varint format: a varint
// ends at its first byte below 0x80, so equal packed bytes are equal ids,
// and a lookup repeating a prefix seen on either door (a system prompt,
// the previous turn) copies those ids instead of decoding them. Decoding
// 8K varints is a chain of dependent loads and the largest part of a warm
// lookup; comparing and copying the same bytes runs at memory speed.

// uint32s is ids as the uint32 token_ids protobuf decodes to: the same
// memory, read only. The memo's Varint forms hold no negative id, so the
// values are the ids themselves.
func uint32s(ids []int32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
}

// int32s is ids, each at most MaxInt32, as the int32 tokens the memo and
// the query engine take: the same memory.
func int32s(ids []uint32) []int32 {
	return unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ids))), len(ids))
}

// decodeRun appends the ids packed in run to dst (as uint32, truncating as
// protobuf does), copying a remembered prefix when the memo has one. When
// it decoded a chunk or more itself, it notes in l what remembering the run
// takes (the first such run of a request only), for learnRun once the lookup
// proved to have a context. ok is false for a malformed run, exactly when
// decoding it in full would fail. lent says the result is the memo's own
// array (read-only, never to be reused); narrow, that every id appended is
// known to fit an int32.
func decodeRun(m *tokenmemo.Memo, dst []uint32, run []byte, l *tmLearn) (out []uint32, lent, narrow, ok bool) {
	if m == nil || len(run) < memostore.FirstSpan {
		out, narrow, ok = appendPacked(dst, run)
		return out, false, narrow, ok
	}
	var fpBuf [24]uint64
	fps := tokenmemo.Fingerprints(tokenmemo.Varint, run, len(run), fpBuf[:0])
	// The run is exactly the ids: no bound on their number to give.
	best, k, off := m.Match(tokenmemo.Varint, run, math.MaxInt, fps)
	base := len(dst)
	if off == len(run) { // the whole run was remembered
		m.Count(uint64(k), 0)
		ids := uint32s(best.Tokens()[:k:k])
		if base == 0 {
			// The entry is immutable and the request only reads its
			// ids: share them (capped, so an append would copy).
			return ids, true, true, true
		}
		return append(dst, ids...), false, true, true
	}
	rest := varintCount(run[off:]) // only the bytes not reused are counted
	dst = growTo(dst, k+rest)
	if best != nil {
		dst = append(dst, uint32s(best.Tokens()[:k])...)
	}
	if dst, narrow, ok = appendCounted(dst, run[off:], rest); !ok {
		return dst, false, false, false
	}
	m.Count(uint64(k), uint64(rest))
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
			l.reused = best.Ends(tokenmemo.Varint)[:k/memostore.Chunk]
		}
	}
	return dst, false, narrow, true
}

// tmLearn is what remembering a decoded run takes, kept from the decode
// (decodeRun) until the server knows the lookup has a context to answer
// from (learnRun): lookups for unknown tenants, models or schemes must not
// fill the memo. A pooled lookup call holds one, reused by its lookups.
type tmLearn struct {
	pending bool
	narrow  bool
	raw     []byte   // a copy of the run
	toks    []uint32 // its ids, in the request's array
	fps     []uint64 // its fingerprints (tokenmemo.Fingerprints)
	reused  []uint32 // chunk ends of the ids copied from an entry (the entry's)
	ends    []uint32 // the run's chunk ends, made by learnRun (the memo copies them)
	off, k  int      // the packed length and number of those ids
}

// forget drops the pending run, and the views into a request and an entry
// it holds; raw is kept for the next decode unless it grew too large.
func (l *tmLearn) forget() {
	l.pending, l.toks, l.reused = false, nil, nil
	if cap(l.raw) > maxPooledBytes {
		l.raw = nil
	}
	if 4*cap(l.ends) > maxPooledBytes {
		l.ends = nil
	}
}

// learnRun remembers the run l notes, if any: with the chunk ends of its ids,
// those it reused taken from the entry they came from, the rest found in
// its bytes. The request l's ids lie in must still be intact.
//
// A run with an id over MaxInt32 is not learned: no lookup answers it, and
// the memo's ids are int32s, the query engine's tokens.
func learnRun(m *tokenmemo.Memo, l *tmLearn) {
	if m == nil || !l.pending {
		return
	}
	if l.narrow || fitInt32(l.toks) {
		l.ends = append(l.ends[:0], l.reused...)
		l.ends = appendChunkEnds(l.ends, l.raw, l.off, l.k)
		m.Remember(tokenmemo.Varint, l.raw, int32s(l.toks), l.ends, l.fps, false)
	}
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
