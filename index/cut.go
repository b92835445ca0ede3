package index

import (
	"slices"
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
	// IsScope marks a producer-fed scope, named by Scope (Context is
	// then unset).
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
// of that one stripe, BenchmarkCutPauses), which spares copying the whole
// index for every snapshot.
func (c *Cut) Finish() []TableCut {
	if c.done {
		panic("index: Cut.Finish called twice")
	}
	c.done = true
	out := make([]TableCut, 0, len(c.tables))
	for _, tc := range c.tables {
		t := tc.t
		r := TableCut{Context: t.ctx}
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
