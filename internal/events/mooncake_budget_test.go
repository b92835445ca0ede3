package events

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// Mooncake bindings against a bounded index
// (docs/index-memory.md#mooncake-bindings): here the decoder writes to a
// real index.Table, so its bindings are charged to the budget and evicted
// with their blocks.

// budgetTester is the master source pool-a-sub bound to vllm-a's context in
// an index bounded to limit bytes.
type budgetTester struct {
	*tester
	ix   *index.Index
	tb   *index.Table
	dec  *mooncakeDecoder
	proj hashing.Projection
}

func newBudgetTester(t *testing.T, limit int64) *budgetTester {
	t.Helper()
	m := eventtest.LoadManifest(t)
	reg := m.Registration(t, "pool-a-sub")
	tables := m.Profiles(t, []string{"vllm-a"})
	ix := index.New(index.Options{Stripes: 4, MemoryLimit: limit})
	t.Cleanup(ix.Close)
	var tb *index.Table
	for ctx := range tables {
		tb = ix.EnsureTable(ctx)
	}
	prof := eventtest.ResolveProfile(t, reg)
	dec, err := New(Config{Type: sourcetype.Mooncake, Profile: prof, Context: eventtest.ContextOf(reg), Owner: eventtest.Owner,
		Logger: eventtest.Logger(t), Lookup: func(ctx index.ContextKey) (SharedSink, *hashing.Profile, bool) {
			p, ok := tables[ctx]
			if !ok {
				return nil, nil, false
			}
			return tb, p, true
		}})
	if err != nil {
		t.Fatal(err)
	}
	x := &tester{reg: reg, dec: dec, outcomes: map[uint64][]Outcome{}}
	return &budgetTester{tester: x, ix: ix, tb: tb, dec: dec.(*mooncakeDecoder), proj: prof.Projection()}
}

// object is the n-th distinct object of hash h (n picks its TP rank, so
// objects of one h share a block).
func objectKey(h, n int) string {
	return fmt.Sprintf("m@tp_rank:%d@pcp0@dcp0@pp_rank:0@%064x", n, h)
}

func (x *budgetTester) key(t *testing.T, h int) uint64 {
	t.Helper()
	k, err := hashing.KeyFromHex(x.proj, fmt.Sprintf("%064x", h))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// live counts the decoder's bindings that still hold their reference and
// the bytes they account for.
func (x *budgetTester) live() (n int, bytes int64) {
	for _, b := range x.dec.bindings {
		if !b.ref.Gone() {
			n++
			bytes += b.accounted()
		}
	}
	return n, bytes
}

// TestMooncakeBindingFlood: a master announcing distinct objects without
// end, against a 2 MiB budget, never takes the index over it; bindings are
// evicted with their blocks and then forgotten by the decoder, so its table
// stays within what the budget holds; the most recent objects are all
// reported; and a removal of an evicted object is a no-op that leaves alone
// the holder a later object of the same block took.
func TestMooncakeBindingFlood(t *testing.T) {
	const limit = 2 << 20
	x := newBudgetTester(t, limit)
	seq := uint64(1)
	apply := func(evs ...any) {
		x.applyBatch(seq, mcBatch(t, evs...))
		seq++
	}
	apply(mcEventMap("stored", "cpu", objectKey(1, 0), nil)) // the first object, to be evicted
	const objects, batch = 40000, 50                         // the master's max_batch_size
	for h := 2; h < 2+objects; h += batch {
		evs := make([]any, 0, batch)
		for i := h; i < h+batch; i++ {
			evs = append(evs, mcEventMap("stored", "cpu", objectKey(i, 0), nil))
		}
		apply(evs...)
		if got := x.ix.MemoryBytes(); got > limit {
			t.Fatalf("after object %d the index accounts %d bytes, over the %d budget", h+batch-1, got, limit)
		}
		// Read the orphans after counting: eviction only adds to them.
		n, bytes := x.live()
		pending := x.dec.orphans.Len()
		if bytes > limit {
			t.Fatalf("after object %d live bindings account %d bytes, over the %d budget", h+batch-1, bytes, limit)
		}
		if len(x.dec.bindings) > n+pending {
			t.Fatalf("after object %d the decoder keeps %d bindings: %d live and %d evicted waiting to be forgotten", h+batch-1, len(x.dec.bindings), n, pending)
		}
	}
	if peak := x.ix.PeakMemoryBytes(); peak > limit {
		t.Fatalf("peak %d bytes over the %d budget", peak, limit)
	}
	if x.ix.Evictions(index.EvictedContext) == 0 {
		t.Fatal("no evictions counted")
	}
	n, bytes := x.live()
	t.Logf("%d objects, %d B budget: peak %d B accounted, %d blocks evicted, %d bindings live (%d B), %d kept by the decoder",
		objects, limit, x.ix.PeakMemoryBytes(), x.ix.Evictions(index.EvictedContext), n, bytes, len(x.dec.bindings))
	if n >= objects/2 {
		t.Fatalf("%d of %d objects still bound under a %d-byte budget", n, objects, limit)
	}
	// The newest 1,000 objects (about a third of what the budget holds)
	// are all reported.
	for h := 2 + objects - 1000; h < 2+objects; h++ {
		if !x.tb.Has(x.key(t, h)) {
			t.Fatalf("object %d of the newest 1,000 is not reported", h)
		}
	}
	// The first object was evicted: a second object of its block binds it
	// afresh, and the first one's removal is a no-op that leaves it.
	k1 := x.key(t, 1)
	if x.tb.Has(k1) {
		t.Fatal("the first object survived the flood")
	}
	last := seq
	apply(
		mcEventMap("stored", "cpu", objectKey(1, 1), nil),
		mcEventMap("removed", "cpu", objectKey(1, 0), nil),
	)
	if diff := cmp.Diff([]string{"applied:none", "no-op:no_binding"}, results(x.tester, last)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if !x.tb.Has(k1) {
		t.Fatal("removing an evicted object took the holder of a later object of its block")
	}
	apply(mcEventMap("removed", "cpu", objectKey(1, 1), nil))
	if x.tb.Has(k1) {
		t.Fatal("the block stayed reported after its last object was removed")
	}
}

// TestMooncakeBindingsNeverOverReport: random stores, removals and clears
// of a few hundred objects over a few blocks and both shared tiers, against
// a budget that holds a fraction of them, so the evictor runs throughout.
// At every step a reported block has an object the master still stores
// (never higher), a binding that holds its reference has its block reported
// (an eviction takes both, a release never takes another binding's), and
// once the master has removed everything nothing is left reported: no
// holder outlives every binding that could remove it.
func TestMooncakeBindingsNeverOverReport(t *testing.T) {
	const hashes, perHash = 40, 6
	x := newBudgetTester(t, 32<<10)
	r := rand.New(rand.NewPCG(3, 4))
	media := []string{"cpu", "disk"}
	type obj struct {
		h, n   int
		medium string
	}
	truth := map[obj]bool{} // what the master stores
	keys := make([]uint64, hashes)
	for h := range keys {
		keys[h] = x.key(t, h+1)
	}
	reported := func(k uint64) bool { return x.tb.Has(k) }
	check := func(step int) {
		t.Helper()
		for h, k := range keys {
			if !reported(k) {
				continue
			}
			held := false
			for o := range truth {
				held = held || o.h == h+1
			}
			if !held {
				t.Fatalf("step %d: block %d reported with no object stored", step, h+1)
			}
		}
		for bk, b := range x.dec.bindings {
			// Has before Gone: an eviction marks the reference gone as it
			// takes the block, under one lock.
			if has := reported(b.prefix); !has && !b.ref.Gone() {
				t.Fatalf("step %d: binding %v holds its reference but its block is not reported", step, bk)
			}
		}
	}
	seq := uint64(1)
	for step := range 4000 {
		evs := make([]any, 0, 8)
		for range 1 + r.IntN(8) {
			o := obj{h: 1 + r.IntN(hashes), n: r.IntN(perHash), medium: media[r.IntN(2)]}
			switch n := r.IntN(100); {
			case n < 60:
				evs = append(evs, mcEventMap("stored", o.medium, objectKey(o.h, o.n), nil))
				truth[o] = true
			case n < 99:
				evs = append(evs, mcEventMap("removed", o.medium, objectKey(o.h, o.n), nil))
				delete(truth, o)
			default:
				evs = append(evs, mcEventMap("cleared", "", "", nil))
				clear(truth)
			}
		}
		x.applyBatch(seq, mcBatch(t, evs...))
		for i, res := range results(x.tester, seq) {
			if res != "applied:none" && res != "no-op:no_binding" {
				t.Fatalf("step %d event %d: %s", step, i, res)
			}
		}
		seq++
		check(step)
	}
	if x.ix.Evictions(index.EvictedContext) == 0 {
		t.Fatal("the budget never evicted: the test does not exercise eviction")
	}
	evs := []any{}
	for o := range truth {
		evs = append(evs, mcEventMap("removed", o.medium, objectKey(o.h, o.n), nil))
	}
	if len(evs) > 0 {
		x.applyBatch(seq, mcBatch(t, evs...))
	}
	for h, k := range keys {
		if reported(k) {
			t.Fatalf("block %d still reported after the master removed every object", h+1)
		}
	}
}

// TestBindingAccountingFollowsEveryPath: what the bindings account for in
// the index follows every path that makes or drops one (store, SGLang-style
// component changes aside, removal, clear, retraction, snapshot import),
// and the estimate a snapshot is checked against is what its bindings take
// once imported.
func TestBindingAccountingFollowsEveryPath(t *testing.T) {
	x := newBudgetTester(t, 1<<40)
	// Stripes pass their changes on in batches of up to 1 KiB each (4
	// stripes here), so live figures are compared within that; after the
	// table's drop, exactly.
	flushed := x.ix.MemoryBytes
	base := flushed()
	seq := uint64(1)
	apply := func(evs ...any) {
		x.applyBatch(seq, mcBatch(t, evs...))
		seq++
	}
	var evs []any
	for h := 1; h <= 400; h++ {
		evs = append(evs, mcEventMap("stored", media2(h), objectKey(h, h%3), nil))
		if len(evs) == 50 {
			apply(evs...)
			evs = nil
		}
	}
	n, bytes := x.live()
	if n != 400 {
		t.Fatalf("%d bindings, want 400", n)
	}
	// every binding is accounted: at least its own bytes, its slot, and
	// the index's block (within the stripes' unflushed 1 KiB each)
	if got, least := flushed()-base, bytes+400*(8+34)-4*1024; got < least {
		t.Fatalf("400 bindings account %d bytes in the index, want at least %d", got, least)
	}
	exported := x.dec.ExportBindings()
	var est int64
	for _, sb := range exported {
		est += BindingBytes(sb)
	}
	var want int64
	for _, b := range x.dec.bindings {
		want += index.EstimateRefBytes(b.accounted())
	}
	if est != want {
		t.Fatalf("snapshot estimate %d bytes, live bindings %d", est, want)
	}
	// removals of half, a clear of the other backend (none), retraction
	for h := 1; h <= 200; h += 50 {
		evs = nil
		for i := h; i < h+50; i++ {
			evs = append(evs, mcEventMap("removed", media2(i), objectKey(i, i%3), nil))
		}
		apply(evs...)
	}
	if n, _ := x.live(); n != 200 || len(x.dec.bindings) != 200 {
		t.Fatalf("after 200 removals %d live of %d bindings, want 200", n, len(x.dec.bindings))
	}
	apply(mcEventMap("cleared", "", "", func(m map[string]any) { m["backend_id"] = "pool-b" }))
	if len(x.dec.bindings) != 200 {
		t.Fatalf("a clear of another backend dropped bindings: %d left", len(x.dec.bindings))
	}
	x.retract()
	if len(x.dec.bindings) != 0 {
		t.Fatalf("%d bindings after retraction", len(x.dec.bindings))
	}
	x.ix.DropTable(eventtest.ContextOf(eventtest.LoadManifest(t).Registration(t, "vllm-a")))
	if got := x.ix.MemoryBytes(); got != base-4*320 {
		t.Fatalf("after retraction and the table's drop %d bytes accounted, want %d", got, base-4*320)
	}

	// import into a fresh bounded index: it takes at least the estimate
	y := newBudgetTester(t, 1<<40)
	before := y.ix.MemoryBytes()
	y.dec.ImportBindings(exported)
	if len(y.dec.bindings) != len(exported) {
		t.Fatalf("imported %d of %d bindings", len(y.dec.bindings), len(exported))
	}
	if got := y.ix.MemoryBytes() - before; got < est-4*1024 {
		t.Fatalf("imported bindings account %d bytes, under the snapshot estimate %d", got, est)
	}
	y.retract()
}

func media2(h int) string {
	if h%2 == 0 {
		return "disk"
	}
	return "cpu"
}
