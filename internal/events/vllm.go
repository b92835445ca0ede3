package events

import (
	"bytes"
	"math"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// vllmRules is vLLM's KV event family (docs/events.md#vllm-events): unsigned
// or byte-string hashes, LoRA by name, attention kinds and cache groups, GPU
// medium only. Read-only: every vLLM decoder points at it.
var vllmRules = engineRules{
	typ: sourcetype.VLLM,
	fields: newFieldTable(func() []fieldSpec {
		f := engineFieldSpecs()
		f[fLoraName] = fieldSpec{"lora_name", shapeOptStr, sLoraName}
		f[fExtraKeys] = fieldSpec{"extra_keys", shapeOwn, noSlot}
		f[fGroupIdx] = fieldSpec{"group_idx", shapeOptInt, iGroupIdx}
		f[fSpecKind] = fieldSpec{"kv_cache_spec_kind", shapeOptStr, sSpecKind}
		f[fSlidingWindow] = fieldSpec{"kv_cache_spec_sliding_window", shapeOptInt, iWindow}
		return f
	}()),
	keys: [numEvKinds]keyRule{
		evStored:  {^uint32(0), vllmStoredRequired},
		evRemoved: {vllmRemovedAllowed, vllmRemovedRequired},
		evCleared: {clearedAllowed, 1 << fType},
	},
	// current vLLM never emits negative hashes
	bigHashes: true,
	binHashes: true,
	// vLLM's clear carries no medium; it resets the GPU pool
	// (docs/events.md#vllm-events)
	clearTiers: index.TierMask(1) << index.Device,
	check:      checkVLLM,
	// vLLM's array-encoded events (docs/engines.md#event-layouts); a
	// release before medium existed published the GPU pool only
	positions: [numEvKinds]layout{
		evStored: {[]uint8{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID,
			fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}, 5},
		evRemoved: {[]uint8{fBlockHashes, fMedium, fGroupIdx}, 1},
	},
	absentMedium: []byte("GPU"),
}

const (
	vllmStoredRequired = 1<<fType | 1<<fBlockHashes | 1<<fParent | 1<<fTokenIDs |
		1<<fBlockSize | 1<<fLoraID | 1<<fMedium | 1<<fLoraName
	// removals carry group_idx; kind and window are accepted when a
	// producer sends them (docs/hybrid.md#events)
	vllmRemovedAllowed  = 1<<fType | 1<<fBlockHashes | 1<<fMedium | 1<<fGroupIdx | 1<<fSpecKind | 1<<fSlidingWindow
	vllmRemovedRequired = 1<<fType | 1<<fBlockHashes | 1<<fMedium

	clearedAllowed = 1 << fType
)

// checkVLLM applies vLLM's rules to a stored or removed event whose keys
// already passed the key rules.
func checkVLLM(d *engineDecoder, ev *engineEvent, f *engineFields) {
	reject := func(r Reason) { ev.result, ev.reason = Rejected, r }
	if reason := groupFields(d, ev, f); reason != ReasonNone {
		reject(reason)
		return
	}
	if ev.kind == evStored {
		if bs := f.v.ints[iBlockSize]; bs != d.blockSize && (!ev.grouped || bs <= 0 || bs%d.blockSize != 0 || bs > math.MaxInt32) {
			// a group's blocks are whole hash blocks (docs/hybrid.md#block-sizes)
			reject(EvBlockSize)
			return
		}
		if !bytes.Equal(f.v.strs[sLoraName], d.lora) {
			reject(EvLora)
			return
		}
		if f.nonNil&bit(fLoraID) != 0 && (f.v.ints[iLoraID] <= 0 || len(f.v.strs[sLoraName]) == 0) {
			reject(EvLora)
			return
		}
		if f.nonNil&bit(fExtraKeys) != 0 && f.extraKeysLen != int(ev.n) {
			reject(EvExtraKeys)
			return
		}
		ev.spec.BlockSize = int(f.v.ints[iBlockSize])
	}
	if !bytes.EqualFold(f.v.strs[sMedium], []byte("gpu")) {
		ev.result, ev.reason = Ignored, IgnMedium
		return
	}
	ev.tier = index.Device
	ev.result = Applied
}

// groupFields reads an event's KV-cache group fields (docs/hybrid.md#events).
// An event without them, or of group 0 with a full-attention kind at the
// hash block size, is a dense event, applied exactly as before hybrid
// events existed; any other is grouped: its block size may be any positive
// multiple of the hash block size, and its spec is checked against the
// owner's layout when it is applied.
func groupFields(d *engineDecoder, ev *engineEvent, f *engineFields) Reason {
	hasGroup := f.nonNil&bit(fGroupIdx) != 0
	hasKind := f.nonNil&bit(fSpecKind) != 0
	hasWindow := f.nonNil&bit(fSlidingWindow) != 0
	g := int64(0)
	if hasGroup {
		g = f.v.ints[iGroupIdx]
		if g < 0 || g > math.MaxInt32 {
			return EvGroup
		}
	}
	kind := index.KindOther
	if hasKind {
		kind = index.KindOf(string(f.v.strs[sSpecKind]))
	}
	if hasWindow {
		if kind != index.KindSliding || f.v.ints[iWindow] <= 0 || f.v.ints[iWindow] > math.MaxInt32 {
			return EvAttention
		}
	}
	ev.spec = index.GroupSpec{Kind: kind, SlidingWindow: int(f.v.ints[iWindow])}
	ev.group = int32(g)
	switch {
	case kind == index.KindUncached:
		ev.ignore = IgnUncachedGroup
	case hasKind && kind == index.KindOther:
		ev.ignore = IgnUnknownKind
		d.groups.noteUnknownKind(int(g), f.v.strs[sSpecKind])
	}
	switch {
	case ev.kind == evRemoved:
		// group 0's removals go the dense way unless its stores are
		// ignored (an uncached or unknown kind)
		ev.grouped = g != 0 || ev.ignore != ReasonNone || d.groups.ignore[0] != ReasonNone
	case !hasGroup && !hasKind:
	case g == 0 && (!hasKind || kind == index.KindFull) && f.v.ints[iBlockSize] == d.blockSize:
		// group 0 of full attention at the hash block size: a dense
		// model's only group; with a kind it goes through the layout only
		// so that a later group finds it there
		ev.grouped = hasKind
	default:
		// any other group, group 0 of full attention above the hash block
		// size included (a hybrid whose other groups set the hash block
		// size, docs/hybrid.md#groups-block-sizes-and-keys): its block
		// size is checked as a group's, its spec against the layout
		ev.grouped = true
	}
	return ReasonNone
}
