package events

import (
	"bytes"
	"math"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/rs/zerolog"
)

// Mooncake master event keys (docs/events.md#mooncake-fields,
// docs/events.md#mooncake-hash-fields).
const (
	mEventID uint8 = iota
	mTimestamp
	mEventType
	mType
	mModelName
	mBlockSize
	mAdditionalSalt
	mLoraName
	mTenantID
	mBackendID
	mMedium
	mDPRank
	mGroupID
	mObjectKey
	mSeqHashes
	mBlockHashes
	mBaseBlockIdx
	mParentHash
	mTokenIDs
	mParentBlockHash
	mConnectorBlockHash
	mCachePrefix
	mTPRank
	mHeadOrTPRank
	mPCPRank
	mDCPRank
	mPPRank
	mLayerID
)

const (
	mcCommonRequired = 1<<mEventID | 1<<mTimestamp | 1<<mEventType | 1<<mModelName |
		1<<mBlockSize | 1<<mAdditionalSalt | 1<<mLoraName | 1<<mTenantID |
		1<<mBackendID | 1<<mMedium | 1<<mDPRank
	mcObjectRequired = 1<<mGroupID | 1<<mSeqHashes | 1<<mBaseBlockIdx
	mcStoredRequired = mcCommonRequired | mcObjectRequired | 1<<mParentHash | 1<<mTokenIDs
	mcStoredOnly     = 1<<mParentHash | 1<<mTokenIDs | 1<<mParentBlockHash
	mcObjectFields   = 1<<mGroupID | 1<<mObjectKey | 1<<mConnectorBlockHash | 1<<mCachePrefix |
		1<<mTPRank | 1<<mHeadOrTPRank | 1<<mPCPRank | 1<<mDCPRank | 1<<mPPRank | 1<<mLayerID |
		1<<mSeqHashes | 1<<mBlockHashes | 1<<mBaseBlockIdx | mcStoredOnly
)

// Slots of the values a master event keeps (fieldSpec.slot).
const (
	mcEventType = iota // strs
	mcTenant
	mcBackend
	mcObjectKey
	mcConnector
	mcTag
	mcModel
	mcLora
	mcMedium
	mcGroup
)

const (
	mcTimestamp = iota // uints
	mcParent
	mcParentBlk
)

const (
	mcBlockSize = iota // ints
	mcBaseIdx
)

// mooncakeFields is the master's key table (docs/events.md#mooncake-fields,
// docs/events.md#mooncake-hash-fields); read-only after initialisation.
var mooncakeFields = newFieldTable(func() []fieldSpec {
	f := make([]fieldSpec, mLayerID+1)
	f[mEventID] = fieldSpec{"event_id", shapeUint, noSlot}
	f[mTimestamp] = fieldSpec{"timestamp", shapeUint, mcTimestamp}
	f[mEventType] = fieldSpec{"event_type", shapeStr, mcEventType}
	f[mType] = fieldSpec{"type", shapeOptStr, mcTag}
	f[mModelName] = fieldSpec{"model_name", shapeOptStr, mcModel}
	f[mBlockSize] = fieldSpec{"block_size", shapeOptInt, mcBlockSize}
	f[mAdditionalSalt] = fieldSpec{"additional_salt", shapeOptStr, noSlot}
	f[mLoraName] = fieldSpec{"lora_name", shapeOptStr, mcLora}
	f[mTenantID] = fieldSpec{"tenant_id", shapeOptStr, mcTenant}
	f[mBackendID] = fieldSpec{"backend_id", shapeStr, mcBackend}
	f[mMedium] = fieldSpec{"medium", shapeOptStr, mcMedium}
	f[mDPRank] = fieldSpec{"dp_rank", shapeOwn, noSlot}
	f[mGroupID] = fieldSpec{"group_id", shapeOptStr, mcGroup}
	f[mObjectKey] = fieldSpec{"object_key", shapeStr, mcObjectKey}
	f[mSeqHashes] = fieldSpec{"seq_hashes", shapeOwn, noSlot}
	f[mBlockHashes] = fieldSpec{"block_hashes", shapeOwn, noSlot}
	f[mBaseBlockIdx] = fieldSpec{"base_block_idx", shapeOptInt, mcBaseIdx}
	f[mParentHash] = fieldSpec{"parent_hash", shapeOptUint, mcParent}
	f[mTokenIDs] = fieldSpec{"token_ids", shapeTokens, noSlot}
	f[mParentBlockHash] = fieldSpec{"parent_block_hash", shapeOptUint, mcParentBlk}
	f[mConnectorBlockHash] = fieldSpec{"connector_block_hash", shapeStr, mcConnector}
	f[mCachePrefix] = fieldSpec{"cache_prefix", shapeStr, noSlot}
	for _, id := range []uint8{mTPRank, mHeadOrTPRank, mPCPRank, mDCPRank, mPPRank, mLayerID} {
		f[id].shape, f[id].slot = shapeOptInt, noSlot
	}
	f[mTPRank].name = "tp_rank"
	f[mHeadOrTPRank].name = "head_or_tp_rank"
	f[mPCPRank].name = "pcp_rank"
	f[mDCPRank].name = "dcp_rank"
	f[mPPRank].name = "pp_rank"
	f[mLayerID].name = "layer_id"
	return f
}())

// mcEvent is one decoded master event waiting to be applied. Its byte
// slices alias the payload, which outlives the apply step.
type mcEvent struct {
	kind   evKind
	result Result
	reason Reason
	seen   uint32
	nonNil uint32

	v          values
	seqN, blkN int
	seq0, blk0 uint64
	// seqOff is where the event's seq_hashes start in the decoder's
	// arena, kept under the standard profile only (mooncake_std.go).
	seqOff int
}

func (e *mcEvent) fail(r Reason) {
	if e.result != Rejected {
		e.result, e.reason = Rejected, r
	}
}

func (e *mcEvent) has(f uint8) bool    { return e.seen&(1<<f) != 0 }
func (e *mcEvent) hasVal(f uint8) bool { return e.nonNil&(1<<f) != 0 }

// unstamped reports an event that leaves its own dp_rank nil: the
// released master's publisher (Mooncake v0.3.12 and main), which stamps
// none of the context fields and leaves them to the registration
// (docs/events.md#registration-context). Every other master publisher
// stamps a dp_rank, and is held to the context it stamps.
func (e *mcEvent) unstamped() bool { return e.has(mDPRank) && !e.hasVal(mDPRank) }

// tenantID is the event's tenant: the writer's tenant the master forwards;
// an empty one is "default" (the master normalizes it so, and so does the
// contract: "Empty or omitted means default"). A nil tenant, which only an
// unstamped event may send, is the registration's.
func (d *mooncakeDecoder) tenantID(e *mcEvent) string {
	if !e.hasVal(mTenantID) {
		return d.ownCtx.Tenant
	}
	if len(e.v.strs[mcTenant]) == 0 {
		return "default"
	}
	return string(e.v.strs[mcTenant])
}

// storedContext resolves a stored event's context (docs/events.md#mooncake-context,
// docs/events.md#registration-context): the fields the event states, and
// for an unstamped event the registration's in place of the nil ones.
// ok is false, with the event rejected, when the context is undecidable.
func (d *mooncakeDecoder) storedContext(e *mcEvent) (index.ContextKey, bool) {
	fill := e.unstamped()
	ctx := index.ContextKey{Tenant: d.tenantID(e), Model: string(e.v.strs[mcModel]), Lora: string(e.v.strs[mcLora])}
	bs := e.v.ints[mcBlockSize]
	if fill {
		if !e.hasVal(mBlockSize) {
			bs = int64(d.ownCtx.BlockSize)
		}
		if !e.hasVal(mModelName) {
			ctx.Model = d.ownCtx.Model
		}
		if !e.hasVal(mLoraName) {
			ctx.Lora = d.ownCtx.Lora
		}
	}
	if bs <= 0 || bs > math.MaxInt32 {
		e.fail(EvBlockSize)
		return ctx, false
	}
	ctx.BlockSize = int(bs)
	if ctx.Model == "" {
		e.fail(EvContext)
		return ctx, false
	}
	return ctx, true
}

// bindingKey identifies one shared owner (docs/events.md#bindings): the
// endpoint is implicit (one table per source).
type bindingKey struct {
	backend  string
	tenant   string
	identity string // full object_key (vLLM) or logical key (SGLang)
	tier     index.Tier
}

// binding is one object (or SGLang logical page) the master reported in a
// tier; it holds exactly one shared reference on its prefix, ref, which
// charges the binding's bytes to the index's budget. The index may evict
// the reference with its block (ref.Gone); the binding is then forgotten
// (docs/index-memory.md#mooncake-bindings).
type binding struct {
	sink       SharedSink
	key        bindingKey
	ctx        index.ContextKey
	prefix     uint64
	fullHash   string
	group      string
	components map[string]struct{} // SGLang: component suffixes present
	ref        index.SharedRef
	// vgroup is the vLLM KV-cache group of a vllm_v1 object (group is then
	// its decimal form, "" for group 0; mooncake_groups.go).
	vgroup int
}

// Accounted bytes of a binding (docs/index-memory.md#what-is-counted),
// besides its strings' bytes.
const (
	// bindingBytes: the binding record (sink, context, key copy, hashes),
	// its SharedRef, and its entry in the decoder's map (a key of three
	// strings and a tier, a pointer, the map's overhead).
	bindingBytes = 352
	// componentMapBytes: an SGLang binding's component set.
	componentMapBytes = 48
	// componentBytes: one component in it, besides the suffix's bytes.
	componentBytes = 40
)

// accounted is what b accounts for against the budget.
func (b *binding) accounted() int64 {
	n := bindingBytes + len(b.key.backend) + len(b.key.tenant) + len(b.key.identity) +
		len(b.ctx.Model) + len(b.ctx.Lora) + len(b.fullHash) + len(b.group)
	if b.components != nil {
		n += componentMapBytes
		for c := range b.components {
			n += componentBytes + len(c)
		}
	}
	return int64(n)
}

// bind records b under bk and takes its shared reference. A table dropped
// since the lookup refuses a reference of group 0, and the binding is not
// kept. A KV-cache group other than 0 is a plain shared count of that group
// (docs/hybrid.md#mooncake), charged to the stripe like the group words
// (docs/index-memory.md): its binding is kept either way, as its release
// is a no-op on a dropped table.
func (d *mooncakeDecoder) bind(bk bindingKey, b *binding) {
	b.key = bk
	b.ref.Init(b, bk.tier, b.vgroup, b.prefix, b.accounted(), &d.orphans)
	if b.sink.Acquire(&b.ref) || b.vgroup != 0 {
		d.bindings[bk] = b
	}
}

// dropOrphans forgets the bindings whose references the index evicted
// (or whose table it dropped) since the last call: their blocks are gone,
// so a later removal of them is a no-op, as for an object never seen.
func (d *mooncakeDecoder) dropOrphans() {
	for _, r := range d.orphans.Drain() {
		b, _ := r.Owner.(*binding)
		if b == nil {
			continue
		}
		if cur, ok := d.bindings[b.key]; ok && cur == b {
			delete(d.bindings, b.key)
		}
	}
}

// mooncakeDecoder decodes master batches and keeps the source's bindings.
type mooncakeDecoder struct {
	batch
	profile  hashing.Profile
	proj     hashing.Projection
	sglang   bool
	ownCtx   index.ContextKey
	lookup   LookupFunc
	log      zerolog.Logger
	events   []mcEvent
	bindings map[bindingKey]*binding
	// orphans receives the bindings' references the index evicted.
	orphans index.Orphans
	mapEv   mooncakeMapEvent // the event under decoding, reused
	// std: the registration's profile is the standard hash (rfc1527),
	// whose keys the events name in seq_hashes (mooncake_std.go); seqs
	// holds this batch's seq_hashes then.
	std  bool
	seqs []uint64
	one  [1]uint64 // the key an object key names, without an arena
	// resolved are the contexts this batch's stored events named, each
	// looked up once per batch (resolve).
	resolved []resolvedContext
}

func newMooncake(cfg Config) *mooncakeDecoder {
	p := cfg.Profile
	return &mooncakeDecoder{
		profile:  p,
		proj:     p.Projection(),
		sglang:   p.Strategy == hashing.StrategySGLang || p.Strategy == hashing.StrategySGLangBigram,
		std:      p.IsStandard(),
		ownCtx:   cfg.Context,
		lookup:   cfg.Lookup,
		log:      cfg.Logger,
		events:   make([]mcEvent, 0, 64),
		bindings: make(map[bindingKey]*binding),
	}
}

func (d *mooncakeDecoder) beginBatch() {
	d.events = d.events[:0]
	d.seqs = d.seqs[:0]
	d.forgetResolved()
}

// Decode implements Decoder.
func (d *mooncakeDecoder) Decode(payload []byte) Reason {
	return d.decode(sourcetype.Mooncake, payload, d)
}

// Forget implements Decoder.
func (d *mooncakeDecoder) Forget() {
	d.r.Reset(nil)
	clear(d.events[:cap(d.events)])
	d.events = d.events[:0]
}

// mooncakeMapEvent adapts a master event under decoding to walkEventMap.
type mooncakeMapEvent struct {
	d *mooncakeDecoder
	e *mcEvent
}

func (m *mooncakeMapEvent) fieldID(key []byte) (uint8, bool) {
	return mooncakeFields.lookup(key)
}
func (m *mooncakeMapEvent) seenMask() *uint32 { return &m.e.seen }
func (m *mooncakeMapEvent) failed() bool      { return m.e.result == Rejected }
func (m *mooncakeMapEvent) fail(r Reason)     { m.e.fail(r) }
func (m *mooncakeMapEvent) readField(r *msgp.Reader, id uint8) error {
	return m.d.readField(r, id, m.e)
}

func (d *mooncakeDecoder) readEvent(r *msgp.Reader, env *envelope, _ int) error {
	d.events = append(d.events, mcEvent{})
	e := &d.events[len(d.events)-1]
	d.mapEv = mooncakeMapEvent{d: d, e: e}
	if err := readEventMap(r, &d.mapEv); err != nil {
		return err
	}
	if e.result != Rejected {
		d.validate(e, env)
	}
	return nil
}

func (d *mooncakeDecoder) readField(r *msgp.Reader, id uint8, e *mcEvent) error {
	k, err := r.Peek()
	if err != nil {
		return err
	}
	if k != msgp.Nil {
		e.nonNil |= 1 << id
	}
	if spec := &mooncakeFields.specs[id]; spec.shape != shapeOwn {
		return readShaped(r, spec, &e.v, e, false)
	}
	switch id {
	case mDPRank:
		v, present, ok, err := optInt(r)
		if err != nil {
			return err
		}
		// nil is the released master's: the registration's dp_rank
		// stands for it (docs/events.md#registration-context)
		if !ok || (present && v < 0) {
			e.fail(EvDPRank)
		}
		return nil
	case mSeqHashes, mBlockHashes:
		if k != msgp.Array {
			e.fail(EvWrongType)
			return r.Skip()
		}
		n, err := r.ArrayLen()
		if err != nil {
			return err
		}
		var first uint64
		if id == mSeqHashes {
			e.seqOff = len(d.seqs)
		}
		for i := 0; i < n; i++ {
			k, err := r.Peek()
			if err != nil {
				return err
			}
			if k != msgp.Int {
				e.fail(EvWrongType)
				if err := r.Skip(); err != nil {
					return err
				}
				continue
			}
			u, neg, err := r.Integer()
			if err != nil {
				return err
			}
			// A negative value is kept as its two's complement bits:
			// the released master packs the legacy block_hashes alias
			// as the int64 of the unsigned hash
			// (docs/events.md#mooncake-hash-fields).
			if neg && id == mSeqHashes {
				e.fail(EvSeqHashes)
			}
			if i == 0 {
				first = u
			}
			if d.std && id == mSeqHashes {
				d.seqs = append(d.seqs, u)
			}
		}
		if id == mSeqHashes {
			e.seqN, e.seq0 = n, first
		} else {
			e.blkN, e.blk0 = n, first
		}
		return nil
	}
	return r.Skip()
}

// validate applies the structural rules that need no index state.
func (d *mooncakeDecoder) validate(e *mcEvent, env *envelope) {
	if !e.has(mEventType) {
		e.fail(EvMissingKey)
		return
	}
	switch string(e.v.strs[mcEventType]) {
	case "stored":
		e.kind = evStored
	case "removed":
		e.kind = evRemoved
	case "cleared":
		e.kind = evCleared
	default:
		e.fail(EvUnknownTag)
		return
	}
	if e.hasVal(mType) {
		want := [...]string{evStored: "BlockStored", evRemoved: "BlockRemoved", evCleared: "AllBlocksCleared"}[e.kind]
		if string(e.v.strs[mcTag]) != want {
			e.fail(EvTypeConflict)
			return
		}
	}
	required := uint32(mcCommonRequired)
	switch e.kind {
	case evStored:
		required = mcStoredRequired
	case evRemoved:
		required |= mcObjectRequired
		if e.seen&mcStoredOnly != 0 {
			e.fail(EvForeignKey)
			return
		}
	case evCleared:
		if e.seen&mcObjectFields != 0 {
			e.fail(EvForeignKey)
			return
		}
	}
	if e.seen&required != required {
		e.fail(EvMissingKey)
		return
	}
	if !e.hasVal(mTenantID) && !e.unstamped() {
		e.fail(EvWrongType) // a stamping publisher always names the tenant
		return
	}
	if e.v.uints[mcTimestamp] != env.tsInt {
		e.fail(EvTimestamp)
		return
	}
	// Legacy aliases must agree with the RFC fields they duplicate.
	if e.has(mBlockHashes) && (e.blkN != e.seqN || e.blk0 != e.seq0) {
		e.fail(EvSeqHashes)
		return
	}
	if e.has(mParentBlockHash) && (e.hasVal(mParentBlockHash) != e.hasVal(mParentHash) || e.v.uints[mcParentBlk] != e.v.uints[mcParent]) {
		e.fail(EvSeqHashes)
		return
	}
	if d.std {
		if !d.stdChain(e) {
			e.fail(EvSeqHashes)
			return
		}
	} else if e.seqN > 1 {
		e.fail(EvSeqHashes)
		return
	}
	e.result = Applied
}

// sharedTier runs the checks a store and a removal share: the medium names
// a shared tier (else the event is ignored), and the backend and object key
// are present (else it is rejected). ok is false when the event is settled.
func (e *mcEvent) sharedTier(std bool) (index.Tier, bool) {
	tier, ok := mooncakeTier(e.v.strs[mcMedium])
	switch {
	case !ok:
		e.result, e.reason = Ignored, IgnMedium
	case len(e.v.strs[mcBackend]) == 0:
		e.fail(EvBackend)
	case !e.has(mObjectKey) && !(std && e.seqN > 0):
		// A standard stream's seq_hashes name its blocks without a key.
		e.fail(EvObjectKey)
	default:
		return tier, true
	}
	return 0, false
}

// mooncakeTier maps a master medium to its shared tier
// (docs/events.md#medium-to-tier): host memory is the shared CPU tier, disk
// the disk tier; any other medium is not one the index keeps.
func mooncakeTier(m []byte) (index.Tier, bool) {
	switch {
	case bytes.EqualFold(m, []byte("cpu")), bytes.EqualFold(m, []byte("cpu_pinned")):
		return index.CPUShare, true
	case bytes.EqualFold(m, []byte("disk")):
		return index.Disk, true
	}
	return 0, false
}
