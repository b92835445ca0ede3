package hashing

import (
	"unsafe"
)

// Generations: the runs of verified blocks in chunks, and the tables that
// file them, one generation at a time (docs/architecture.md#verified-links).

// runChunk holds runs: ids[i], digs[i], keys[i], toks[i], hints[i] and
// child[i] are one block's. A run never crosses chunks, so a walk along
// one stays inside its arrays. keys[i] is the digest's index key (a query
// reads it without the digest's line). hints[i] is where the index held
// the block when ingest stored it (what index.Table.Store
// returned, 0 for unknown): a query hands it to the index walk, which
// checks it before probing (index/locate.go).
//
// toks[i] is the id of block i's tokens alone (TokensID) and child[i] says
// that block i-1 of the chunk is its parent: a query that matched block
// i-1 takes block i on comparing its own tokens' id, cheaper than the
// prefix id it would otherwise compute (ids[i] is then its prefix id).
type runChunk struct {
	ids   [chunkBlocks]LinkID
	digs  [chunkBlocks][32]byte
	keys  [chunkBlocks]uint64 // the digests' index keys, which a query reads
	toks  [chunkBlocks]uint64
	hints [chunkBlocks]uint32
	child [chunkBlocks]bool
	n     int
	pos   int // its index in its generation's chunks
}

const chunkBlocks = 1024

// runPos is where a block lies: chunk index << 16 | offset.
type runPos uint32

// linkGen is one generation: runs, the id index and the key index.
type linkGen struct {
	chunks []*runChunk
	// index files blocks by their id's high half; a hit is confirmed
	// against the whole id kept in the run, so two ids sharing a half
	// (probability 2^-64) only cost a miss. back files them by the key
	// engines publish.
	index, back posTable
	// maxSlots is the size the tables end at: the generation's budget
	// holds that many slots in each table and the chunks of the 3/4 of
	// it they file (newGen).
	maxSlots int
}

// newGen returns an empty generation for budget bytes.
func newGen(budget int) *linkGen {
	perBlock := float64(unsafe.Sizeof(runChunk{}))/chunkBlocks + 2*float64(posSlotBytes)*4/3
	return &linkGen{maxSlots: max(minSlots, int(float64(budget)/perBlock*4/3))}
}

// bytes is the memory g holds: its chunks and both tables' slots.
func (g *linkGen) bytes() int {
	return len(g.chunks)*int(unsafe.Sizeof(runChunk{})) +
		(len(g.index.slots)+len(g.back.slots)+len(g.index.next)+len(g.back.next))*posSlotBytes
}

// find returns where block id lies in g, if it is there.
func (g *linkGen) find(id LinkID) (*runChunk, int, bool) {
	p, ok := g.index.get(id.Hi)
	if !ok {
		return nil, 0, false
	}
	ch, off := g.at(p)
	return ch, off, ch.ids[off] == id
}

func (g *linkGen) at(p runPos) (*runChunk, int) {
	return g.chunks[p>>16], int(p & 0xffff)
}

// prepareGrowth is the first half of taking a table's growth out of the
// lock. A table that grows takes fresh memory, and its first touch of
// each page is a page fault: done under the lock, other sources' ingest
// and every query would wait for it. So once a large table of the
// current generation is 5/8 full (with adding more blocks to come), one
// Record allocates and faults in the next slots before it takes the
// lock (prepareGrowth), and parks them in next under it (adoptSpare),
// where grow finds them at 3/4. prepared says this caller holds the
// preparing flag, to clear once it has adopted what it made.
func (l *Links) prepareGrowth(adding int) (spare [2][]posSlot, prepared bool) {
	var want [2]int
	l.mu.RLock()
	if g := l.cur; g != nil {
		for i, t := range [2]*posTable{&g.index, &g.back} {
			if n := t.nextLen(g.maxSlots); len(t.slots) >= 1<<14 && t.next == nil && t.noNext != len(t.slots) &&
				(t.n+adding)*8 > len(t.slots)*5 && g.bytes()+n*posSlotBytes <= l.maxBytes/2 {
				want[i] = n
			}
		}
	}
	l.mu.RUnlock()
	if want == [2]int{} || !l.preparing.CompareAndSwap(false, true) {
		return spare, false
	}
	for i, n := range want {
		if n > 0 {
			spare[i] = faultIn(make([]posSlot, n))
		}
	}
	return spare, true
}

// adoptSpare parks prepareGrowth's slots in the tables they were made
// for, under the lock, where they still fit: the table has not grown
// meanwhile and g stays within its budget (past it, the generation gives
// way before the table would grow).
func (g *linkGen) adoptSpare(spare [2][]posSlot, budget int) {
	for i, t := range [2]*posTable{&g.index, &g.back} {
		if spare[i] == nil {
			continue
		}
		if t.next == nil && len(spare[i]) == t.nextLen(g.maxSlots) && g.bytes()+len(spare[i])*posSlotBytes <= budget {
			t.next = spare[i]
		} else {
			t.noNext = len(t.slots) // not again at this size
		}
	}
}

// touch loads the home slots of the ids and keys about to be filed.
func (g *linkGen) touch(ids []LinkID, keys []uint64) uint32 {
	var acc uint32
	if g.index.n > 0 {
		for _, id := range ids {
			acc ^= g.index.slots[g.index.home(id.Hi)].pos
		}
	}
	if g.back.n > 0 {
		for _, k := range keys {
			acc ^= g.back.slots[g.back.home(k)].pos
		}
	}
	return acc
}

// growth is how many bytes g grows by if one more block is filed: a new
// chunk when newChunk, and any table that grows.
func (g *linkGen) growth(newChunk bool) int {
	b := 0
	if newChunk {
		b += int(unsafe.Sizeof(runChunk{}))
	}
	for _, t := range [2]*posTable{&g.index, &g.back} {
		if (t.n+1)*4 > len(t.slots)*3 && len(t.next) == 0 {
			b += (t.nextLen(g.maxSlots) - len(t.slots)) * posSlotBytes // next is counted already
		}
	}
	return b
}
