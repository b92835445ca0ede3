package events

import (
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Applying a master batch: each event against the binding table, with the
// batch's contexts resolved once (docs/events.md#bindings).

// resolvedContext is one context's lookup for the batch under way: its
// table, or ok=false when no engine registration with the source's
// profile binds it.
type resolvedContext struct {
	ctx  index.ContextKey
	sink SharedSink
	ok   bool
}

// forgetResolved drops the batch's resolved contexts and their tables'
// references.
func (d *mooncakeDecoder) forgetResolved() {
	clear(d.resolved)
	d.resolved = d.resolved[:0]
}

// resolve finds the table of ctx for the batch under way: looked up in the
// catalogue, with the profile compared, by the first event that names it
// and remembered until the batch is applied. A batch names one context or a few
// (the released master's events all take the registration's own), so the
// search is a short scan. A registration that changes while the batch is
// applied is seen at the next batch, as if the change came after this one.
func (d *mooncakeDecoder) resolve(ctx index.ContextKey) (SharedSink, bool) {
	for i := range d.resolved {
		if r := &d.resolved[i]; r.ctx == ctx {
			return r.sink, r.ok
		}
	}
	var sink SharedSink
	ok := false
	if d.lookup != nil {
		var prof *hashing.Profile
		sink, prof, ok = d.lookup(ctx)
		ok = ok && sink != nil && prof != nil && *prof == d.profile
	}
	if !ok {
		sink = nil
	}
	d.resolved = append(d.resolved, resolvedContext{ctx: ctx, sink: sink, ok: ok})
	return sink, ok
}

// Apply implements Decoder: the batch's events go in order against the
// binding table.
func (d *mooncakeDecoder) Apply() int {
	d.dropOrphans()
	// The tables resolved for this batch are not held past it: a context
	// dropped meanwhile frees its table at once.
	defer d.forgetResolved()
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
	return len(d.events)
}

// Outcome implements Decoder.
func (d *mooncakeDecoder) Outcome(i int) (Result, Reason) {
	return d.events[i].result, d.events[i].reason
}

// objectIdentity resolves the key's identity, component and block hash under
// the registered profile (docs/events.md#object-keys, docs/events.md#bindings).
func (d *mooncakeDecoder) objectIdentity(e *mcEvent) (identity, component, fullHash string, prefix uint64, ok bool) {
	key := string(e.v.strs[mcObjectKey])
	if d.sglang {
		logical, comp, h, ok := parseSGLangKey(key)
		if !ok {
			return "", "", "", 0, false
		}
		fullHash = normalizeHex(h)
		if e.has(mConnectorBlockHash) && normalizeHex(string(e.v.strs[mcConnector])) != fullHash {
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
		// the dev/conductor publisher parsed the key itself
		// (docs/events.md#mooncake-hash-fields)
		h = string(e.v.strs[mcConnector])
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
	tier, ok := e.sharedTier(d.std)
	if !ok {
		return
	}
	ctx, ok := d.storedContext(e)
	if !ok {
		return
	}
	if d.sglang && ctx != d.ownCtx {
		e.fail(EvContext)
		return
	}
	sink, ok := d.resolve(ctx)
	if !ok {
		e.fail(EvContext)
		return
	}
	if d.std {
		d.applyStoredStd(e, tier, ctx, sink)
		return
	}
	identity, component, fullHash, prefix, ok := d.objectIdentity(e)
	if !ok {
		e.fail(EvObjectKey)
		return
	}
	group, vgroup := string(e.v.strs[mcGroup]), 0
	if !d.sglang {
		// vllm_v1: the object's KV-cache group (docs/hybrid.md#mooncake)
		if vgroup, ok = vllmObjectGroup(group, string(e.v.strs[mcObjectKey])); !ok {
			e.fail(EvGroup)
			return
		}
		group = groupName(vgroup)
	}
	if e.seqN == 1 && e.seq0 != prefix {
		e.fail(EvSeqHashes)
		return
	}
	bk := bindingKey{backend: string(e.v.strs[mcBackend]), tenant: ctx.Tenant, identity: identity, tier: tier}
	if b, exists := d.bindings[bk]; exists && !b.ref.Gone() {
		if b.ctx != ctx || b.prefix != prefix || b.fullHash != fullHash || b.group != group {
			e.fail(EvConflict)
			return
		}
		if _, has := b.components[component]; d.sglang && !has {
			b.components[component] = struct{}{}
			b.sink.Adjust(&b.ref, int64(componentBytes+len(component)))
		}
		return // idempotent re-store
	}
	// new, or evicted by the index: the store binds it afresh
	b := &binding{sink: sink, ctx: ctx, prefix: prefix, fullHash: fullHash, group: group, vgroup: vgroup}
	if d.sglang {
		b.components = map[string]struct{}{component: {}}
	}
	d.bind(bk, b)
}

// applyRemoved drops the object's binding in the event's tier. The
// released master (an unstamped event) reports an object's removal once,
// when its last replica is gone, under a medium it derives from what is
// left (mostly "cpu", whatever the object was stored on): its removal
// drops the object's bindings in both shared tiers
// (docs/events.md#released-master-removals).
func (d *mooncakeDecoder) applyRemoved(e *mcEvent) {
	tier, ok := e.sharedTier(d.std)
	if !ok {
		return
	}
	if d.std {
		d.applyRemovedStd(e, tier)
		return
	}
	vgroup := 0
	if !d.sglang {
		if vgroup, ok = vllmObjectGroup(string(e.v.strs[mcGroup]), string(e.v.strs[mcObjectKey])); !ok {
			e.fail(EvGroup)
			return
		}
	}
	identity, component := string(e.v.strs[mcObjectKey]), ""
	if d.sglang {
		logical, comp, _, ok := parseSGLangKey(identity)
		if !ok {
			e.fail(EvObjectKey)
			return
		}
		identity, component = logical, comp
	}
	tiers := [2]index.Tier{tier}
	nt := 1
	if e.unstamped() {
		tiers, nt = [2]index.Tier{index.CPUShare, index.Disk}, 2
	}
	var keys [2]bindingKey
	var found [2]*binding
	n := 0
	backend, tenant := string(e.v.strs[mcBackend]), d.tenantID(e)
	for _, t := range tiers[:nt] {
		bk := bindingKey{backend: backend, tenant: tenant, identity: identity, tier: t}
		b, exists := d.bindings[bk]
		if !exists || b.ref.Gone() {
			continue // an evicted binding is as good as never seen
		}
		if d.sglang {
			if _, has := b.components[component]; !has {
				continue
			}
		}
		keys[n], found[n] = bk, b
		n++
	}
	if n == 0 {
		e.result, e.reason = NoOp, NoBinding
		return
	}
	for _, b := range found[:n] {
		if !d.removalAgrees(e, b, vgroup) {
			e.fail(EvAssertion)
			return
		}
	}
	for i, b := range found[:n] {
		if d.sglang {
			delete(b.components, component)
			if len(b.components) > 0 {
				b.sink.Adjust(&b.ref, -int64(componentBytes+len(component)))
				continue // other parts of the block are still stored
			}
		}
		delete(d.bindings, keys[i])
		b.release()
	}
}

// removalAgrees checks a removal's own context and hash fields, which are
// assertions about the binding it drops (vgroup is its vllm_v1 KV-cache
// group, docs/hybrid.md#mooncake). A nil field asserts nothing,
// except a stamping publisher's nil lora_name, which states "no adapter".
func (d *mooncakeDecoder) removalAgrees(e *mcEvent, b *binding, vgroup int) bool {
	lora := string(e.v.strs[mcLora])
	if e.unstamped() && !e.hasVal(mLoraName) {
		lora = b.ctx.Lora
	}
	return !((e.hasVal(mModelName) && string(e.v.strs[mcModel]) != b.ctx.Model) ||
		lora != b.ctx.Lora ||
		(e.hasVal(mBlockSize) && e.v.ints[mcBlockSize] != int64(b.ctx.BlockSize)) ||
		(d.sglang && string(e.v.strs[mcGroup]) != b.group) ||
		(!d.sglang && vgroup != b.vgroup) ||
		(e.has(mConnectorBlockHash) && normalizeHex(string(e.v.strs[mcConnector])) != b.fullHash) ||
		(e.seqN == 1 && e.seq0 != b.prefix))
}

func (d *mooncakeDecoder) applyCleared(e *mcEvent) {
	if len(e.v.strs[mcBackend]) == 0 {
		e.fail(EvBackend)
		return
	}
	backend, tenant := string(e.v.strs[mcBackend]), d.tenantID(e)
	for k, b := range d.bindings {
		if k.backend == backend && k.tenant == tenant {
			delete(d.bindings, k)
			b.release()
		}
	}
}

// Retract implements Decoder: every binding of the source is released
// (stale or stopped, docs/events.md#retraction).
func (d *mooncakeDecoder) Retract() {
	for _, b := range d.bindings {
		b.release()
	}
	clear(d.bindings)
	d.orphans.Drain()
}
