package index

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// A Cut is a copy of the engine owners' entries as they were at one moment,
// taken without stopping queries or ingestion for longer than it takes to
// copy one stripe.
//
// BeginCut marks the moment; it must be called while nothing writes to the
// index (the service pauses its event sources around it, for microseconds).
// From then on the first writer to touch a stripe copies it before changing
// it (copy on write: a memory copy of the stripe's slab under the lock the
// writer holds anyway), and Finish encodes every stripe no writer touched
// in place under its read lock, so queries keep running. Either way each stripe is copied in its
// state at the moment of the cut, which is what makes a per-source sequence
// number recorded at that moment describe the copy exactly.
//
// Only engine owners registered at the cut are copied. Shared (Mooncake)
// references are not: they are rebuilt from the Mooncake sources' object
// bindings, which the caller records at the same moment.
type Cut struct {
	ix     *Index
	epoch  uint64
	tables []*tableCut
	done   bool
}

// tableCut is one table's part of a cut.
type tableCut struct {
	epoch uint64
	t     *Table
	view  *ownerView
	out   []stripeCut // by stripe position
}

// stripeCut is one stripe's state at the cut when a writer changed it
// first: a raw copy of its slab and overflow lists, taken under the
// writer's lock (a memory copy, so the writer is held up briefly), and
// encoded by Finish under no lock.
type stripeCut struct {
	blocks []block
	ext    [][]pair   // by ext handle - 1, deep-copied
	groups [][]uint32 // by slot, deep-copied (groups.go)
}

// Owner is an engine owner as a cut lists it.
type Owner struct {
	Instance string
	Rank     int
}

// TableCut is one context's (or producer-fed scope's) entries at the cut.
type TableCut struct {
	Context ContextKey
	Profile hashing.Profile
	// IsScope marks a producer-fed scope, named by Scope (Context and
	// Profile are then unset).
	IsScope bool
	Scope   ScopeKey
	// Owners are the engine owners registered at the cut, sorted by
	// (instance, rank); entries refer to them by position.
	Owners []Owner
	// Entries encodes, block after block, the key (8 bytes, little
	// endian), the number n of owners holding it (uvarint), then per
	// owner uvarint(position<<4 | tier mask), the mask's bits being
	// Device, CPULocal, CPUShare and Disk from the lowest. Blocks held by
	// no listed owner are absent.
	Entries []byte
	// A holder whose KV-cache groups are other than group 0 alone
	// (groups.go) has the CPUShare bit set in its mask, which no engine
	// tier uses, and its group word follows as another uvarint.
	// Blocks and Pairs count the encoded blocks and (block, owner) pairs.
	Blocks, Pairs int
	// Layouts are the owners' layouts by position, for owners with a
	// hybrid one (nil when every owner is dense).
	Layouts []Layout
}

// BeginCut marks the moment a cut describes. The caller must keep every
// writer of the index (event sources, registrations) paused during the call,
// and must call Finish. Cuts do not overlap: BeginCut waits for the
// previous cut's Finish.
func (ix *Index) BeginCut() *Cut {
	ix.cutMu.Lock()
	ix.cutEpoch++
	c := &Cut{ix: ix, epoch: ix.cutEpoch}
	// Producer-fed scopes are tables like the contexts and are cut the
	// same way, after them.
	for _, t := range append(ix.Tables(), ix.Scopes()...) {
		tc := &tableCut{epoch: c.epoch, t: t, view: t.view.Load(), out: make([]stripeCut, len(t.stripes))}
		t.cut.Store(tc)
		c.tables = append(c.tables, tc)
	}
	return c
}

// Finish encodes every stripe as it was at the cut and ends the cut,
// returning each table's entries: the contexts in Tables order, then the
// producer-fed scopes in Scopes order. A stripe a writer has
// copied is encoded from that copy, under no lock; any other is encoded in
// place under its read lock (queries go on; a writer waits for the encoding
// of that one stripe, about a millisecond at 2 M entries over 64 stripes),
// which spares copying the whole index for every snapshot.
func (c *Cut) Finish() []TableCut {
	if c.done {
		panic("index: Cut.Finish called twice")
	}
	c.done = true
	out := make([]TableCut, 0, len(c.tables))
	for _, tc := range c.tables {
		t := tc.t
		r := TableCut{Context: t.ctx, Profile: t.profile}
		if t.scope {
			r = TableCut{IsScope: true, Scope: t.ScopeKey()}
		}
		r.Owners = make([]Owner, len(tc.view.owners))
		for i, o := range tc.view.owners {
			r.Owners[i] = Owner{Instance: o.instance, Rank: o.rank}
		}
		r.Layouts = cutLayouts(tc.view)
		for i := range t.stripes {
			s := &t.stripes[i]
			var blocks, pairs int
			s.mu.RLock()
			// Writers capture under the write lock, so under the read
			// lock only this goroutine can: no two captures race.
			if s.cutEpoch != tc.epoch {
				s.cutEpoch = tc.epoch
				if !s.dead {
					r.Entries, blocks, pairs = encodeBlocks(r.Entries, s.blocks, s.ext, s.groups, tc.view)
				}
				s.mu.RUnlock()
			} else {
				s.mu.RUnlock()
				sc := &tc.out[i]
				r.Entries, blocks, pairs = encodeBlocks(r.Entries, sc.blocks, sc.ext, sc.groups, tc.view)
				*sc = stripeCut{}
			}
			r.Blocks += blocks
			r.Pairs += pairs
		}
		t.cut.CompareAndSwap(tc, nil)
		out = append(out, r)
	}
	c.ix.cutMu.Unlock()
	return out
}

// cow copies s for a cut in progress before its first change after the
// cut. Writers call it with s write-locked.
func (t *Table) cow(s *stripe) {
	if tc := t.cut.Load(); tc != nil && s.cutEpoch != tc.epoch {
		tc.capture(s)
	}
}

// capture copies s's slab and overflow lists as they are, for a writer
// about to change s (which holds its write lock).
func (tc *tableCut) capture(s *stripe) {
	s.cutEpoch = tc.epoch
	sc := &tc.out[s.pos]
	if s.dead {
		return
	}
	sc.blocks = slices.Clone(s.blocks)
	n := 0
	for _, e := range s.ext {
		n += len(e)
	}
	flat := make([]pair, 0, n)
	sc.ext = make([][]pair, len(s.ext))
	for i, e := range s.ext {
		if len(e) > 0 {
			at := len(flat)
			flat = append(flat, e...)
			sc.ext[i] = flat[at:len(flat):len(flat)]
		}
	}
	sc.groups = cloneGroups(s.groups)
}

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

// EntryVisitor receives one decoded entry: a block key and, per holder, the
// owner's position and its tier mask.
type EntryVisitor func(key uint64, holders []EntryHolder)

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
// (visit may be nil: a validation pass). It returns the blocks and pairs
// seen, or an error wrapping ErrBadEntries; visit has then been called for
// the blocks before the bad one, so callers validate before applying.
func WalkEntries(entries []byte, owners int, visit EntryVisitor) (blocks, pairs int, err error) {
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
		t.StoreBatchGroups(id, keys[i], tiers[i], words[i])
	}
	return err
}

// StoreBatch records that engine owner id holds each keys[i] in the engine
// tiers of tiers[i], as Store would for each tier, but takes each stripe's
// lock once for all its keys: restoring a snapshot's millions of entries
// then costs a hash-table insert per entry, not a lock round trip per tier.
func (t *Table) StoreBatch(id OwnerID, keys []uint64, tiers []TierMask) {
	t.StoreBatchGroups(id, keys, tiers, nil)
}

// StoreBatchGroups is StoreBatch with each entry's group word (words[i],
// 0 for group 0 alone; words nil for none), as a snapshot records them.
func (t *Table) StoreBatchGroups(id OwnerID, keys []uint64, tiers []TierMask, words []uint32) {
	if len(keys) == 0 {
		return
	}
	// Bucket the entries by stripe (a counting sort).
	n := len(t.stripes)
	start := make([]int, n+1)
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = mix(k)
		start[t.stripeIndex(hs[i])+1]++
	}
	for i := 1; i <= n; i++ {
		start[i] += start[i-1]
	}
	order := make([]int32, len(keys))
	fill := slices.Clone(start[:n])
	for i := range keys {
		si := t.stripeIndex(hs[i])
		order[fill[si]] = int32(i)
		fill[si]++
	}
	for si := range n {
		if start[si] == start[si+1] {
			continue
		}
		t.admit()
		s := &t.stripes[si]
		s.mu.Lock()
		if s.dead || !t.registered(id) {
			s.mu.Unlock()
			return
		}
		t.changing(s)
		// Size the stripe for the whole batch once, instead of growing
		// it step by step through every resize on the way.
		if want := s.nlive + start[si+1] - start[si]; (want+s.tombs)*5 > len(s.slots)*4 {
			s.resize(want)
			s.blocks = slices.Grow(s.blocks, max(0, want-len(s.blocks)))
			s.publishBlocks()
		}
		for _, i := range order[start[si]:start[si+1]] {
			m := uint32(tiers[i]) & engineBit
			if m == 0 {
				continue
			}
			idx := s.findOrInsert(keys[i], hs[i])
			b := &s.blocks[idx]
			var before uint8
			var pos uint32
			if k := s.findEngine(b, id); k != noPair {
				p := s.pairAt(b, k)
				before, pos = p.mask(), p.aux
				if p.own&m != m {
					p.own |= m
					s.reintern(b)
				}
			} else {
				pos = s.ownerAppend(id, idx)
				s.addPair(b, pair{own: uint32(id)<<maskBits | m, aux: pos})
			}
			if words != nil && words[i] != 0 {
				s.groupsRestored(id.slot(), pos, before, uint8(m), words[i])
			} else if s.groups != nil {
				s.groupsRestored(id.slot(), pos, before, uint8(m), explicitWord(0, uint8(m)))
			}
			s.setMask(b, b.mask()|uint8(m))
		}
		s.mu.Unlock()
	}
}
