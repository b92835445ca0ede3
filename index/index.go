package index

import (
	"iter"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options tunes an Index.
type Options struct {
	// Stripes is the number of independently locked shards per table,
	// rounded up to a power of two (default 64). More stripes mean less
	// contention between ingestion and queries, at the cost of a stripe's
	// fixed size per context (plus a reverse-list header per engine owner).
	Stripes int
	// RemovalPause, when positive, makes RemoveEngineOwner return as soon
	// as the owner is unpublished (queries stop reporting it at once) and
	// clear its entries in the background, in bursts of about reapBurst
	// with this pause after each (see reaper). Zero clears synchronously.
	// The service uses it; Close must then be called to stop the worker.
	RemovalPause time.Duration
	// MemoryLimit, when positive, bounds the index's accounted memory in
	// bytes: at the limit the least recently stored entries are evicted
	// in the background (budget.go, evict.go; docs/index-memory.md). Zero
	// is unbounded. Close must then be called to stop the evictor.
	MemoryLimit int64
}

// DefaultStripes is used when Options.Stripes is not positive.
const DefaultStripes = 64

// Index holds one Table per context. Looking a table up is lock-free (a
// copy-on-write map) because every query and every event does it, while
// contexts come and go only on registration.
type Index struct {
	stripes int
	mu      sync.Mutex // serialises writers of tables and scopes
	tables  cowMap[ContextKey, *Table]
	reap    reaper

	// cutMu is held from BeginCut to Finish: one cut at a time.
	cutMu    sync.Mutex
	cutEpoch uint64 // under cutMu; stripes compare their cutEpoch to it
	// scopes are the producer-fed scopes (scope.go), beside the contexts.
	scopes cowMap[ScopeKey, *Table]
	// watch, when set, sees every change (watch.go).
	watch atomic.Pointer[watcherBox]
	// bud accounts the memory and, when bounded, drives eviction.
	bud *budget
}

// New returns an empty index.
func New(opts Options) *Index {
	n := opts.Stripes
	if n <= 0 {
		n = DefaultStripes
	}
	ix := &Index{stripes: n, bud: newBudget(opts.MemoryLimit)}
	ix.reap.pause = opts.RemovalPause
	if ix.bud.bounded() {
		go ix.runEvictor()
	}
	return ix
}

// Table returns the context's table, or nil when the context is unknown
// (a query for it then answers with empty instances).
func (ix *Index) Table(ctx ContextKey) *Table {
	return ix.tables.get(ctx)
}

// EnsureTable returns the context's table, creating it empty. The table
// knows no hash profile: whoever registered the context keeps it beside
// the table (internal/contexts).
func (ix *Index) EnsureTable(ctx ContextKey) *Table {
	return ix.tables.ensure(&ix.mu, ctx, func() *Table {
		t := newTable(ctx, ix.stripes)
		t.ix = ix
		ix.attach(t, EvictedContext)
		if ix.reap.pause > 0 {
			t.reap = &ix.reap
		}
		return t
	})
}

// DropTable forgets a context and frees its memory. Goroutines still holding
// the *Table may keep calling it: writes become no-ops and queries answer
// empty, so a late event cannot bring a dropped context back. Callers
// serialise EnsureTable and DropTable of one context (the registry does);
// otherwise EnsureTable may hand out the table being dropped.
func (ix *Index) DropTable(ctx ContextKey) {
	if t := ix.tables.remove(&ix.mu, ctx); t != nil {
		t.drop()
	}
}

// All yields every table of a snapshot, in no particular order and
// without allocating: for per-request scans, where Tables' sorted copy
// would cost an allocation and a sort on every call.
func (ix *Index) All() iter.Seq[*Table] {
	m := ix.tables.load()
	return func(yield func(*Table) bool) {
		for _, t := range m {
			if !yield(t) {
				return
			}
		}
	}
}

// Tables returns a snapshot of all tables in ContextKey.Compare order.
func (ix *Index) Tables() []*Table {
	m := ix.tables.load()
	out := make([]*Table, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b *Table) int { return a.ctx.Compare(b.ctx) })
	return out
}
