package events

import (
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/rs/zerolog"
)

// GroupSink is the part of an index table that keeps a hybrid model's
// KV-cache group layout (docs/hybrid.md); the groups' blocks go through
// EngineSink with index.Put.Group. *index.Table satisfies it. An engine
// sink without it indexes group 0 only and rejects other groups (group),
// as before hybrid events.
type GroupSink interface {
	NoteGroup(id index.OwnerID, g int, spec index.GroupSpec) index.GroupNote
}

// groupState is the decoder's memory of the owner's layout: the last spec
// each group was applied with, so the table's layout (under its
// registration lock) is consulted only when a group's spec changes, and
// whether a conflict has been logged (once per service).
type groupState struct {
	log    zerolog.Logger
	stats  *Stats // counts applied events by group kind
	known  [index.MaxGroups]index.GroupSpec
	seen   uint32
	logged bool
	// ignore is, per group, why its last stored event was not indexed
	// (ReasonNone: it was), so that its removals, which carry no kind,
	// are ignored alike; unknownLogged says the warning about a kind this
	// build does not know is out (once per service).
	ignore        [index.MaxGroups]Reason
	unknownLogged bool
	// otherGCD is the gcd of the block sizes stored in groups other than
	// 0 (0: none yet): vLLM hashes at the gcd of its groups' block sizes,
	// so group 0 above the registered block size is a hybrid's only when
	// the gcd with it is the registered one (group0Hashable).
	otherGCD int64
	// layoutAsked: the table's layout was consulted for otherGCD.
	layoutAsked bool
}

func gcd64(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// group0Hashable reports whether a group-0 event of block size bs, above
// the registered block size, belongs to a hybrid hashed at the registered
// block size: another group (known, in this batch, or in the table's
// learned or declared layout) makes the gcd the registered one. A dense
// model registered with a block size below the engine's publishes exactly
// such events with no other group; they are rejected as block_size, as
// they always were, rather than indexed under keys no query computes.
func (d *engineDecoder) group0Hashable(bs int64) bool {
	st := &d.groups
	if gcd64(bs, st.otherGCD) == d.blockSize {
		return true
	}
	g := st.otherGCD
	for i := range d.events {
		if e := &d.events[i]; e.kind == evStored && e.result == Applied && e.grouped && e.group != 0 {
			g = gcd64(g, int64(e.spec.BlockSize))
		}
	}
	if gcd64(bs, g) == d.blockSize {
		return true
	}
	if lo, ok := d.sink.(interface {
		LayoutOf(index.OwnerID) index.Layout
	}); ok && !st.layoutAsked {
		st.layoutAsked = true // one lock for a decoder that never sees another group
		for i, gs := range lo.LayoutOf(d.owner).Groups {
			if i != 0 && gs.Kind != index.KindUnreported && gs.BlockSize > 0 {
				st.otherGCD = gcd64(st.otherGCD, int64(gs.BlockSize))
			}
		}
		return gcd64(bs, gcd64(g, st.otherGCD)) == d.blockSize
	}
	return false
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
		if ev.kind == evStored && int64(ev.spec.BlockSize) != d.blockSize && !d.group0Hashable(int64(ev.spec.BlockSize)) {
			ev.result, ev.reason = Rejected, EvBlockSize
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
				d.sink.Store(d.owner, index.Put{Key: k, Tier: ev.tier})
			} else {
				d.sink.Remove(d.owner, index.Put{Key: k, Tier: ev.tier})
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
			d.sink.Remove(d.owner, index.Put{Key: k, Tier: ev.tier, Group: g})
		}
		return
	}
	st := &d.groups
	if g == 0 && int64(ev.spec.BlockSize) != d.blockSize && !d.group0Hashable(int64(ev.spec.BlockSize)) {
		ev.result, ev.reason = Rejected, EvBlockSize
		return
	}
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
	if g != 0 {
		// a group not indexed still tells the engine's hash block size
		st.otherGCD = gcd64(st.otherGCD, int64(ev.spec.BlockSize))
	}
	if st.ignore[g] = ev.ignore; ev.ignore != ReasonNone {
		// the layout has the group (an uncached one is skipped by the
		// rules, an unknown one holds nothing), its blocks are not kept
		ev.result, ev.reason = Ignored, ev.ignore
		return
	}
	st.stats.addGroupKind(ev.spec.Kind)
	for _, k := range keys {
		d.sink.Store(d.owner, index.Put{Key: k, Tier: ev.tier, Group: g})
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
