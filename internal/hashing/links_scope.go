package hashing

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// LinkScope: the links of one vLLM profile, and the ids a chain's blocks
// are filed under.

// LinkScope is Links for one vLLM profile: its encoding and its root
// digest. The zero LinkScope
// (from a nil Links, or a profile links do not serve) holds nothing.
type LinkScope struct {
	l    *Links
	kind kind
	root [32]byte // the profile's root digest: PYTHONHASHSEED enters it
}

// Enabled says whether the scope can hold links.
func (s LinkScope) Enabled() bool { return s.l != nil }

// Root is the prefix id of an empty chain under this scope's encoding and
// root digest, LoRA name lora and salt salt ("" for none): what every
// block id of a chain is built on. buf is scratch, returned grown.
func (s LinkScope) Root(lora, salt string, buf []byte) (LinkID, []byte) {
	buf = append(buf[:0], byte(s.kind))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(lora)))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(salt)))
	buf = append(buf, s.root[:]...)
	buf = append(append(buf, lora...), salt...)
	return xxh3.Hash128Seed(buf, s.l.seed), buf
}

// tokensSeed sets the ids of tokens alone (TokensID) apart from prefix ids.
const tokensSeed = 0x6c696e6b2d746f6b // "link-tok"

// TokensID identifies one block's tokens alone, whatever precedes them:
// xxh3-64 of their bytes under the links' seed (another one than prefix
// ids'), with no copy. Within a run (runChunk.child) it stands for the
// prefix id: the parent is the run's previous block, already matched by
// its 128-bit id or by its own tokens. 64 bits suffice there: two
// different blocks share a tokens id with probability 2^-64, the odds of
// two blocks sharing the index key a query reports them by, which every
// answer already rests on, and nobody outside the process can aim for a
// collision without the seed. It is less work than xxh3-128 on a 16-token
// block, and half the bytes a run walk reads for it.
func (s LinkScope) TokensID(tokens []int32) uint64 {
	return xxh3.HashSeed(int32Bytes(tokens), s.l.seed^tokensSeed)
}

// Next is the prefix id of the chain prefix extended by one block of
// tokens. buf is scratch, returned grown.
func (s LinkScope) Next(prefix LinkID, tokens []int32, buf []byte) (LinkID, []byte) {
	buf = binary.LittleEndian.AppendUint64(buf[:0], prefix.Lo)
	buf = binary.LittleEndian.AppendUint64(buf, prefix.Hi)
	buf = append(buf, int32Bytes(tokens)...)
	return xxh3.Hash128Seed(buf, s.l.seed), buf
}

// Resolve appends to out the verified digests of the blocks ids name, in
// order, up to the first one not held, and reports whether every one
// appended is in the current generation (ingest refreshes them
// otherwise). It is ingest's lookup of what it verified before; a query
// follows runs by tokens instead (Follow).
func (s LinkScope) Resolve(ids []LinkID, out [][32]byte) ([][32]byte, bool) {
	l := s.l
	fresh := true
	l.mu.RLock()
	defer l.mu.RUnlock()
	var ch *runChunk
	off := 0
	for _, id := range ids {
		if ch != nil && off < ch.n && ch.ids[off] == id {
			out = append(out, ch.digs[off]) // the run goes on
			off++
			continue
		}
		// The start of a run: look the block up.
		var ok, old bool
		ch, off, old, ok = l.find(id)
		fresh = fresh && !old
		if !ok {
			break
		}
		out = append(out, ch.digs[off])
		off++
	}
	return out, fresh
}

// ByKey returns the prefix id and digest of a verified block from the key
// an engine names it by (as a parent), if it is still held.
func (s LinkScope) ByKey(key uint64) (LinkID, [32]byte, bool) {
	l := s.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, g := range [2]*linkGen{l.cur, l.prev} {
		if g == nil {
			continue
		}
		if p, ok := g.back.get(key); ok {
			ch, off := g.at(p)
			return ch.ids[off], ch.digs[off], true
		}
	}
	return LinkID{}, [32]byte{}, false
}
