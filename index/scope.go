package index

import (
	"cmp"
	"slices"
)

// ScopeKey names a producer-fed scope: blocks that gRPC producers reported
// (ReportCacheState) under one hash scheme. Its keys are only comparable
// within the scope, exactly like a context's, so a scope is a Table of its
// own; it lives in the same Index beside the Conductor contexts, with the
// same layout and memory per block, but in a separate map, because its
// identity (a free-form scheme string instead of a block size and a hash
// profile) is not a context's and the Conductor API must never see it.
type ScopeKey struct {
	Tenant  string
	Model   string
	Scheme  string
	Adapter string
}

// Scope returns the scope's table, or nil when nothing created it.
func (ix *Index) Scope(k ScopeKey) *Table {
	return ix.scopes.get(k)
}

// EnsureScope returns the scope's table, creating it empty.
func (ix *Index) EnsureScope(k ScopeKey) *Table {
	return ix.scopes.ensure(&ix.mu, k, func() *Table {
		t := newTable(ContextKey{Tenant: k.Tenant, Model: k.Model, Lora: k.Adapter}, ix.stripes)
		t.scope, t.scheme, t.ix = true, k.Scheme, ix
		ix.attach(t, EvictedScope)
		return t
	})
}

// DropScope forgets a scope and frees its memory; like DropTable, holders
// of the *Table see a dead table whose writes are no-ops.
func (ix *Index) DropScope(k ScopeKey) {
	if t := ix.scopes.remove(&ix.mu, k); t != nil {
		t.drop()
	}
}

// Scopes returns a snapshot of all producer-fed scopes sorted by (Tenant,
// Model, Scheme, Adapter).
func (ix *Index) Scopes() []*Table {
	m := ix.scopes.load()
	out := make([]*Table, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Table) int {
		x, y := a.ScopeKey(), b.ScopeKey()
		return cmp.Or(cmp.Compare(x.Tenant, y.Tenant), cmp.Compare(x.Model, y.Model),
			cmp.Compare(x.Scheme, y.Scheme), cmp.Compare(x.Adapter, y.Adapter))
	})
	return out
}

// ScopeKey returns the scope a producer-fed table indexes (zero for a
// Conductor context).
func (t *Table) ScopeKey() ScopeKey {
	if !t.scope {
		return ScopeKey{}
	}
	return ScopeKey{Tenant: t.ctx.Tenant, Model: t.ctx.Model, Scheme: t.scheme, Adapter: t.ctx.Lora}
}

// Has reports whether anyone holds key in any tier.
func (t *Table) Has(key uint64) bool {
	h := mix(key)
	s := t.stripeFor(h)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return !s.dead && s.find(key, h) >= 0
}

// EachKey calls fn with every key held in the table, one stripe at a time
// under its read lock, until fn returns false. It is for rare reads (a
// cache-state summary), not the query path.
func (t *Table) EachKey(fn func(key uint64) bool) {
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.RLock()
		for j := range s.blocks {
			b := &s.blocks[j]
			if b.first.own != 0 && !fn(b.key) {
				s.mu.RUnlock()
				return
			}
		}
		s.mu.RUnlock()
	}
}

// AppendInstances appends the registered instances' names, sorted and
// once each, to dst: what a caller needs to count or pick replicas without
// the per-rank map Instances builds.
func (t *Table) AppendInstances(dst []string) []string {
	for _, sp := range t.view.Load().insts {
		dst = append(dst, sp.name)
	}
	return dst
}

// OwnerCount is the number of registered engine owners.
func (t *Table) OwnerCount() int { return len(t.view.Load().owners) }
