package subscriber

import (
	"bytes"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"math"

	"github.com/mooncake-conductor-go/conductor/hashing"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/rs/zerolog"
)

// Mooncake master event keys (§4.3, §4.4, §4.6).
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
	mUnknown = 0xff
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

func mooncakeField(key []byte) uint8 {
	switch string(key) {
	case "event_id":
		return mEventID
	case "timestamp":
		return mTimestamp
	case "event_type":
		return mEventType
	case "type":
		return mType
	case "model_name":
		return mModelName
	case "block_size":
		return mBlockSize
	case "additional_salt":
		return mAdditionalSalt
	case "lora_name":
		return mLoraName
	case "tenant_id":
		return mTenantID
	case "backend_id":
		return mBackendID
	case "medium":
		return mMedium
	case "dp_rank":
		return mDPRank
	case "group_id":
		return mGroupID
	case "object_key":
		return mObjectKey
	case "seq_hashes":
		return mSeqHashes
	case "block_hashes":
		return mBlockHashes
	case "base_block_idx":
		return mBaseBlockIdx
	case "parent_hash":
		return mParentHash
	case "token_ids":
		return mTokenIDs
	case "parent_block_hash":
		return mParentBlockHash
	case "connector_block_hash":
		return mConnectorBlockHash
	case "cache_prefix":
		return mCachePrefix
	case "tp_rank":
		return mTPRank
	case "head_or_tp_rank":
		return mHeadOrTPRank
	case "pcp_rank":
		return mPCPRank
	case "dcp_rank":
		return mDCPRank
	case "pp_rank":
		return mPPRank
	case "layer_id":
		return mLayerID
	}
	return mUnknown
}

// mcEvent is one decoded master event waiting to be applied. Its byte
// slices alias the payload, which outlives the apply step.
type mcEvent struct {
	kind   evKind
	result Result
	reason Reason
	seen   uint32
	nonNil uint32

	timestamp  uint64
	eventType  []byte
	tag        []byte
	model      []byte
	blockSize  int64
	lora       []byte
	tenant     []byte
	backend    []byte
	medium     []byte
	group      []byte
	objectKey  []byte
	connector  []byte
	seqN, blkN int
	seq0, blk0 uint64
	parent     uint64
	parentBlk  uint64
}

func (e *mcEvent) fail(r Reason) {
	if e.result != Rejected {
		e.result, e.reason = Rejected, r
	}
}

func (e *mcEvent) has(f uint8) bool    { return e.seen&(1<<f) != 0 }
func (e *mcEvent) hasVal(f uint8) bool { return e.nonNil&(1<<f) != 0 }
func (e *mcEvent) tenantID() string {
	// The master normalizes an empty tenant to "default"; so does the
	// contract ("Empty or omitted means default").
	if len(e.tenant) == 0 {
		return "default"
	}
	return string(e.tenant)
}

// bindingKey identifies one shared owner (§4.8): the endpoint is implicit
// (one table per source).
type bindingKey struct {
	backend  string
	tenant   string
	identity string // full object_key (vLLM) or logical key (SGLang)
	tier     index.Tier
}

// binding is one object (or SGLang logical page) the master reported in a
// tier; it holds exactly one shared reference on its prefix.
type binding struct {
	sink       SharedSink
	ctx        index.ContextKey
	prefix     uint64
	fullHash   string
	group      string
	components map[string]struct{} // SGLang: component suffixes present
}

// mooncakeDecoder decodes master batches and keeps the source's bindings.
type mooncakeDecoder struct {
	profile  hashing.Profile
	proj     hashing.Projection
	sglang   bool
	ownCtx   index.ContextKey
	lookup   LookupFunc
	log      zerolog.Logger
	events   []mcEvent
	bindings map[bindingKey]*binding
	mapEv    mooncakeMapEvent // the event under decoding, reused
}

func newMooncakeDecoder(cfg *Config) *mooncakeDecoder {
	p := cfg.Profile
	return &mooncakeDecoder{
		profile:  p,
		proj:     p.Projection(),
		sglang:   p.Strategy != hashing.StrategyVLLMV1,
		ownCtx:   cfg.Context,
		lookup:   cfg.Lookup,
		log:      cfg.Logger,
		events:   make([]mcEvent, 0, 64),
		bindings: make(map[bindingKey]*binding),
	}
}

func (d *mooncakeDecoder) beginBatch() { d.events = d.events[:0] }

// mooncakeMapEvent adapts a master event under decoding to walkEventMap.
type mooncakeMapEvent struct {
	d *mooncakeDecoder
	e *mcEvent
}

func (m *mooncakeMapEvent) fieldID(key []byte) (uint8, bool) {
	id := mooncakeField(key)
	return id, id != mUnknown
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
	switch id {
	case mEventID, mTimestamp, mParentHash, mParentBlockHash:
		// uint64 (nil allowed for the parent hashes only)
		if k == msgp.Nil && (id == mParentHash || id == mParentBlockHash) {
			return r.Nil()
		}
		if k != msgp.Int {
			e.fail(EvWrongType)
			return r.Skip()
		}
		u, neg, err := r.Integer()
		if err != nil {
			return err
		}
		if neg {
			e.fail(EvWrongType)
		}
		switch id {
		case mTimestamp:
			e.timestamp = u
		case mParentHash:
			e.parent = u
		case mParentBlockHash:
			e.parentBlk = u
		}
		return nil
	case mEventType, mTenantID, mBackendID, mObjectKey, mConnectorBlockHash, mCachePrefix:
		// str, non-nil
		if k != msgp.Str {
			e.fail(EvWrongType)
			return r.Skip()
		}
		b, err := r.Str()
		if err != nil {
			return err
		}
		switch id {
		case mEventType:
			e.eventType = b
		case mTenantID:
			e.tenant = b
		case mBackendID:
			e.backend = b
		case mObjectKey:
			e.objectKey = b
		case mConnectorBlockHash:
			e.connector = b
		}
		return nil
	case mType, mModelName, mAdditionalSalt, mLoraName, mMedium, mGroupID:
		b, _, ok, err := optStr(r)
		if err != nil {
			return err
		}
		if !ok {
			e.fail(EvWrongType)
		}
		switch id {
		case mType:
			e.tag = b
		case mModelName:
			e.model = b
		case mLoraName:
			e.lora = b
		case mMedium:
			e.medium = b
		case mGroupID:
			e.group = b
		}
		return nil
	case mDPRank:
		v, present, ok, err := optInt(r)
		if err != nil {
			return err
		}
		if !ok || !present || v < 0 {
			// the v0.3.12 master sent nil here; unsupported (§4.11)
			e.fail(EvDPRank)
		}
		return nil
	case mBlockSize, mBaseBlockIdx, mTPRank, mHeadOrTPRank, mPCPRank, mDCPRank, mPPRank, mLayerID:
		v, _, ok, err := optInt(r)
		if err != nil {
			return err
		}
		if !ok {
			e.fail(EvWrongType)
		}
		if id == mBlockSize {
			e.blockSize = v
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
			if neg {
				e.fail(EvSeqHashes)
			}
			if i == 0 {
				first = u
			}
		}
		if id == mSeqHashes {
			e.seqN, e.seq0 = n, first
		} else {
			e.blkN, e.blk0 = n, first
		}
		return nil
	case mTokenIDs:
		if k == msgp.Nil {
			return r.Nil()
		}
		if k != msgp.Array {
			e.fail(EvWrongType)
			return r.Skip()
		}
		return readTokenArray(r, false, e)
	}
	return r.Skip()
}

// validate applies the structural rules that need no index state.
func (d *mooncakeDecoder) validate(e *mcEvent, env *envelope) {
	if !e.has(mEventType) {
		e.fail(EvMissingKey)
		return
	}
	switch string(e.eventType) {
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
		if string(e.tag) != want {
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
	if e.timestamp != env.tsInt {
		e.fail(EvTimestamp)
		return
	}
	// Legacy aliases must agree with the RFC fields they duplicate.
	if e.has(mBlockHashes) && (e.blkN != e.seqN || e.blk0 != e.seq0) {
		e.fail(EvSeqHashes)
		return
	}
	if e.has(mParentBlockHash) && (e.hasVal(mParentBlockHash) != e.hasVal(mParentHash) || e.parentBlk != e.parent) {
		e.fail(EvSeqHashes)
		return
	}
	if e.seqN > 1 {
		e.fail(EvSeqHashes)
		return
	}
	e.result = Applied
}

// mooncakeTier maps a master medium to its shared tier (§3.7).
// sharedTier runs the checks a store and a removal share: the medium names
// a shared tier (else the event is ignored), and the backend and object key
// are present (else it is rejected). ok is false when the event is settled.
func (e *mcEvent) sharedTier() (index.Tier, bool) {
	tier, ok := mooncakeTier(e.medium)
	switch {
	case !ok:
		e.result, e.reason = Ignored, IgnMedium
	case len(e.backend) == 0:
		e.fail(EvBackend)
	case !e.has(mObjectKey):
		e.fail(EvObjectKey)
	default:
		return tier, true
	}
	return 0, false
}

func mooncakeTier(m []byte) (index.Tier, bool) {
	switch {
	case bytes.EqualFold(m, []byte("cpu")), bytes.EqualFold(m, []byte("cpu_pinned")):
		return index.CPUShare, true
	case bytes.EqualFold(m, []byte("disk")):
		return index.Disk, true
	}
	return 0, false
}

// apply dispatches the batch's events in order against the binding table.
func (d *mooncakeDecoder) apply() {
	for i := range d.events {
		e := &d.events[i]
		if e.result != Applied {
			continue
		}
		switch e.kind {
		case evStored:
			d.applyStored(e)
		case evRemoved:
			d.applyRemoved(e)
		case evCleared:
			d.applyCleared(e)
		}
	}
}

// objectIdentity resolves the key's identity, component and block hash under
// the registered profile (§4.7, §4.8).
func (d *mooncakeDecoder) objectIdentity(e *mcEvent) (identity, component, fullHash string, prefix uint64, ok bool) {
	key := string(e.objectKey)
	if d.sglang {
		logical, comp, h, ok := parseSGLangKey(key)
		if !ok {
			return "", "", "", 0, false
		}
		fullHash = normalizeHex(h)
		if e.has(mConnectorBlockHash) && normalizeHex(string(e.connector)) != fullHash {
			return "", "", "", 0, false
		}
		p, err := hashing.KeyFromHex(d.proj, fullHash)
		if err != nil {
			return "", "", "", 0, false
		}
		return logical, comp, fullHash, p, true
	}
	var h string
	if e.has(mConnectorBlockHash) {
		// the dev/conductor publisher parsed the key itself (§4.6)
		h = string(e.connector)
		if !isHashHex(h) {
			return "", "", "", 0, false
		}
	} else {
		var ok bool
		if h, ok = parseVLLMKey(key); !ok {
			return "", "", "", 0, false
		}
	}
	fullHash = normalizeHex(h)
	p, err := hashing.KeyFromHex(d.proj, fullHash)
	if err != nil {
		return "", "", "", 0, false
	}
	return key, "", fullHash, p, true
}

func (d *mooncakeDecoder) applyStored(e *mcEvent) {
	tier, ok := e.sharedTier()
	if !ok {
		return
	}
	if e.blockSize <= 0 || e.blockSize > math.MaxInt32 {
		e.fail(EvBlockSize)
		return
	}
	if len(e.model) == 0 {
		e.fail(EvContext)
		return
	}
	ctx := index.ContextKey{Tenant: e.tenantID(), Model: string(e.model), Lora: string(e.lora), BlockSize: int(e.blockSize)}
	if d.sglang && ctx != d.ownCtx {
		e.fail(EvContext)
		return
	}
	if d.lookup == nil {
		e.fail(EvContext)
		return
	}
	sink, prof, ok := d.lookup(ctx)
	if !ok || sink == nil || prof == nil || *prof != d.profile {
		e.fail(EvContext)
		return
	}
	identity, component, fullHash, prefix, ok := d.objectIdentity(e)
	if !ok {
		e.fail(EvObjectKey)
		return
	}
	group := string(e.group)
	if !d.sglang {
		// vllm_v1 indexes cache group 0 only (§4.10)
		if group != "" && group != "0" {
			e.fail(EvGroup)
			return
		}
		group = ""
	}
	if e.seqN == 1 && e.seq0 != prefix {
		e.fail(EvSeqHashes)
		return
	}
	bk := bindingKey{backend: string(e.backend), tenant: ctx.Tenant, identity: identity, tier: tier}
	if b, exists := d.bindings[bk]; exists {
		if b.ctx != ctx || b.prefix != prefix || b.fullHash != fullHash || b.group != group {
			e.fail(EvConflict)
			return
		}
		if d.sglang {
			b.components[component] = struct{}{}
		}
		return // idempotent re-store
	}
	b := &binding{sink: sink, ctx: ctx, prefix: prefix, fullHash: fullHash, group: group}
	if d.sglang {
		b.components = map[string]struct{}{component: {}}
	}
	d.bindings[bk] = b
	sink.AcquireShared(tier, prefix)
}

func (d *mooncakeDecoder) applyRemoved(e *mcEvent) {
	tier, ok := e.sharedTier()
	if !ok {
		return
	}
	if !d.sglang && len(e.group) != 0 && string(e.group) != "0" {
		e.fail(EvGroup) // vllm_v1 indexes cache group 0 only (§4.10)
		return
	}
	identity, component := string(e.objectKey), ""
	if d.sglang {
		logical, comp, _, ok := parseSGLangKey(identity)
		if !ok {
			e.fail(EvObjectKey)
			return
		}
		identity, component = logical, comp
	}
	bk := bindingKey{backend: string(e.backend), tenant: e.tenantID(), identity: identity, tier: tier}
	b, exists := d.bindings[bk]
	if !exists {
		e.result, e.reason = NoOp, NoBinding
		return
	}
	// The event's own context fields are assertions about the binding.
	if (e.hasVal(mModelName) && string(e.model) != b.ctx.Model) ||
		string(e.lora) != b.ctx.Lora ||
		(e.hasVal(mBlockSize) && e.blockSize != int64(b.ctx.BlockSize)) ||
		(d.sglang && string(e.group) != b.group) ||
		(e.has(mConnectorBlockHash) && normalizeHex(string(e.connector)) != b.fullHash) ||
		(e.seqN == 1 && e.seq0 != b.prefix) {
		e.fail(EvAssertion)
		return
	}
	if d.sglang {
		if _, ok := b.components[component]; !ok {
			e.result, e.reason = NoOp, NoBinding
			return
		}
		delete(b.components, component)
		if len(b.components) > 0 {
			return // other parts of the block are still stored
		}
	}
	delete(d.bindings, bk)
	b.sink.ReleaseShared(tier, b.prefix)
}

func (d *mooncakeDecoder) applyCleared(e *mcEvent) {
	if len(e.backend) == 0 {
		e.fail(EvBackend)
		return
	}
	backend, tenant := string(e.backend), e.tenantID()
	for k, b := range d.bindings {
		if k.backend == backend && k.tenant == tenant {
			delete(d.bindings, k)
			b.sink.ReleaseShared(k.tier, b.prefix)
		}
	}
}

// retract releases every binding of the source (stale or stopped, §5.2).
func (d *mooncakeDecoder) retract() {
	for k, b := range d.bindings {
		b.sink.ReleaseShared(k.tier, b.prefix)
	}
	clear(d.bindings)
}
