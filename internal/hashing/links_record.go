package hashing

import (
	"encoding/binary"
)

// Recording the blocks ingest verified.

// LinkWriter is one ingest stream's place in the links: the chunk its
// blocks go on in. Engines publish a prompt's blocks in order, event after
// event, and several engines' streams interleave at the subscriber; with
// a chunk of its own per stream, a prompt's events make one run, which a
// query walks with one lookup, instead of one run per event. The zero
// LinkWriter is ready; Record serialises its use.
type LinkWriter struct {
	g  *linkGen
	ch *runChunk
}

// LinkRun is consecutive verified blocks of one chain, for Record.
type LinkRun struct {
	// Parent is the prefix id the first block extends (Root's for a
	// chain's first block).
	Parent LinkID
	// IDs are the blocks' prefix ids, Keys their keys as published, Digs
	// their digests.
	IDs  []LinkID
	Keys []uint64
	Digs [][32]byte
	// Toks are the ids of the blocks' tokens (TokensID); nil when not
	// known, and a query then looks every block up instead of following.
	Toks []uint64
	// Hints are the blocks' hints in the index (what Table.Store returned); nil for
	// none.
	Hints []uint32
	// Known is how many leading blocks may be held already (Resolve
	// found them); the rest were not held a moment ago, and are filed
	// without a lookup.
	Known int
}

// Record files the blocks of r. Blocks already in the current generation
// are skipped, their hints refreshed; the others become runs there, in w's
// chunk (nil: one shared by callers without writers). A block filed right
// after its parent is marked a child, so a query follows it by its tokens'
// id (runChunk).
func (s LinkScope) Record(r *LinkRun, w *LinkWriter) {
	ids, keys, digs, hints, known := r.IDs, r.Keys, r.Digs, r.Hints, r.Known
	l := s.l
	spare, prepared := l.prepareGrowth(len(ids))
	if prepared {
		defer l.preparing.Store(false)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.cur; g != nil && prepared {
		g.adoptSpare(spare, l.maxBytes/2)
	}
	g := l.cur
	if g == nil {
		g = newGen(l.maxBytes / 2)
		l.cur = g
	}
	if w == nil {
		w = &l.anon
	}
	var ch *runChunk
	if w.g == g {
		ch = w.ch
	}
	added := 0
	defer func() {
		w.g, w.ch = l.cur, ch
		l.recorded.Add(uint64(added))
		b := l.cur.bytes()
		if l.prev != nil {
			b += l.prev.bytes()
		}
		l.bytes.Store(int64(b))
	}()
	// The new blocks' slots lie at random in tables larger than the
	// caches: load them all first, so their misses overlap instead of
	// each insert waiting for its own.
	l.sink ^= g.touch(ids[min(known, len(ids)):], keys[min(known, len(keys)):])
	for i, id := range ids {
		if i < known {
			if hc, off, ok := g.find(id); ok {
				if hints != nil && hints[i] != 0 {
					hc.hints[off] = hints[i] // the block may have moved
				}
				continue
			}
		}
		if ch != nil && ch.n == chunkBlocks {
			ch = nil
		}
		if g.bytes()+g.growth(ch == nil) > l.maxBytes/2 {
			// The current generation is full: it becomes the old
			// one, and the one before it goes.
			l.prev, g = g, newGen(l.maxBytes/2)
			l.cur, ch = g, nil
		}
		if ch == nil {
			ch = &runChunk{pos: len(g.chunks)}
			g.chunks = append(g.chunks, ch)
		}
		off := ch.n
		ch.ids[off], ch.digs[off], ch.hints[off] = id, digs[i], 0
		ch.keys[off] = binary.BigEndian.Uint64(digs[i][24:]) // vLLM's low64_be
		if hints != nil {
			ch.hints[off] = hints[i]
		}
		ch.toks[off], ch.child[off] = 0, false
		if r.Toks != nil {
			parent := r.Parent
			if i > 0 {
				parent = ids[i-1]
			}
			ch.toks[off] = r.Toks[i]
			ch.child[off] = off > 0 && ch.ids[off-1] == parent
		}
		ch.n++
		pos := runPos(ch.pos)<<16 | runPos(off)
		g.back.put(keys[i], pos, g.maxSlots)
		if g.index.put(id.Hi, pos, g.maxSlots) {
			added++
		} // else another ingest filed it meanwhile: this copy is spare
	}
}
