package events

import (
	"bytes"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/source"
)

// vllmRules is vLLM's KV event family (docs/events.md#vllm-events): unsigned
// or byte-string hashes, LoRA by name, attention kinds and cache groups, GPU
// medium only.
var vllmRules = engineRules{
	typ: source.VLLM,
	fields: newFieldTable(func() []fieldSpec {
		f := engineFieldSpecs()
		f[fLoraName] = fieldSpec{"lora_name", shapeOptStr, sLoraName}
		f[fExtraKeys] = fieldSpec{"extra_keys", shapeOwn, noSlot}
		f[fGroupIdx] = fieldSpec{"group_idx", shapeOptInt, iGroupIdx}
		f[fSpecKind] = fieldSpec{"kv_cache_spec_kind", shapeOptStr, sSpecKind}
		f[fSlidingWindow] = fieldSpec{"kv_cache_spec_sliding_window", shapeOptInt, noSlot}
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
}

const (
	vllmStoredRequired = 1<<fType | 1<<fBlockHashes | 1<<fParent | 1<<fTokenIDs |
		1<<fBlockSize | 1<<fLoraID | 1<<fMedium | 1<<fLoraName
	vllmRemovedAllowed  = 1<<fType | 1<<fBlockHashes | 1<<fMedium | 1<<fGroupIdx
	vllmRemovedRequired = 1<<fType | 1<<fBlockHashes | 1<<fMedium

	clearedAllowed = 1 << fType
)

// checkVLLM applies vLLM's rules to a stored or removed event whose keys
// already passed the key rules.
func checkVLLM(d *engineDecoder, ev *engineEvent, f *engineFields) {
	reject := func(r Reason) { ev.result, ev.reason = Rejected, r }
	if ev.kind == evStored {
		if f.v.ints[iBlockSize] != d.blockSize {
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
		if f.nonNil&bit(fSpecKind) != 0 {
			switch string(f.v.strs[sSpecKind]) {
			case "full_attention", "mla_attention", "sink_full_attention":
			default:
				reject(EvAttention)
				return
			}
		}
		if f.nonNil&bit(fSlidingWindow) != 0 {
			reject(EvAttention)
			return
		}
	}
	if f.nonNil&bit(fGroupIdx) != 0 && f.v.ints[iGroupIdx] != 0 {
		reject(EvGroup)
		return
	}
	if !bytes.EqualFold(f.v.strs[sMedium], []byte("gpu")) {
		ev.result, ev.reason = Ignored, IgnMedium
		return
	}
	ev.tier = index.Device
	ev.result = Applied
}
