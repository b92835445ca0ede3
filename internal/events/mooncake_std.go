package events

import (
	"strconv"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// The Mooncake master and generic RFC #1527 streams under the standard
// hash (docs/events.md#standard-hash-streams): a block is named by its
// standard hash H, which the master puts in seq_hashes when the object key
// is a decimal or 0x u64 (its legacy block_hashes carries the same value
// as a signed int64, so seq_hashes is the one read), and which a generic
// stream sends for every block of a stored run (base_block_idx is the
// first block's position in the sequence, parent_hash the H before it).
// Every key is a pool block of its own: one binding per block, whose
// identity is H's decimal form, so a removal naming the object key or the
// hash finds it. A key that is no u64 is refused (object_key) and counted;
// it is a per-event rejection and never makes the source stale.

// stdChain checks a stored event's chain fields under the standard
// profile: base_block_idx, when given, is not negative, and parent_hash is
// given exactly when the run does not start the sequence.
func (d *mooncakeDecoder) stdChain(e *mcEvent) bool {
	if e.kind != evStored {
		return true
	}
	base := int64(0)
	if e.hasVal(mBaseBlockIdx) {
		base = e.v.ints[mcBaseIdx]
	}
	return base >= 0 && (base > 0) == e.hasVal(mParentHash)
}

// stdKeys returns the event's block keys: its seq_hashes, or the object
// key's value when the list is empty. ok is false, with the event
// rejected, when the object key is no u64 or does not name the one block
// the list does.
func (d *mooncakeDecoder) stdKeys(e *mcEvent) ([]uint64, bool) {
	keys := d.seqs[e.seqOff : e.seqOff+e.seqN]
	if !e.has(mObjectKey) {
		return keys, true
	}
	k, ok := parseStdKey(string(e.v.strs[mcObjectKey]))
	switch {
	case !ok:
		e.fail(EvObjectKey)
		return nil, false
	case len(keys) == 0:
		d.one[0] = k
		return d.one[:], true
	case len(keys) != 1 || keys[0] != k:
		e.fail(EvSeqHashes)
		return nil, false
	}
	return keys, true
}

func (d *mooncakeDecoder) applyStoredStd(e *mcEvent, tier index.Tier, ctx index.ContextKey, sink SharedSink) {
	keys, ok := d.stdKeys(e)
	if !ok {
		return
	}
	backend, group := string(e.v.strs[mcBackend]), string(e.v.strs[mcGroup])
	// All or nothing: a conflicting block rejects the whole event.
	for _, k := range keys {
		bk := bindingKey{backend: backend, tenant: ctx.Tenant, identity: stdIdentity(k), tier: tier}
		if b, exists := d.bindings[bk]; exists && !b.ref.Gone() && (b.ctx != ctx || b.group != group) {
			e.fail(EvConflict)
			return
		}
	}
	for _, k := range keys {
		bk := bindingKey{backend: backend, tenant: ctx.Tenant, identity: stdIdentity(k), tier: tier}
		if b, exists := d.bindings[bk]; exists && !b.ref.Gone() {
			continue // idempotent re-store
		}
		d.bind(bk, &binding{sink: sink, ctx: ctx, prefix: k, group: group})
	}
}

func (d *mooncakeDecoder) applyRemovedStd(e *mcEvent, tier index.Tier) {
	keys, ok := d.stdKeys(e)
	if !ok {
		return
	}
	tiers := [2]index.Tier{tier}
	nt := 1
	if e.unstamped() {
		tiers, nt = [2]index.Tier{index.CPUShare, index.Disk}, 2
	}
	backend, tenant := string(e.v.strs[mcBackend]), d.tenantID(e)
	var found []bindingKey
	for _, k := range keys {
		for _, t := range tiers[:nt] {
			bk := bindingKey{backend: backend, tenant: tenant, identity: stdIdentity(k), tier: t}
			b, exists := d.bindings[bk]
			if !exists || b.ref.Gone() {
				continue
			}
			if !d.removalAgrees(e, b, 0) || (e.hasVal(mGroupID) && string(e.v.strs[mcGroup]) != b.group) {
				e.fail(EvAssertion)
				return
			}
			found = append(found, bk)
		}
	}
	if len(found) == 0 {
		e.result, e.reason = NoOp, NoBinding
		return
	}
	for _, bk := range found {
		b := d.bindings[bk]
		delete(d.bindings, bk)
		b.release()
	}
}

// stdIdentity is a standard block's binding identity: H in decimal.
func stdIdentity(k uint64) string { return strconv.FormatUint(k, 10) }

// parseStdKey reads an object key that is a u64 as the master recognizes
// one: decimal digits, or 0x / 0X and 1 to 16 hex digits.
func parseStdKey(s string) (uint64, bool) {
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		if len(s) > 18 {
			return 0, false
		}
		v, err := strconv.ParseUint(s[2:], 16, 64)
		return v, err == nil && validHex(s[2:])
	}
	return hashing.ParseDecimalU64(s)
}

func validHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}
