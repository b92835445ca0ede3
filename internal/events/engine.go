package events

import (
	"math"
	"slices"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/rs/zerolog"
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

// Engine event keys (docs/events.md#vllm-events,
// docs/events.md#sglang-events), the field ids of both engine families.
// A key is recognized only by the family whose table names it (vllm.go,
// sglang.go); for the other it is an unknown key and ignored.
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
	// fMetadata is SGLang's block-metadata map of array-encoded events
	// (positional.go); it has no map key of its own.
	fMetadata
	numEngineFields
)

// Slots of the engine values an event keeps (fieldSpec.slot).
const (
	sTag = iota // strs
	sMedium
	sLoraName
	sSpecKind
)

const (
	iBlockSize = iota // ints
	iLoraID
	iGroupIdx
	iWindow
)

// engineFieldSpecs returns the spec of every engine key both families
// share; each family adds its own.
func engineFieldSpecs() []fieldSpec {
	f := make([]fieldSpec, numEngineFields)
	f[fType] = fieldSpec{"type", shapeStr, sTag}
	f[fBlockHashes] = fieldSpec{"block_hashes", shapeOwn, noSlot}
	f[fParent] = fieldSpec{"parent_block_hash", shapeOwn, noSlot}
	f[fTokenIDs] = fieldSpec{"token_ids", shapeTokens, noSlot}
	f[fBlockSize] = fieldSpec{"block_size", shapeInt, iBlockSize}
	f[fLoraID] = fieldSpec{"lora_id", shapeOptInt, iLoraID}
	f[fMedium] = fieldSpec{"medium", shapeOptStr, sMedium}
	f[fMetadata] = fieldSpec{"", shapeOwn, noSlot}
	return f
}

// engineRules is what sets one engine family apart: the keys it defines,
// which of them each event kind allows and requires, the hash forms it
// publishes, the tiers its clear resets, and its kind-specific checks.
type engineRules struct {
	typ    sourcetype.Type
	fields *fieldTable
	keys   [numEvKinds]keyRule
	// tokenPairs accepts [a, b] pairs among token ids (SGLang EAGLE).
	tokenPairs bool
	// negHashes accepts negative integer hashes (signed int64 publishers);
	// bigHashes accepts unsigned ones above MaxInt64; binHashes accepts
	// byte-string hashes.
	negHashes, bigHashes, binHashes bool
	// clearTiers is what AllBlocksCleared resets.
	clearTiers index.TierMask
	// check applies the family's rules to a stored or removed event whose
	// keys passed keys; it sets ev.result (and reason) and ev.tier.
	check func(d *engineDecoder, ev *engineEvent, f *engineFields)
	// positions is, per event kind, the field order of the family's
	// array-encoded events (positional.go, docs/events.md#array-encoded-events).
	positions [numEvKinds]layout
	// absentMedium is the medium of an array-encoded event too short to
	// carry one (a release before the field existed).
	absentMedium []byte
}

// keyRule is, for one event kind, the recognized keys an event may carry
// (others reject it as foreign, docs/events.md#event-rules) and the ones it
// must carry.
type keyRule struct{ allowed, required uint32 }

func bit(f uint8) uint32 { return 1 << f }

// engineEvent is one decoded vLLM/SGLang event waiting to be applied; its
// keys are keys[off:off+n] of the decoder's arena.
type engineEvent struct {
	kind   evKind
	result Result
	reason Reason
	tier   index.Tier
	off, n int32
	// bs is the event's block_size and spans locate the values a hash
	// check reads again (hashcheck.go), for stored events only.
	bs    int32
	spans [numSpans]span
	// group is the event's KV-cache group and spec, when grouped says it
	// carried group fields (vllm.go, docs/hybrid.md#events).
	grouped bool
	group   int32
	spec    index.GroupSpec
	// ignore, for a grouped event, is why its group is not indexed
	// (IgnUncachedGroup, IgnUnknownKind), ReasonNone when it is.
	ignore Reason
}

// wireValues are the event's values the rules judge, kept for the log of
// a rejection.
type wireValues struct {
	blockSize, group, window int64
	hasGroup                 bool
	// array: the event was array-encoded (positional.go), which the log
	// says, since its positions rather than its keys were judged.
	array bool
}

// engineDecoder decodes vLLM and SGLang batches. Its buffers are reused from
// batch to batch so steady-state decoding does not allocate.
type engineDecoder struct {
	batch
	rules     *engineRules
	sink      EngineSink
	owner     index.OwnerID
	proj      hashing.Projection
	blockSize int64
	lora      []byte
	events    []engineEvent
	// wires[i] is what the log of events[i]'s rejection names
	// (RejectDetail); apart from events, which deferred link checks copy.
	wires []wireValues
	keys  []uint64
	// hints[i] is where the sink stored the block of keys[i] (index's
	// block hint), for a stored event while verified links are on: the
	// links keep it beside the block (links.go).
	hints []uint32
	// fields and mapEv are the event under decoding; kept here so that
	// walking its map allocates nothing.
	fields engineFields
	mapEv  engineMapEvent
	metaEv metadataMapEvent // SGLang's block-metadata map (positional.go)
	// check samples applied BlockStored events (hashcheck.go); payload is
	// the batch they are read from again, until Forget.
	check   *hashcheck.Checker
	payload []byte
	hc      hcScratch
	// links, for vLLM, records the blocks of applied BlockStored events
	// that verify (links.go) under profile and loraName; keepSpans says
	// the check or the links read events again.
	links     hashing.LinkScope
	profile   hashing.Profile
	loraName  string
	keepSpans bool
	ls        linkScratch
	pend      pendingLinks
	// groups is the decoder's side of the owner's layout (vllm.go).
	groups groupState
	// std keys blocks by the standard hash (engine_std.go) when the
	// registration's profile is rfc1527.
	std stdState
}

func newEngine(rules *engineRules, cfg Config) *engineDecoder {
	d := &engineDecoder{
		rules:     rules,
		sink:      cfg.Engine,
		owner:     cfg.Owner,
		proj:      cfg.Profile.Projection(),
		blockSize: int64(cfg.Context.BlockSize),
		lora:      []byte(cfg.Context.Lora),
		check:     cfg.Check,
		groups:    groupState{log: cfg.Logger, stats: cfg.Stats},
		events:    make([]engineEvent, 0, 64),
		keys:      make([]uint64, 0, 1024),
		profile:   cfg.Profile,
		loraName:  cfg.Context.Lora,
		pend:      pendingLinks{max: cfg.LinkDefer, shared: cfg.Links},
	}
	if rules.typ == sourcetype.VLLM {
		d.links = cfg.Links.Scope(&d.profile)
	}
	if cfg.Profile.IsStandard() {
		// The engine's hashes only name blocks for removal; the keys are
		// recomputed, which the hash check would only repeat.
		d.std = stdState{on: true, seed: cfg.Profile.StdSeed(), max: DefaultStdMapEntries, stats: cfg.Stats}
		d.proj = hashing.Low64BE
		if rules.typ == sourcetype.SGLang {
			d.proj = hashing.First64BE
		}
		d.check = nil
	}
	d.keepSpans = d.check != nil || d.links.Enabled() || d.std.on
	return d
}

func (d *engineDecoder) beginBatch() {
	d.events = d.events[:0]
	d.wires = d.wires[:0]
	d.keys = d.keys[:0]
}

// Decode implements Decoder.
func (d *engineDecoder) Decode(payload []byte) Reason {
	if d.keepSpans {
		d.payload = payload
	}
	return d.decode(d.rules.typ, payload, d)
}

// Forget implements Decoder.
func (d *engineDecoder) Forget() {
	d.r.Reset(nil)
	d.fields = engineFields{}
	d.payload = nil
}

// Retract implements Decoder: the owner's entries in every engine tier go.
// Verification still waiting is dropped with them.
func (d *engineDecoder) Retract() {
	d.DropPending()
	d.std.release()
	d.sink.ClearOwner(d.owner, index.AllEngineTiers)
}

// engineFields collects one event's keys before kind-specific validation;
// key order on the wire is free, so nothing can be checked until the map ends.
type engineFields struct {
	seen         uint32
	nonNil       uint32
	reject       Reason
	extraKeysLen int
	v            values
	spans        [numSpans]span
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
	return e.d.rules.fields.lookup(key)
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
	k, err := r.Peek()
	if err != nil {
		return err
	}
	if k == msgp.Array {
		err = d.readEventArray(r, f)
	} else {
		err = readEventMap(r, &d.mapEv)
	}
	if err != nil {
		return err
	}
	d.wires = append(d.wires, wireValues{blockSize: f.v.ints[iBlockSize], group: f.v.ints[iGroupIdx], window: f.v.ints[iWindow],
		hasGroup: f.nonNil&bit(fGroupIdx) != 0, array: k == msgp.Array})
	if f.reject != ReasonNone {
		d.keys = d.keys[:off]
		ev.result, ev.reason = Rejected, f.reject
		return nil
	}
	ev.off, ev.n = int32(off), int32(len(d.keys)-off)
	d.validate(ev, f)
	if ev.kind == evStored && ev.result == Applied && d.keepSpans {
		ev.bs, ev.spans = int32(f.v.ints[iBlockSize]), f.spans
	}
	if ev.result == Rejected {
		d.keys = d.keys[:off]
		ev.n = 0
	}
	return nil
}

// readField reads one recognized value and type-checks it, and notes where
// the values a hash check reads again lie.
func (d *engineDecoder) readField(r *msgp.Reader, id uint8, f *engineFields) error {
	sp := spanOf[id]
	if sp == noSpan || !d.keepSpans {
		return d.readValue(r, id, f)
	}
	start := r.Pos()
	err := d.readValue(r, id, f)
	f.spans[sp] = span{int32(start), int32(r.Pos())}
	return err
}

// readValue reads and type-checks the value of field id.
func (d *engineDecoder) readValue(r *msgp.Reader, id uint8, f *engineFields) error {
	k, err := r.Peek()
	if err != nil {
		return err
	}
	if k != msgp.Nil {
		f.nonNil |= bit(id)
	}
	if spec := &d.rules.fields.specs[id]; spec.shape != shapeOwn {
		return readShaped(r, spec, &f.v, f, d.rules.tokenPairs)
	}
	switch id {
	case fBlockHashes:
		if k != msgp.Array {
			f.fail(EvWrongType)
			return r.Skip()
		}
		return d.readHashes(r, f)
	case fParent:
		return d.readParent(r, k, f)
	case fMetadata:
		return d.readMetadata(r, k, f)
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
			// entries are not interpreted (docs/events.md#vllm-events)
			if err := r.Skip(); err != nil {
				return err
			}
		}
		return nil
	}
	return r.Skip()
}

// readHashes projects every block hash to its index key
// (docs/events.md#block-hash-forms) and appends it to the arena.
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
			case neg && !d.rules.negHashes:
				f.fail(EvHash)
				continue
			case neg:
				key, herr = hashing.KeyFromInt(d.proj, int64(u))
			case u > math.MaxInt64 && !d.rules.bigHashes:
				f.fail(EvHash)
				continue
			default:
				key, herr = hashing.KeyFromUint(d.proj, u)
			}
		case k == msgp.Bin && d.rules.binHashes:
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
// needed because hashes are prefix hashes (docs/events.md#parent-hashes).
func (d *engineDecoder) readParent(r *msgp.Reader, k msgp.Kind, f *engineFields) error {
	switch {
	case k == msgp.Nil:
		return r.Nil()
	case k == msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return err
		}
		if (neg && !d.rules.negHashes) || (!neg && u > math.MaxInt64 && !d.rules.bigHashes) {
			f.fail(EvHash)
		}
		return nil
	case k == msgp.Bin && d.rules.binHashes:
		_, err := r.Str()
		return err
	}
	f.fail(EvWrongType)
	return r.Skip()
}

// validate applies the kind-specific rules (docs/events.md#vllm-events,
// docs/events.md#sglang-events) and picks the tier.
func (d *engineDecoder) validate(ev *engineEvent, f *engineFields) {
	reject := func(r Reason) { ev.result, ev.reason = Rejected, r }
	if f.seen&bit(fType) == 0 || f.nonNil&bit(fType) == 0 {
		reject(EvMissingKey)
		return
	}
	switch string(f.v.strs[sTag]) {
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
	rule := d.rules.keys[ev.kind]
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
	d.rules.check(d, ev, f)
}

// Apply implements Decoder: the decoded events go in order to the engine
// owner.
func (d *engineDecoder) Apply() int {
	sink, owner := d.sink, d.owner
	linking := d.links.Enabled()
	if linking {
		d.hints = slices.Grow(d.hints[:0], len(d.keys))[:len(d.keys)]
	}
	for i := range d.events {
		ev := &d.events[i]
		if ev.result != Applied {
			continue
		}
		if d.std.on && ev.kind == evStored {
			if d.stdStored(ev); ev.result != Applied {
				continue
			}
		}
		if d.std.on && ev.kind == evRemoved {
			d.stdRemoved(ev)
		}
		switch ev.kind {
		case evStored:
			if ev.grouped {
				d.applyGrouped(ev)
				continue
			}
			keys := d.keys[ev.off : ev.off+ev.n]
			if linking {
				hints := d.hints[ev.off : ev.off+ev.n]
				for j, k := range keys {
					hints[j], _ = sink.Store(owner, index.Put{Key: k, Tier: ev.tier})
				}
			} else {
				for _, k := range keys {
					sink.Store(owner, index.Put{Key: k, Tier: ev.tier})
				}
			}
			if d.check != nil {
				if n := d.check.Sample(int(ev.n)); n > 0 {
					d.checkStored(ev, n)
				}
			}
			switch {
			case !linking:
			case d.pend.max > 0:
				d.deferLink(ev)
			default:
				d.linkStored(ev)
			}
		case evRemoved:
			if ev.grouped {
				d.applyGrouped(ev)
				continue
			}
			for _, k := range d.keys[ev.off : ev.off+ev.n] {
				sink.Remove(owner, index.Put{Key: k, Tier: ev.tier})
			}
		case evCleared:
			d.std.release()
			sink.ClearOwner(owner, d.rules.clearTiers)
		}
	}
	return len(d.events)
}

// Outcome implements Decoder.
func (d *engineDecoder) Outcome(i int) (Result, Reason) {
	return d.events[i].result, d.events[i].reason
}

// RejectDetail implements RejectDetailer: a rejected event's values
// against the registration's or the layout's. Token ids and hashes are
// never named.
func (d *engineDecoder) RejectDetail(i int, e *zerolog.Event) {
	if i < 0 || i >= len(d.events) || i >= len(d.wires) || d.events[i].result != Rejected {
		return
	}
	ev := &d.events[i]
	w := &d.wires[i]
	if w.array {
		e.Str("encoding", "array")
	}
	if w.hasGroup && ev.reason != EvGroup {
		e.Int64("group", w.group)
	}
	switch ev.reason {
	case EvBlockSize:
		e.Int64("block_size", w.blockSize).Int64("registered_block_size", d.blockSize)
		switch {
		case d.rules.typ == sourcetype.SGLang:
			e.Str("rule", "1 to the registered block_size")
		case ev.grouped && ev.group == 0 && w.blockSize > 0 && w.blockSize%d.blockSize == 0:
			e.Str("rule", "group 0 above the registered block size needs another group that makes the registered one the gcd (vLLM hashes at the gcd of its groups' block sizes); a single-group model registers the engine's block_size")
		case ev.grouped:
			e.Str("rule", "a group's block_size is a positive multiple of the registered (hash) block size")
		default:
			e.Str("rule", "an event without group fields has the registered block_size")
		}
	case EvLora:
		e.Str("registered_lora_name", d.loraName)
	case EvGroup:
		e.Int64("group_idx", w.group).Int("max_groups", index.MaxGroups)
	case EvAttention:
		e.Str("kind", ev.spec.Kind.String()).Int64("sliding_window", w.window)
	case EvLayout:
		e.Str("kind", ev.spec.Kind.String()).Int("block_size", ev.spec.BlockSize).Int("sliding_window", ev.spec.SlidingWindow)
		if g := int(ev.group); g < index.MaxGroups && d.groups.seen&(1<<g) != 0 {
			k := d.groups.known[g]
			e.Str("known_kind", k.Kind.String()).Int("known_block_size", k.BlockSize).Int("known_sliding_window", k.SlidingWindow)
		}
	}
}
