package subscriber

import (
	"bytes"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/source"
	"math"

	"github.com/mooncake-conductor-go/conductor/hashing"
	"github.com/mooncake-conductor-go/conductor/index"
)

// evKind is the tagged kind of an engine event.
type evKind uint8

const (
	evUnknown evKind = iota
	evStored
	evRemoved
	evCleared
	numEvKinds
)

// Engine event keys (§3.4, §3.5). A key is recognized only for the source
// type that defines it; for the other type it is an unknown key and ignored.
const (
	fType uint8 = iota
	fBlockHashes
	fParent
	fTokenIDs
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fCacheSalt
	fSessionID
	fUnknown = 0xff
)

func bit(f uint8) uint32 { return 1 << f }

// engineEvent is one decoded vLLM/SGLang event waiting to be applied; its
// keys are keys[off:off+n] of the decoder's arena.
type engineEvent struct {
	kind   evKind
	result Result
	reason Reason
	tier   index.Tier
	off, n int32
}

// engineDecoder decodes vLLM and SGLang batches. Its buffers are reused from
// batch to batch so steady-state decoding does not allocate.
type engineDecoder struct {
	typ       source.Type
	proj      hashing.Projection
	blockSize int64
	lora      []byte
	events    []engineEvent
	keys      []uint64
	// fields and mapEv are the event under decoding; kept here so that
	// walking its map allocates nothing.
	fields engineFields
	mapEv  engineMapEvent
}

func newEngineDecoder(typ source.Type, p *hashing.Profile, blockSize int, lora string) *engineDecoder {
	return &engineDecoder{
		typ:       typ,
		proj:      p.Projection(),
		blockSize: int64(blockSize),
		lora:      []byte(lora),
		events:    make([]engineEvent, 0, 64),
		keys:      make([]uint64, 0, 1024),
	}
}

func (d *engineDecoder) beginBatch() {
	d.events = d.events[:0]
	d.keys = d.keys[:0]
}

func (d *engineDecoder) field(key []byte) uint8 {
	switch string(key) {
	case "type":
		return fType
	case "block_hashes":
		return fBlockHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokenIDs
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoraID
	case "medium":
		return fMedium
	}
	if d.typ == source.VLLM {
		switch string(key) {
		case "lora_name":
			return fLoraName
		case "extra_keys":
			return fExtraKeys
		case "group_idx":
			return fGroupIdx
		case "kv_cache_spec_kind":
			return fSpecKind
		case "kv_cache_spec_sliding_window":
			return fSlidingWindow
		}
		return fUnknown
	}
	switch string(key) {
	case "cache_salt":
		return fCacheSalt
	case "session_id":
		return fSessionID
	}
	return fUnknown
}

// engineFields collects one event's keys before kind-specific validation;
// key order on the wire is free, so nothing can be checked until the map ends.
type engineFields struct {
	seen         uint32
	nonNil       uint32
	reject       Reason
	tag          []byte
	blockSize    int64
	loraID       int64
	medium       []byte
	loraName     []byte
	extraKeysLen int
	groupIdx     int64
	specKind     []byte
}

func (f *engineFields) fail(r Reason) {
	if f.reject == ReasonNone {
		f.reject = r
	}
}

// engineMapEvent adapts an engine event under decoding to walkEventMap.
type engineMapEvent struct {
	d *engineDecoder
	f *engineFields
}

func (e *engineMapEvent) fieldID(key []byte) (uint8, bool) {
	id := e.d.field(key)
	return id, id != fUnknown
}
func (e *engineMapEvent) seenMask() *uint32 { return &e.f.seen }
func (e *engineMapEvent) failed() bool      { return e.f.reject != ReasonNone }
func (e *engineMapEvent) fail(r Reason)     { e.f.fail(r) }
func (e *engineMapEvent) readField(r *msgp.Reader, id uint8) error {
	return e.d.readField(r, id, e.f)
}

func (d *engineDecoder) readEvent(r *msgp.Reader, _ *envelope, _ int) error {
	d.events = append(d.events, engineEvent{})
	ev := &d.events[len(d.events)-1]
	d.fields = engineFields{}
	f := &d.fields
	d.mapEv = engineMapEvent{d: d, f: f}
	off := len(d.keys)
	if err := readEventMap(r, &d.mapEv); err != nil {
		return err
	}
	if f.reject != ReasonNone {
		d.keys = d.keys[:off]
		ev.result, ev.reason = Rejected, f.reject
		return nil
	}
	ev.off, ev.n = int32(off), int32(len(d.keys)-off)
	d.validate(ev, f)
	if ev.result == Rejected {
		d.keys = d.keys[:off]
		ev.n = 0
	}
	return nil
}

// readField reads one recognized value and type-checks it.
func (d *engineDecoder) readField(r *msgp.Reader, id uint8, f *engineFields) error {
	k, err := r.Peek()
	if err != nil {
		return err
	}
	if k != msgp.Nil {
		f.nonNil |= bit(id)
	}
	switch id {
	case fType:
		if k != msgp.Str {
			f.fail(EvWrongType)
			return r.Skip()
		}
		f.tag, err = r.Str()
		return err
	case fBlockHashes:
		if k != msgp.Array {
			f.fail(EvWrongType)
			return r.Skip()
		}
		return d.readHashes(r, f)
	case fParent:
		return d.readParent(r, k, f)
	case fTokenIDs:
		if k == msgp.Nil {
			return r.Nil()
		}
		if k != msgp.Array {
			f.fail(EvWrongType)
			return r.Skip()
		}
		return readTokenArray(r, d.typ == source.SGLang, f)
	case fBlockSize:
		v, present, ok, err := optInt(r)
		if err != nil {
			return err
		}
		if !ok || !present {
			f.fail(EvWrongType)
		}
		f.blockSize = v
		return nil
	case fLoraID, fGroupIdx, fSlidingWindow:
		v, _, ok, err := optInt(r)
		if err != nil {
			return err
		}
		if !ok {
			f.fail(EvWrongType)
		}
		if id == fLoraID {
			f.loraID = v
		} else if id == fGroupIdx {
			f.groupIdx = v
		}
		return nil
	case fMedium, fLoraName, fSpecKind, fCacheSalt, fSessionID:
		b, _, ok, err := optStr(r)
		if err != nil {
			return err
		}
		if !ok {
			f.fail(EvWrongType)
		}
		switch id {
		case fMedium:
			f.medium = b
		case fLoraName:
			f.loraName = b
		case fSpecKind:
			f.specKind = b
		}
		return nil
	case fExtraKeys:
		if k == msgp.Nil {
			return r.Nil()
		}
		if k != msgp.Array {
			f.fail(EvExtraKeys)
			return r.Skip()
		}
		n, err := r.ArrayLen()
		if err != nil {
			return err
		}
		f.extraKeysLen = n
		for i := 0; i < n; i++ {
			ek, err := r.Peek()
			if err != nil {
				return err
			}
			if ek != msgp.Nil && ek != msgp.Array {
				f.fail(EvExtraKeys)
			}
			// entries are not interpreted (§3.4.1)
			if err := r.Skip(); err != nil {
				return err
			}
		}
		return nil
	}
	return r.Skip()
}

// readHashes projects every block hash to its index key (§3.6) and appends
// it to the arena.
func (d *engineDecoder) readHashes(r *msgp.Reader, f *engineFields) error {
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		k, err := r.Peek()
		if err != nil {
			return err
		}
		if f.reject != ReasonNone {
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		var key uint64
		var herr error
		switch {
		case k == msgp.Int:
			u, neg, err := r.Integer()
			if err != nil {
				return err
			}
			switch {
			case neg && d.typ == source.VLLM:
				// current vLLM never emits negative hashes
				f.fail(EvHash)
				continue
			case neg:
				key, herr = hashing.KeyFromInt(d.proj, int64(u))
			case d.typ == source.SGLang && u > math.MaxInt64:
				// SGLang publishes signed int64; a larger uint is not its form
				f.fail(EvHash)
				continue
			default:
				key, herr = hashing.KeyFromUint(d.proj, u)
			}
		case k == msgp.Bin && d.typ == source.VLLM:
			b, err := r.Str()
			if err != nil {
				return err
			}
			if len(b) < 8 {
				f.fail(EvHash)
				continue
			}
			key, herr = hashing.KeyFromBytes(d.proj, b)
		default:
			f.fail(EvHash)
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		if herr != nil {
			f.fail(EvHash)
			continue
		}
		d.keys = append(d.keys, key)
	}
	return nil
}

// readParent type-checks parent_block_hash; the chain link itself is not
// needed because hashes are prefix hashes (§3.8).
func (d *engineDecoder) readParent(r *msgp.Reader, k msgp.Kind, f *engineFields) error {
	switch {
	case k == msgp.Nil:
		return r.Nil()
	case k == msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return err
		}
		if (neg && d.typ == source.VLLM) || (!neg && d.typ == source.SGLang && u > math.MaxInt64) {
			f.fail(EvHash)
		}
		return nil
	case k == msgp.Bin && d.typ == source.VLLM:
		_, err := r.Str()
		return err
	}
	f.fail(EvWrongType)
	return r.Skip()
}

// keyRules are, per source type and event kind, the recognized keys an
// event may carry (others reject it as foreign, §3.2 rule 5) and the ones
// it must carry.
var keyRules = [2][numEvKinds]struct{ allowed, required uint32 }{
	source.VLLM: {
		evStored:  {^uint32(0), vllmStoredRequired},
		evRemoved: {vllmRemovedAllowed, vllmRemovedRequired},
		evCleared: {clearedAllowed, 1 << fType},
	},
	source.SGLang: {
		evStored:  {^uint32(0), sglangStoredRequired},
		evRemoved: {sglangRemovedAllowed, sglangRemovedRequired},
		evCleared: {clearedAllowed, 1 << fType},
	},
}

const (
	vllmStoredRequired = 1<<fType | 1<<fBlockHashes | 1<<fParent | 1<<fTokenIDs |
		1<<fBlockSize | 1<<fLoraID | 1<<fMedium | 1<<fLoraName
	vllmRemovedAllowed  = 1<<fType | 1<<fBlockHashes | 1<<fMedium | 1<<fGroupIdx
	vllmRemovedRequired = 1<<fType | 1<<fBlockHashes | 1<<fMedium

	sglangStoredRequired = 1<<fType | 1<<fBlockHashes | 1<<fParent | 1<<fTokenIDs |
		1<<fBlockSize | 1<<fLoraID
	sglangRemovedAllowed  = 1<<fType | 1<<fBlockHashes | 1<<fMedium
	sglangRemovedRequired = 1<<fType | 1<<fBlockHashes

	clearedAllowed = 1 << fType
)

// validate applies the kind-specific rules of §3.4/§3.5 and picks the tier.
func (d *engineDecoder) validate(ev *engineEvent, f *engineFields) {
	reject := func(r Reason) { ev.result, ev.reason = Rejected, r }
	if f.seen&bit(fType) == 0 || f.nonNil&bit(fType) == 0 {
		reject(EvMissingKey)
		return
	}
	switch string(f.tag) {
	case "BlockStored":
		ev.kind = evStored
	case "BlockRemoved":
		ev.kind = evRemoved
	case "AllBlocksCleared":
		ev.kind = evCleared
	default:
		reject(EvUnknownTag)
		return
	}
	rule := keyRules[d.typ][ev.kind]
	switch {
	case f.seen&^rule.allowed != 0:
		reject(EvForeignKey)
		return
	case f.seen&rule.required != rule.required:
		reject(EvMissingKey)
		return
	case ev.kind == evCleared:
		ev.result = Applied
		return
	}
	if d.typ == source.VLLM {
		d.validateVLLM(ev, f, reject)
	} else {
		d.validateSGLang(ev, f, reject)
	}
}

// validateVLLM applies vLLM's rules to a stored or removed event whose keys
// already passed keyRules.
func (d *engineDecoder) validateVLLM(ev *engineEvent, f *engineFields, reject func(Reason)) {
	if ev.kind == evStored {
		if f.blockSize != d.blockSize {
			reject(EvBlockSize)
			return
		}
		if !bytes.Equal(f.loraName, d.lora) {
			reject(EvLora)
			return
		}
		if f.nonNil&bit(fLoraID) != 0 && (f.loraID <= 0 || len(f.loraName) == 0) {
			reject(EvLora)
			return
		}
		if f.nonNil&bit(fExtraKeys) != 0 && f.extraKeysLen != int(ev.n) {
			reject(EvExtraKeys)
			return
		}
		if f.nonNil&bit(fSpecKind) != 0 {
			switch string(f.specKind) {
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
	if f.nonNil&bit(fGroupIdx) != 0 && f.groupIdx != 0 {
		reject(EvGroup)
		return
	}
	if !bytes.EqualFold(f.medium, []byte("gpu")) {
		ev.result, ev.reason = Ignored, IgnMedium
		return
	}
	ev.tier = index.Device
	ev.result = Applied
}

// validateSGLang applies SGLang's rules to a stored or removed event whose
// keys already passed keyRules.
func (d *engineDecoder) validateSGLang(ev *engineEvent, f *engineFields, reject func(Reason)) {
	if ev.kind == evStored {
		if ev.n == 0 {
			reject(EvHash)
			return
		}
		if f.blockSize < 1 || f.blockSize > d.blockSize {
			reject(EvBlockSize)
			return
		}
		if f.nonNil&bit(fLoraID) != 0 {
			reject(EvLora)
			return
		}
	}
	tier, ok := sglangTier(f.medium)
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

// sglangTier maps an SGLang medium to its tier (§3.7); nil or absent is the
// base radix cache on the device.
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

// apply dispatches the decoded events in order to the engine owner.
func (d *engineDecoder) apply(sink EngineSink, owner index.OwnerID) {
	for i := range d.events {
		ev := &d.events[i]
		if ev.result != Applied {
			continue
		}
		switch ev.kind {
		case evStored:
			for _, k := range d.keys[ev.off : ev.off+ev.n] {
				sink.Store(owner, ev.tier, k)
			}
		case evRemoved:
			for _, k := range d.keys[ev.off : ev.off+ev.n] {
				sink.Remove(owner, ev.tier, k)
			}
		case evCleared:
			if d.typ == source.VLLM {
				// vLLM's clear carries no medium; it resets the GPU pool (Q13)
				sink.ClearOwner(owner, index.TierMask(1)<<index.Device)
			} else {
				sink.ClearOwner(owner, index.AllEngineTiers)
			}
		}
	}
}
