package tokenmemo

import (
	"encoding/binary"
	"math/bits"

	"github.com/mooncake-conductor-go/conductor/internal/memostore"
)

// Door is how one door uses the memo: the format its token arrays arrive
// in and what the door lets the memo keep. It is the one place a door
// consults and teaches the memo (docs/architecture.md, "The gRPC door"): the
// decoders only take ids they are told are known (codec.TokenHook), and
// the query engine never sees the memo. A Door with a nil Memo is a memo
// turned off: every array is decoded in full and nothing is learned.
type Door struct {
	Memo   *Memo
	Format Format
	// Transient says the packed bytes are reused once the decode returns
	// (the gRPC transport's buffer): a run to learn is copied. Otherwise
	// they must stay intact until Teach (the HTTP request body).
	Transient bool
	// Own says the decoded ids are the request's own buffer, which the
	// memo may take instead of copying (Teach reports whether it did).
	Own bool
}

// memoMinTokens: a MessagePack array shorter than this decodes in less
// time than a memo lookup takes.
const memoMinTokens = 256

// maxPooledBytes bounds each buffer a Session keeps between requests: a
// rare huge array does not stay pinned in a pooled session.
const maxPooledBytes = 256 << 10

// Session is one request's use of the memo through a Door: it supplies the
// known leading ids of each packed array the request's decoder reads
// (KnownTokens), hears where decoded chunks end (TokenChunkEnd) and what
// the array decoded to (TokensAccepted, Accepted), and keeps what teaching
// the memo takes until the door knows the request has a context to be
// answered from (Teach): queries for nothing (a model nobody registered,
// or no longer) must not fill the memo. It implements codec.TokenHook.
// A door keeps one per pooled request: Begin, decode, answer, Teach or
// not, Forget. Not safe for concurrent use.
type Session struct {
	door *Door
	// The array being decoded: its fingerprints, the leading ids the memo
	// supplied (k, spanning off bytes; reused is their entry's chunk
	// ends), and the chunk ends of the rest as the decoder reported them.
	consulted bool
	fps       []uint64
	k, off    int
	reused    []uint32
	decEnds   []uint32
	lent      bool
	// The array to learn, kept from a TokensAccepted until Teach. Its
	// slices swap with the working ones above, so a later array of the
	// same request (a second gRPC run) does not overwrite them.
	pending  bool
	raw      []byte // the packed ids (a view, or rawBuf when Transient)
	rawBuf   []byte
	toks     []int32
	lfps     []uint64
	lreused  []uint32
	ldecEnds []uint32
	lk, loff int
	lchecked bool
	ends     []uint32 // the whole array's chunk ends, made by Teach
}

// Begin starts a request through d, forgetting the last one.
func (s *Session) Begin(d *Door) {
	s.Forget()
	s.door = d
}

// Lent reports whether the last array's ids are the memo's own (the whole
// array was remembered, or Teach took them): never to be modified, and they may be kept
// (hashing.Chain.KeepTokens) for as long as anyone needs them.
func (s *Session) Lent() bool { return s.lent }

// KnownTokens looks the array packed at the start of elems up in the
// memo: n is its number of ids, or an upper bound when the door has not
// counted them (a varint run, which then is exactly elems). It returns the
// leading ids the memo shares with it and the packed length they span,
// and the stride at which the door's decoder reports chunk ends (only a
// MessagePack array's: a varint run's are found again from its bytes).
func (s *Session) KnownTokens(elems []byte, n int) (ids []int32, size, stride int) {
	s.consulted, s.lent, s.k, s.off, s.reused = false, false, 0, 0, nil
	s.decEnds = s.decEnds[:0]
	d := s.door
	if d == nil || d.Memo == nil {
		return nil, 0, 0
	}
	// The bytes fingerprinted are those the array could reach: a
	// MessagePack id takes at most 9 bytes, a varint run is all of elems.
	limit := len(elems)
	switch d.Format {
	case MsgPack:
		if n < memoMinTokens {
			return nil, 0, 0
		}
		limit, stride = 9*n, Chunk
	case Varint:
		if len(elems) < memostore.FirstSpan {
			return nil, 0, 0
		}
	}
	s.consulted = true
	s.fps = Fingerprints(d.Format, elems, limit, s.fps[:0])
	best, k, off := d.Memo.Match(d.Format, elems, n, s.fps)
	if k == 0 {
		return nil, 0, stride
	}
	s.k, s.off, s.reused = k, off, best.Ends(d.Format)[:k/Chunk]
	s.lent = k == n
	// The entry is immutable: its ids are lent capped, so an append copies.
	return best.Tokens()[:k:k], off, stride
}

// TokenChunkEnd notes the offset in the array just past id j·Chunk−1, for
// each such id decoded rather than supplied.
func (s *Session) TokenChunkEnd(off int) {
	if s.consulted {
		s.decEnds = append(s.decEnds, uint32(off))
	}
}

// TokensAccepted is Accepted(elems, tokens, true): the whole MessagePack
// body was accepted, and every int32 is a MessagePack id.
func (s *Session) TokensAccepted(elems []byte, tokens []int32) { s.Accepted(elems, tokens, true) }

// Accepted tells the session that the array KnownTokens was last asked
// about is exactly elems and decoded to tokens: the memo counts its ids
// copied and decoded, and, when a chunk or more was decoded, the session
// keeps it for Teach (the request's first such array only). checked says
// every id is known to be one the door's format gives the memo as it is:
// a varint door's ids, which arrive as uint32 and are handed over as the
// same bits in int32s, are checked by Teach otherwise (an id over
// MaxInt32 is answered by no lookup, so the array is not learned). elems
// and tokens must stay intact until Teach, except elems on a Transient
// door, which are copied.
func (s *Session) Accepted(elems []byte, tokens []int32, checked bool) {
	if !s.consulted {
		return
	}
	s.consulted = false
	d := s.door
	decoded := len(tokens) - s.k
	d.Memo.Count(uint64(s.k), uint64(decoded))
	if s.pending || decoded < Chunk {
		return
	}
	s.pending, s.toks, s.lk, s.loff, s.lreused, s.lchecked = true, tokens, s.k, s.off, s.reused, checked
	s.fps, s.lfps = s.lfps, s.fps
	s.decEnds, s.ldecEnds = s.ldecEnds, s.decEnds
	if d.Transient {
		s.rawBuf = append(s.rawBuf[:0], elems...)
		s.raw = s.rawBuf
	} else {
		s.raw = elems
	}
}

// Teach has the memo learn the array the session keeps, if any, with its
// chunk ends: those of the ids the memo supplied taken from the entry they
// came from, the rest as the decoder reported them (MessagePack) or found
// again in its bytes (varints). It reports whether the memo took the ids
// themselves (on an Own door): the door must then never write to them
// again (codec.QueryRequest.DetachTokens). The packed bytes must still be
// intact (see Accepted).
func (s *Session) Teach() (took bool) {
	if !s.pending {
		return false
	}
	d := s.door
	if d.Format == Varint && !s.lchecked && hasNegative(s.toks) {
		s.Forget()
		return false
	}
	s.ends = append(s.ends[:0], s.lreused...)
	if d.Format == Varint {
		s.ends = appendVarintChunkEnds(s.ends, s.raw, s.loff, s.lk)
	} else {
		s.ends = append(s.ends, s.ldecEnds...)
	}
	took = d.Memo.Remember(d.Format, s.raw, s.toks, s.ends, s.lfps, d.Own)
	s.Forget()
	s.lent = took
	return took
}

// Forget drops what the session holds of the last request: the views into
// its body, its ids and a memo entry. Buffers are kept for the next
// request unless they grew too large.
func (s *Session) Forget() {
	s.consulted, s.lent, s.pending = false, false, false
	s.reused, s.lreused, s.raw, s.toks = nil, nil, nil, nil
	if cap(s.rawBuf) > maxPooledBytes {
		s.rawBuf = nil
	}
	if 4*cap(s.ends) > maxPooledBytes {
		s.ends = nil
	}
	if 4*cap(s.decEnds) > maxPooledBytes {
		s.decEnds = nil
	}
	if 4*cap(s.ldecEnds) > maxPooledBytes {
		s.ldecEnds = nil
	}
}

// hasNegative reports whether any id is negative: for a varint door, an id
// over MaxInt32 seen as an int32. It ORs the ids, a branch-free pass.
func hasNegative(ids []int32) bool {
	var or int32
	for _, v := range ids {
		or |= v
	}
	return or < 0
}

// appendVarintChunkEnds appends to ends the offset just past every
// Chunk-th varint of run, counting seen varints before offset i. It steps
// eight bytes at a time, counting their final bytes at once, and looks at
// single bytes only in the words where a chunk ends: a byte at a time this
// was nearly half the cost of decoding a run the memo lacked.
func appendVarintChunkEnds(ends []uint32, run []byte, i, seen int) []uint32 {
	next := (seen/Chunk + 1) * Chunk // the count at which the next chunk ends
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
					next += Chunk
				}
			}
		}
		if i >= len(run) {
			return ends
		}
	}
}
