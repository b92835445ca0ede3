package events

import (
	"bytes"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// sglangRules is SGLang's KV event family (docs/events.md#sglang-events):
// signed int64 hashes, EAGLE bigram token pairs, no LoRA, device and host
// tiers by medium. Read-only: every SGLang decoder points at it.
var sglangRules = engineRules{
	typ: sourcetype.SGLang,
	fields: newFieldTable(func() []fieldSpec {
		f := engineFieldSpecs()
		f[fCacheSalt] = fieldSpec{"cache_salt", shapeOptStr, noSlot}
		f[fSessionID] = fieldSpec{"session_id", shapeOptStr, noSlot}
		return f
	}()),
	keys: [numEvKinds]keyRule{
		evStored:  {^uint32(0), sglangStoredRequired},
		evRemoved: {sglangRemovedAllowed, sglangRemovedRequired},
		evCleared: {clearedAllowed, 1 << fType},
	},
	tokenPairs: true,
	// SGLang publishes signed int64; a larger uint is not its form
	negHashes:  true,
	clearTiers: index.AllEngineTiers,
	check:      checkSGLang,
	// SGLang's array-encoded events (docs/engines.md#event-layouts): a
	// salted BlockStored appends its metadata map after medium; an absent
	// medium is the device, as for maps
	positions: [numEvKinds]layout{
		evStored:  {[]uint8{fBlockHashes, fParent, fTokenIDs, fBlockSize, fLoraID, fMedium, fMetadata}, 5},
		evRemoved: {[]uint8{fBlockHashes, fMedium}, 1},
	},
}

const (
	sglangStoredRequired = 1<<fType | 1<<fBlockHashes | 1<<fParent | 1<<fTokenIDs |
		1<<fBlockSize | 1<<fLoraID
	sglangRemovedAllowed  = 1<<fType | 1<<fBlockHashes | 1<<fMedium
	sglangRemovedRequired = 1<<fType | 1<<fBlockHashes
)

// checkSGLang applies SGLang's rules to a stored or removed event whose
// keys already passed the key rules.
func checkSGLang(d *engineDecoder, ev *engineEvent, f *engineFields) {
	reject := func(r Reason) { ev.result, ev.reason = Rejected, r }
	if ev.kind == evStored {
		if ev.n == 0 {
			reject(EvHash)
			return
		}
		if f.v.ints[iBlockSize] < 1 || f.v.ints[iBlockSize] > d.blockSize {
			reject(EvBlockSize)
			return
		}
		if f.nonNil&bit(fLoraID) != 0 {
			reject(EvLora)
			return
		}
	}
	tier, ok := sglangTier(f.v.strs[sMedium])
	if !ok {
		ev.result, ev.reason = Ignored, IgnMedium
		return
	}
	ev.tier = tier
	ev.result = Applied
	if ev.kind == evRemoved && ev.n == 0 {
		ev.result = NoOp
	}
}

// sglangTier maps an SGLang medium to its tier (docs/events.md#medium-to-tier);
// nil or absent is the base radix cache on the device.
func sglangTier(m []byte) (index.Tier, bool) {
	switch {
	case len(m) == 0, bytes.EqualFold(m, []byte("gpu")):
		return index.Device, true
	case bytes.EqualFold(m, []byte("cpu_pinned")), bytes.EqualFold(m, []byte("cpu")):
		return index.CPULocal, true
	case bytes.EqualFold(m, []byte("disk")):
		return index.Disk, true
	}
	return 0, false
}
