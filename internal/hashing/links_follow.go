package hashing

// Following a query's chain along verified runs.

// Followed is what Follow found: the index keys and block hints of the
// blocks it took, in order, the prefix id of the last one, and where they
// lie, for their digests (Digest).
type Followed struct {
	Keys  []uint64
	Hints []uint32
	ID    LinkID
	runs  []followedRun
}

// followedRun is n consecutive blocks Follow took from one chunk, from
// offset off on.
type followedRun struct {
	ch     *runChunk
	off, n int
}

// Digest is the digest of block i of those f holds: the links' own, which
// is never written again once filed.
func (f *Followed) Digest(i int) *[32]byte {
	for _, r := range f.runs {
		if i < r.n {
			return &r.ch.digs[r.off+i]
		}
		i -= r.n
	}
	return nil
}

// Reset empties f, dropping its references to the links' memory.
func (f *Followed) Reset() {
	clear(f.runs)
	f.Keys, f.Hints, f.runs = f.Keys[:0], f.Hints[:0], f.runs[:0]
}

// take appends blocks [from, to) of ch.
func (f *Followed) take(ch *runChunk, from, to int) {
	if to > from {
		f.Keys = append(f.Keys, ch.keys[from:to]...)
		f.Hints = append(f.Hints, ch.hints[from:to]...)
		f.runs = append(f.runs, followedRun{ch, from, to - from})
	}
}

// Follow takes the verified links of the blocks of tokens (bs tokens each,
// whole blocks only) that extend the chain prefix whose id is prefix,
// stopping at the first block without one. Where a run starts it computes
// the block's prefix id and looks it up; inside a run it compares the
// block's tokens' id with the next entry's (runChunk). It appends to f
// the keys (a vLLM digest's low 64 bits, big-endian), hints and digests
// of the blocks taken and sets f.ID to the last one's prefix id
// (unchanged when none). This is a query's use of Links: it computes
// nothing past the last link and copies no digest; buf is scratch,
// returned grown.
func (s LinkScope) Follow(prefix LinkID, tokens []int32, bs int, f *Followed, buf []byte) []byte {
	l := s.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var ch *runChunk
	from, off := 0, 0 // the blocks of ch taken since the last lookup
	runs := len(f.runs)
	for b := 0; (b+1)*bs <= len(tokens); b++ {
		block := tokens[b*bs : (b+1)*bs]
		if ch != nil && off < ch.n && ch.child[off] && ch.toks[off] == s.TokensID(block) {
			// The run goes on: block off's parent is the block
			// just taken, and its tokens are the query's.
			off++
			continue
		}
		// The start of a run: look the block up.
		if ch != nil {
			f.take(ch, from, off)
			prefix = ch.ids[off-1]
		}
		id, nbuf := s.Next(prefix, block, buf)
		buf = nbuf
		var ok bool
		if ch, off, _, ok = l.find(id); !ok {
			ch = nil
			break
		}
		from, off = off, off+1
	}
	if ch != nil {
		f.take(ch, from, off)
		prefix = ch.ids[off-1]
	}
	if len(f.runs) > runs {
		f.ID = prefix
	}
	return buf
}
