// Package contexts is the catalogue of registered contexts: each one's
// index table and the hash profile its services registered with, found
// without locks. The index keeps only which owners hold which keys; the
// profile, which says how a prompt's tokens become those keys, belongs to
// whoever registered the context (the registry, which writes the
// catalogue). Queries, the gRPC lookups, Mooncake's shared-tier events and
// snapshots read it.
package contexts

import (
	"iter"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Entry is one registered context. Neither field changes once the
// context is in the catalogue; callers must not modify them.
type Entry struct {
	// Table is the context's prefix index. After Drop it is dead: writes
	// are no-ops and queries answer empty.
	Table *index.Table
	// Profile is how the context's publishers hash token ids into keys.
	Profile hashing.Profile
}

// Catalogue maps each registered context to its Entry. Reading is
// lock-free and allocation-free (immutable maps behind an atomic pointer),
// because every query reads it; writes, rare (contexts come and go with
// registrations), build the next version under a mutex and publish it.
type Catalogue struct {
	ix *index.Index
	mu sync.Mutex // serialises Ensure and Drop
	v  atomic.Pointer[view]

	// engines holds the contexts with at least one engine registration
	// (SetEngines): Mooncake streams name a context per event and bind
	// only to those. Sources read it from their goroutines, rarely (once
	// per new binding), so a lock is enough.
	enginesMu sync.RWMutex
	engines   map[index.ContextKey]*Entry
}

// New returns an empty catalogue whose tables live in ix.
func New(ix *index.Index) *Catalogue { return &Catalogue{ix: ix} }

// Index is the index the catalogue's tables live in.
func (c *Catalogue) Index() *index.Index { return c.ix }

// view is one version of the catalogue: the contexts by key, and the same
// contexts filed by what the gRPC door's lookups name (a tenant, a model,
// a hash scheme), so a lookup finds its contexts with one map read instead
// of a scan of every context.
type view struct {
	byKey    map[index.ContextKey]*Entry
	byTenant map[string][]*Entry
	byModel  map[TenantModel][]*Entry
	byScheme map[SchemeKey][]*Entry
}

// TenantModel names one model of one tenant.
type TenantModel struct{ Tenant, Model string }

// SchemeKey is what a Conductor hash scheme names within a tenant and a
// model (docs/grpc.md#hash-schemes): the profile's strategy, algorithm and
// seed as the scheme spells it, and the block size. The contexts it files
// differ only by LoRA name.
type SchemeKey struct {
	Tenant, Model             string
	Strategy, Algorithm, Seed string
	BlockSize                 int
}

// SchemeSeeds are the seeds a scheme may spell profile p's with: a vLLM
// profile's PYTHONHASHSEED text, the standard hash's seed, and for SGLang
// strategies, which have no seed, "-" or the text they registered.
func SchemeSeeds(p *hashing.Profile) []string {
	switch p.Strategy {
	case hashing.StrategyVLLMV1:
		return []string{p.PythonHashSeed}
	case hashing.StrategyRFC1527:
		return []string{p.Seed}
	}
	if p.PythonHashSeed == "-" || p.PythonHashSeed == "" {
		return []string{"-"}
	}
	return []string{"-", p.PythonHashSeed}
}

// newView files the contexts of byKey.
func newView(byKey map[index.ContextKey]*Entry) *view {
	v := &view{byKey: byKey, byTenant: map[string][]*Entry{}, byModel: map[TenantModel][]*Entry{},
		byScheme: map[SchemeKey][]*Entry{}}
	for k, e := range byKey {
		v.byTenant[k.Tenant] = append(v.byTenant[k.Tenant], e)
		tm := TenantModel{k.Tenant, k.Model}
		v.byModel[tm] = append(v.byModel[tm], e)
		for _, seed := range SchemeSeeds(&e.Profile) {
			sk := SchemeKey{Tenant: k.Tenant, Model: k.Model, Strategy: e.Profile.Strategy,
				Algorithm: e.Profile.Algorithm, Seed: seed, BlockSize: k.BlockSize}
			v.byScheme[sk] = append(v.byScheme[sk], e)
		}
	}
	return v
}

func (c *Catalogue) load() map[index.ContextKey]*Entry {
	if v := c.v.Load(); v != nil {
		return v.byKey
	}
	return nil
}

// ByScheme returns the contexts the scheme k names (one per LoRA name), in
// no particular order; the slice is shared and must not be modified.
func (c *Catalogue) ByScheme(k SchemeKey) []*Entry {
	if v := c.v.Load(); v != nil {
		return v.byScheme[k]
	}
	return nil
}

// ByModel returns the contexts of one tenant's model, as ByScheme does.
func (c *Catalogue) ByModel(tenant, model string) []*Entry {
	if v := c.v.Load(); v != nil {
		return v.byModel[TenantModel{tenant, model}]
	}
	return nil
}

// ByTenant returns the contexts of one tenant, as ByScheme does.
func (c *Catalogue) ByTenant(tenant string) []*Entry {
	if v := c.v.Load(); v != nil {
		return v.byTenant[tenant]
	}
	return nil
}

// Get returns the context k names, or nil when no one registered it.
func (c *Catalogue) Get(k index.ContextKey) *Entry { return c.load()[k] }

// Ensure returns k's context, creating its table with profile p when k is
// new. The caller (the registry) guarantees every service of a context
// uses one profile, so an existing context's profile is not compared.
func (c *Catalogue) Ensure(k index.ContextKey, p hashing.Profile) *Entry {
	if e := c.Get(k); e != nil {
		return e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.load()
	if e := old[k]; e != nil {
		return e
	}
	e := &Entry{Table: c.ix.EnsureTable(k), Profile: p}
	m := make(map[index.ContextKey]*Entry, len(old)+1)
	maps.Copy(m, old)
	m[k] = e
	c.v.Store(newView(m))
	return e
}

// SetEngines records whether k's context has an engine registration (the
// registry calls it as its first engine comes and its last goes); k must
// be in the catalogue when has is true.
func (c *Catalogue) SetEngines(k index.ContextKey, has bool) {
	c.enginesMu.Lock()
	defer c.enginesMu.Unlock()
	if !has {
		delete(c.engines, k)
		return
	}
	if e := c.Get(k); e != nil {
		if c.engines == nil {
			c.engines = make(map[index.ContextKey]*Entry)
		}
		c.engines[k] = e
	}
}

// WithEngines returns k's context if it has an engine registration: what
// a Mooncake stream's event may bind to (docs/events.md).
func (c *Catalogue) WithEngines(k index.ContextKey) (*Entry, bool) {
	c.enginesMu.RLock()
	defer c.enginesMu.RUnlock()
	e, ok := c.engines[k]
	return e, ok
}

// Drop forgets k and drops its table. It leaves the catalogue first, so
// no one finds the context once its table is dead; a caller still holding
// the Entry sees a table that answers empty.
func (c *Catalogue) Drop(k index.ContextKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.load(); old[k] != nil {
		m := maps.Clone(old)
		delete(m, k)
		c.v.Store(newView(m))
	}
	c.ix.DropTable(k)
}

// All yields every context of one version of the catalogue, in no
// particular order and without allocating (a per-request scan).
func (c *Catalogue) All() iter.Seq[*Entry] {
	m := c.load()
	return func(yield func(*Entry) bool) {
		for _, e := range m {
			if !yield(e) {
				return
			}
		}
	}
}

// Len is the number of registered contexts.
func (c *Catalogue) Len() int { return len(c.load()) }
