package events

import (
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/rs/zerolog"
)

// GroupSink is the part of an index table that takes a hybrid model's
// KV-cache groups (docs/hybrid.md). *index.Table satisfies it. An engine
// sink without it indexes group 0 only and rejects other groups (group),
// as before hybrid events.
type GroupSink interface {
	StoreGroup(id index.OwnerID, tier index.Tier, g int, key uint64)
	RemoveGroup(id index.OwnerID, tier index.Tier, g int, key uint64)
	NoteGroup(id index.OwnerID, g int, spec index.GroupSpec) index.GroupNote
}

// groupKindEvents counts applied BlockStored events that carried a kind,
// by the kind's rule family, for conductor_events_group_kind_total.
// Process-wide like that counter, which carries no source label: every
// decoder of the process adds to the same series.
var groupKindEvents [index.NumGroupKinds]atomic.Uint64

// GroupKindEvents returns the counts of applied BlockStored events by
// KV-cache group kind (index.GroupKind), since start-up.
func GroupKindEvents() (out [index.NumGroupKinds]uint64) {
	for i := range out {
		out[i] = groupKindEvents[i].Load()
	}
	return out
}

// groupState is the decoder's memory of the owner's layout: the last spec
// each group was applied with, so the table's layout (under its
// registration lock) is consulted only when a group's spec changes, and
// whether a conflict has been logged (once per service).
type groupState struct {
	log    zerolog.Logger
	known  [index.MaxGroups]index.GroupSpec
	seen   uint32
	logged bool
}

// applyGrouped applies a grouped stored or removed event.
func (d *engineDecoder) applyGrouped(ev *engineEvent) {
	g := int(ev.group)
	gs, ok := d.sink.(GroupSink)
	keys := d.keys[ev.off : ev.off+ev.n]
	if !ok {
		if g != 0 {
			ev.result, ev.reason = Rejected, EvGroup
			return
		}
		for _, k := range keys {
			if ev.kind == evStored {
				d.sink.Store(d.owner, ev.tier, k)
			} else {
				d.sink.Remove(d.owner, ev.tier, k)
			}
		}
		if ev.kind == evStored {
			d.checkGroup(ev)
		}
		return
	}
	if ev.kind == evRemoved {
		if g >= index.MaxGroups {
			ev.result, ev.reason = Rejected, EvGroup
			return
		}
		for _, k := range keys {
			gs.RemoveGroup(d.owner, ev.tier, g, k)
		}
		return
	}
	st := &d.groups
	if g >= index.MaxGroups || st.seen&(1<<g) == 0 || st.known[g] != ev.spec {
		switch gs.NoteGroup(d.owner, g, ev.spec) {
		case index.GroupTooMany:
			ev.result, ev.reason = Rejected, EvGroup
			return
		case index.GroupConflict:
			ev.result, ev.reason = Rejected, EvLayout
			if !st.logged {
				st.logged = true
				st.log.Warn().Int("group", g).Str("kind", ev.spec.Kind.String()).Int("block_size", ev.spec.BlockSize).
					Int("sliding_window", ev.spec.SlidingWindow).
					Msg("KV-cache group event disagrees with the owner's layout; such events are rejected (layout_conflict), logged once")
			}
			return
		}
		st.seen |= 1 << g
		st.known[g] = ev.spec
	}
	groupKindEvents[ev.spec.Kind].Add(1)
	for _, k := range keys {
		if g == 0 {
			d.sink.Store(d.owner, ev.tier, k) // group 0 is the dense path
		} else {
			gs.StoreGroup(d.owner, ev.tier, g, k)
		}
	}
	d.checkGroup(ev)
}

// checkGroup samples a grouped stored event for the hash check.
func (d *engineDecoder) checkGroup(ev *engineEvent) {
	// The check hashes blocks of the hash block size; a larger group
	// block's hash chains over several of them, and the sparse kinds'
	// token spans need not line up with their hashes
	// (docs/hybrid.md#hash-check).
	if k := ev.spec.Kind; d.check != nil && int64(ev.bs) == d.blockSize && k != index.KindSliding && k != index.KindMamba {
		if n := d.check.Sample(int(ev.n)); n > 0 {
			d.checkStored(ev, n)
		}
	}
}
