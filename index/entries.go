package index

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The entries format of a cut (TableCut.Entries): how engine owners'
// blocks are written down for a snapshot, read back, split per owner and
// restored.

// encodeBlocks appends a stripe's engine entries of owners registered at the
// cut (view) to buf, in the encoding TableCut.Entries documents; blocks and
// ext are the stripe's slab and overflow lists, or a copy of them.
func encodeBlocks(buf []byte, slab []block, ext [][]pair, groups [][]uint32, view *ownerView) (_ []byte, blocks, pairs int) {
	var held []uint64
	n := 0 // holders in held, which also has their group words
	add := func(p pair) {
		if p.id() == 0 {
			return // a shared reference
		}
		if pos := view.position(p.id()); pos >= 0 {
			n++
			h := uint64(pos)<<maskBits | uint64(p.mask()&engineBit)
			if w := cutWord(groups, p); w != 0 {
				held = append(held, h|bitShare, uint64(w))
				return
			}
			held = append(held, h)
		}
	}
	for i := range slab {
		b := &slab[i]
		if b.first.own == 0 {
			continue // free slab entry
		}
		held, n = held[:0], 0
		add(b.first)
		if b.ext != 0 {
			for _, p := range ext[b.ext-1] {
				add(p)
			}
		}
		if len(held) == 0 {
			continue
		}
		buf = binary.LittleEndian.AppendUint64(buf, b.key)
		buf = binary.AppendUvarint(buf, uint64(n))
		for _, h := range held {
			buf = binary.AppendUvarint(buf, h)
		}
		blocks++
		pairs += n
	}
	return buf, blocks, pairs
}

// EntryHolder is one owner of an encoded block.
type EntryHolder struct {
	Owner int
	Tiers TierMask
	// Groups is the holder's group word (groups.go), 0 for group 0 alone.
	Groups uint32
}

// ErrBadEntries reports entries that do not decode.
var ErrBadEntries = errors.New("malformed index entries")

// WalkEntries decodes entries encoded as TableCut.Entries describes,
// checking every owner position against owners, and calls visit per block
// with its key and holders (visit may be nil: a validation pass). It returns the blocks and pairs
// seen, or an error wrapping ErrBadEntries; visit has then been called for
// the blocks before the bad one, so callers validate before applying.
func WalkEntries(entries []byte, owners int, visit func(key uint64, holders []EntryHolder)) (blocks, pairs int, err error) {
	var holders []EntryHolder
	for p := 0; p < len(entries); {
		if len(entries)-p < 8 {
			return blocks, pairs, fmt.Errorf("%w: block %d: key cut short", ErrBadEntries, blocks)
		}
		key := binary.LittleEndian.Uint64(entries[p:])
		p += 8
		n, w := binary.Uvarint(entries[p:])
		if w <= 0 || n == 0 || n > uint64(owners) {
			return blocks, pairs, fmt.Errorf("%w: block %d: bad holder count", ErrBadEntries, blocks)
		}
		p += w
		holders = holders[:0]
		for range n {
			h, w := binary.Uvarint(entries[p:])
			if w <= 0 {
				return blocks, pairs, fmt.Errorf("%w: block %d: holder cut short", ErrBadEntries, blocks)
			}
			p += w
			pos, mask := h>>maskBits, TierMask(h&tierBits)
			var word uint32
			if mask&(1<<CPUShare) != 0 { // a group word follows
				mask &^= 1 << CPUShare
				gw, w := binary.Uvarint(entries[p:])
				if w <= 0 || gw == 0 || gw > 1<<(3*groupBits)-1 || tierWordMask(uint8(mask))&uint32(gw) != uint32(gw) || !wordCovers(uint32(gw), uint8(mask)) {
					return blocks, pairs, fmt.Errorf("%w: block %d: bad group word", ErrBadEntries, blocks)
				}
				p += w
				word = uint32(gw)
			}
			if pos >= uint64(owners) || mask == 0 || mask&^AllEngineTiers != 0 {
				return blocks, pairs, fmt.Errorf("%w: block %d: bad holder (owner %d of %d, tiers %#x)", ErrBadEntries, blocks, pos, owners, mask)
			}
			holders = append(holders, EntryHolder{Owner: int(pos), Tiers: mask, Groups: word})
		}
		if visit != nil {
			visit(key, holders)
		}
		blocks++
		pairs += int(n)
	}
	return blocks, pairs, nil
}

// SplitEntries splits entries by owner: out[i] holds the blocks owner
// position i holds, each naming it as position 0, so an owner that
// registers later restores its own with Restore(out[i], []OwnerID{id})
// while the others' wait. It fails as WalkEntries does.
func SplitEntries(entries []byte, owners int) (out [][]byte, err error) {
	out = make([][]byte, owners)
	_, _, err = WalkEntries(entries, owners, func(key uint64, hs []EntryHolder) {
		for _, h := range hs {
			b := binary.LittleEndian.AppendUint64(out[h.Owner], key)
			b = binary.AppendUvarint(b, 1)
			if h.Groups != 0 {
				b = binary.AppendUvarint(b, uint64(h.Tiers)|bitShare)
				b = binary.AppendUvarint(b, uint64(h.Groups))
			} else {
				b = binary.AppendUvarint(b, uint64(h.Tiers))
			}
			out[h.Owner] = b
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Restore stores decoded entries into the table: owners maps an entry's
// owner position to this table's id, 0 dropping that owner's entries (a
// source that resumes cold). Validate the entries with WalkEntries first:
// Restore stops at the first malformed block.
func (t *Table) Restore(entries []byte, owners []OwnerID) error {
	keys := make([][]uint64, len(owners))
	tiers := make([][]TierMask, len(owners))
	words := make([][]uint32, len(owners))
	_, _, err := WalkEntries(entries, len(owners), func(key uint64, hs []EntryHolder) {
		for _, h := range hs {
			if owners[h.Owner] != 0 {
				keys[h.Owner] = append(keys[h.Owner], key)
				tiers[h.Owner] = append(tiers[h.Owner], h.Tiers)
				words[h.Owner] = append(words[h.Owner], h.Groups)
			}
		}
	})
	for i, id := range owners {
		t.storeBatch(id, keys[i], tiers[i], words[i])
	}
	return err
}
