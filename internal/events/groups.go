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
	// ignore is, per group, why its last stored event was not indexed
	// (ReasonNone: it was), so that its removals, which carry no kind,
	// are ignored alike; unknownLogged says the warning about a kind this
	// build does not know is out (once per service).
	ignore        [index.MaxGroups]Reason
	unknownLogged bool
}

// maxLoggedKind bounds the length of a kind name a log line repeats.
const maxLoggedKind = 64

// noteUnknownKind warns, once per service, about a group whose kind this
// build has no rule for: its events are ignored and, since the engine may
// well prefix-cache it, the group counts as holding nothing, so the
// owner answers 0 (docs/hybrid.md#the-layout-learned-or-declared).
func (st *groupState) noteUnknownKind(g int, kind []byte) {
	if st.unknownLogged {
		return
	}
	st.unknownLogged = true
	st.log.Warn().Int("group", g).Str("kind", string(kind[:min(len(kind), maxLoggedKind)])).
		Msg("KV-cache group of a kind this build has no hit rule for: its events are ignored (unknown_kind) and the owner answers 0 while its layout has the group; logged once")
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
		why := ev.ignore
		if ev.kind == evStored {
			d.groups.ignore[0] = why
		} else {
			why = max(why, d.groups.ignore[0])
		}
		if why != ReasonNone {
			ev.result, ev.reason = Ignored, why
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
		if why := max(ev.ignore, d.groups.ignore[g]); why != ReasonNone {
			ev.result, ev.reason = Ignored, why
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
	if st.ignore[g] = ev.ignore; ev.ignore != ReasonNone {
		// the layout has the group (an uncached one is skipped by the
		// rules, an unknown one holds nothing), its blocks are not kept
		ev.result, ev.reason = Ignored, ev.ignore
		return
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
