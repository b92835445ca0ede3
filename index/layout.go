package index

import (
	"fmt"
	"slices"
)

// GroupKind is the attention kind of a KV-cache group, reduced to what
// decides its hit rule (docs/hybrid.md#kinds).
type GroupKind uint8

const (
	// KindUnreported: the group has published nothing yet. It counts as a
	// full-attention group holding nothing, so it can only lower answers.
	KindUnreported GroupKind = iota
	// KindFull: full_attention, mla_attention, sink_full_attention.
	KindFull
	// KindSliding: sliding_window, sliding_window_mla.
	KindSliding
	// KindChunked: chunked_local_attention.
	KindChunked
	// KindMamba: mamba and the other linear-attention state kinds.
	KindMamba
	// KindUncached: cross_attention, encoder_only_attention: never
	// prefix-cached, so the engine skips the group in its lookup.
	KindUncached
	// KindOther: a kind this build has no rule for; it gets the
	// full-attention rule, which no other kind's hit is below.
	KindOther
	numKinds

	// NumGroupKinds is the number of GroupKinds, for arrays indexed by kind.
	NumGroupKinds = numKinds
)

var kindNames = [numKinds]string{"unreported", "full_attention", "sliding_window", "chunked_local_attention", "mamba", "uncached", "other"}

func (k GroupKind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("GroupKind(%d)", k)
}

// KindOf maps a vLLM kv_cache_spec_kind to its GroupKind.
func KindOf(s string) GroupKind {
	switch s {
	case "full_attention", "mla_attention", "sink_full_attention":
		return KindFull
	case "sliding_window", "sliding_window_mla":
		return KindSliding
	case "chunked_local_attention":
		return KindChunked
	case "mamba", "mamba1", "mamba2", "gated_delta_net", "linear_attention", "short_conv", "kda":
		return KindMamba
	case "cross_attention", "encoder_only_attention":
		return KindUncached
	}
	return KindOther
}

// GroupSpec is one KV-cache group of an owner's layout.
type GroupSpec struct {
	Kind GroupKind
	// BlockSize is the group's block size in tokens, a multiple of the
	// context's (hash) block size.
	BlockSize int
	// SlidingWindow is the window of a KindSliding group, in tokens.
	SlidingWindow int
	// ChunkSize is the chunk of a KindChunked group; 0 (undeclared) gives
	// the group the full-attention rule.
	ChunkSize int
}

// Layout is an owner's KV-cache groups by group index and whether they
// were declared at registration (exact from the first event) or learned
// from events.
type Layout struct {
	Groups   []GroupSpec
	Declared bool
	// Overflow: the owner announced a group index at or above MaxGroups.
	Overflow bool
}

// GroupNote is what NoteGroup made of an event's group fields.
type GroupNote uint8

const (
	// GroupAgrees: the group's spec is the one already known.
	GroupAgrees GroupNote = iota
	// GroupLearned: the layout gained or refined the group.
	GroupLearned
	// GroupConflict: the spec contradicts the declared or learned one;
	// the event must not be applied.
	GroupConflict
	// GroupTooMany: the index is MaxGroups or more.
	GroupTooMany
)

// ownerLayout is the table's record of one owner's layout, under regMu.
type ownerLayout struct {
	Layout
}

// SetLayout declares owner id's layout (the registration's
// kv_cache_groups); nil groups make the owner learn its layout from events.
func (t *Table) SetLayout(id OwnerID, groups []GroupSpec) {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	if t.slotOf(id) < 0 {
		return
	}
	if t.layouts == nil {
		t.layouts = make(map[OwnerID]*ownerLayout)
	}
	if len(groups) == 0 {
		delete(t.layouts, id)
	} else {
		t.layouts[id] = &ownerLayout{Layout{Groups: slices.Clone(groups), Declared: true}}
	}
	t.publishLocked()
}

// LayoutOf returns a copy of owner id's layout (zero when it has none).
func (t *Table) LayoutOf(id OwnerID) Layout {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	if l := t.layouts[id]; l != nil {
		return Layout{Groups: slices.Clone(l.Groups), Declared: l.Declared, Overflow: l.Overflow}
	}
	return Layout{}
}

// slotOf returns id's slot when id is a current owner, else -1; under regMu.
func (t *Table) slotOf(id OwnerID) int {
	sl := id.slot()
	if id == 0 || sl >= len(t.slots) || t.slots[sl].id != id {
		return -1
	}
	return sl
}

// NoteGroup checks an event's group g and spec against owner id's layout,
// learning what a learned layout does not know yet: a new group, or a
// larger block size (a group's first events may be partial entries of one
// hash block). Decoders call it only when the spec differs from the last
// one they saw for g, so it is off the steady-state ingest path.
func (t *Table) NoteGroup(id OwnerID, g int, spec GroupSpec) GroupNote {
	t.regMu.Lock()
	defer t.regMu.Unlock()
	if t.slotOf(id) < 0 {
		return GroupAgrees // a removed owner: its events are no-ops anyway
	}
	if t.layouts == nil {
		t.layouts = make(map[OwnerID]*ownerLayout)
	}
	l := t.layouts[id]
	if g < 0 || g >= MaxGroups {
		if l == nil {
			l = &ownerLayout{}
			t.layouts[id] = l
		}
		if !l.Overflow {
			l.Overflow = true
			t.publishLocked()
		}
		return GroupTooMany
	}
	if l == nil {
		l = &ownerLayout{}
		t.layouts[id] = l
	}
	if g < len(l.Groups) && l.Groups[g].Kind != KindUnreported {
		known := l.Groups[g]
		switch {
		case known.Kind != spec.Kind || (spec.Kind == KindSliding && known.SlidingWindow != spec.SlidingWindow):
			return GroupConflict
		case spec.BlockSize == known.BlockSize || spec.BlockSize == t.ctx.BlockSize:
			// a partial entry is one hash block (docs/hybrid.md#block-sizes)
			return GroupAgrees
		case l.Declared || spec.BlockSize < known.BlockSize || spec.BlockSize%known.BlockSize != 0:
			return GroupConflict
		}
		l.Groups[g].BlockSize = spec.BlockSize
		t.publishLocked()
		return GroupLearned
	}
	if l.Declared {
		return GroupConflict // a group the declaration does not have
	}
	for len(l.Groups) <= g {
		l.Groups = append(l.Groups, GroupSpec{})
	}
	if spec.Kind == KindChunked {
		spec.ChunkSize = 0 // not on the wire; only a declaration knows it
	}
	l.Groups[g] = spec
	t.publishLocked()
	return GroupLearned
}

// forgetLayout drops a removed owner's layout; under regMu.
func (t *Table) forgetLayout(id OwnerID) { delete(t.layouts, id) }

// layoutsFor returns the compiled layout of every owner of a snapshot
// being built, by position, or nil when every owner is dense; under regMu.
func (t *Table) layoutsFor(owners []ownerRef) []*hybridLayout {
	if len(t.layouts) == 0 {
		return nil
	}
	var out []*hybridLayout
	for i, o := range owners {
		l := t.layouts[o.id]
		if l == nil {
			continue
		}
		if c := compileLayout(&l.Layout, t.ctx.BlockSize); c != nil {
			if out == nil {
				out = make([]*hybridLayout, len(owners))
			}
			out[i] = c
		}
	}
	return out
}

// cutLayouts returns the layouts of a snapshot's owners by position, for a
// cut: only hybrid ones, nil when there are none.
func cutLayouts(v *ownerView) []Layout {
	if v.hybrid == nil {
		return nil
	}
	out := make([]Layout, len(v.owners))
	for i, h := range v.hybrid {
		if h != nil {
			out[i] = Layout{Groups: slices.Clone(h.src.Groups), Declared: h.src.Declared, Overflow: h.src.Overflow}
		}
	}
	return out
}

// RestoreLayout gives owner id the layout a snapshot recorded for it, as
// learned from events before the restart, unless its registration declared
// one (the declaration is the registration's, and a changed one does not
// resume from the snapshot at all). Answers are then the same as before the
// restart from the first query on.
func (t *Table) RestoreLayout(id OwnerID, l Layout) {
	if l.Declared || (len(l.Groups) == 0 && !l.Overflow) {
		return
	}
	t.regMu.Lock()
	defer t.regMu.Unlock()
	if t.slotOf(id) < 0 {
		return
	}
	if old := t.layouts[id]; old != nil && old.Declared {
		return
	}
	if t.layouts == nil {
		t.layouts = make(map[OwnerID]*ownerLayout)
	}
	t.layouts[id] = &ownerLayout{Layout{Groups: slices.Clone(l.Groups), Overflow: l.Overflow}}
	t.publishLocked()
}
