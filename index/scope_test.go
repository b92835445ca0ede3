package index

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestScopesAreSeparateFromContexts(t *testing.T) {
	ix := New(Options{Stripes: 4})
	k := ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm", Adapter: "a"}
	if ix.Scope(k) != nil {
		t.Fatal("scope exists before EnsureScope")
	}
	s := ix.EnsureScope(k)
	if s != ix.EnsureScope(k) || !s.scope || s.ScopeKey() != k {
		t.Fatalf("EnsureScope gave %+v", s.ScopeKey())
	}
	if len(ix.Tables()) != 0 {
		t.Fatal("a scope appears among the Conductor contexts")
	}
	ix.EnsureScope(ScopeKey{Tenant: "a", Model: "m", Scheme: "x"})
	var got []ScopeKey
	for _, tb := range ix.Scopes() {
		got = append(got, tb.ScopeKey())
	}
	if diff := cmp.Diff([]ScopeKey{{Tenant: "a", Model: "m", Scheme: "x"}, k}, got); diff != "" {
		t.Fatal(diff)
	}
	ix.DropScope(k)
	if ix.Scope(k) != nil || len(ix.Scopes()) != 1 {
		t.Fatal("DropScope kept the scope")
	}
	if added(s.Store(s.AddEngineOwner("r", 0), Put{Key: 1, Tier: Device, Replace: true})) {
		t.Fatal("a dropped scope accepted a replacing Store")
	}
}

// TestPutReplacesTier checks that a re-report moves a block between tiers
// (the demotion path), that replacing Store and Remove report real changes only, and
// that the table stays consistent.
func TestPutReplacesTier(t *testing.T) {
	ix := New(Options{Stripes: 2})
	s := ix.EnsureScope(ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"})
	a, b := s.AddEngineOwner("a", 0), s.AddEngineOwner("b", 0)
	keys := []uint64{10, 11, 12}
	for _, k := range keys {
		if !added(s.Store(a, Put{Key: k, Tier: Device, Replace: true})) {
			t.Fatalf("first replacing Store of %d not reported as added", k)
		}
	}
	s.Store(b, Put{Key: 10, Tier: Device, Replace: true})
	if added(s.Store(a, Put{Key: 11, Tier: CPULocal, Replace: true})) {
		t.Fatal("a re-report counted as an addition")
	}
	var res QueryResult
	s.Query(chainOf(keys...), "", &res)
	want := []InstanceHits{
		{Instance: "a", Max: TierCounts{16, 48, 48, 48}, Ranks: []RankHits{{0, TierCounts{16, 48, 48, 48}}}},
		{Instance: "b", Max: TierCounts{16, 16, 16, 16}, Ranks: []RankHits{{0, TierCounts{16, 16, 16, 16}}}},
	}
	if diff := cmp.Diff(want, res.Instances, cmp.AllowUnexported(QueryResult{})); diff != "" {
		t.Fatalf("after demotion (-want +got):\n%s", diff)
	}
	if got := s.TierBlocks(); got != [4]int{2, 1, 0, 0} {
		t.Fatalf("tier blocks %v", got)
	}
	if !s.Remove(a, Put{Key: 11, Replace: true}) || s.Remove(a, Put{Key: 11, Replace: true}) || s.Remove(b, Put{Key: 11, Replace: true}) {
		t.Fatal("replacing Remove reports wrong")
	}
	if s.Has(11) || !s.Has(10) {
		t.Fatal("Has disagrees with the evictions")
	}
	var seen []uint64
	s.EachKey(func(k uint64) bool { seen = append(seen, k); return true })
	if len(seen) != 2 {
		t.Fatalf("EachKey saw %v", seen)
	}
	checkInvariants(t, s)
}

// recorder is a Watcher that keeps every change.
type recorder struct {
	mu  sync.Mutex
	on  bool
	got []Change
}

func (r *recorder) Watching() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.on }
func (r *recorder) Changed(c Change) {
	r.mu.Lock()
	r.got = append(r.got, c)
	r.mu.Unlock()
}

type seen struct {
	Kind ChangeKind
	Inst string
	Key  uint64
}

func (r *recorder) take() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seen
	for _, c := range r.got {
		out = append(out, seen{c.Kind, c.Instance, c.Key})
	}
	r.got = nil
	return out
}

func TestWatcherSeesEveryChange(t *testing.T) {
	ix := New(Options{Stripes: 2})
	r := &recorder{on: true}
	ix.SetWatcher(r)
	tb := ix.EnsureTable(ContextKey{Tenant: "t", Model: "m", BlockSize: 16})
	id := tb.AddEngineOwner("i", 0)
	tb.Store(id, Put{Key: 1, Tier: Device})
	tb.Store(id, Put{Key: 1, Tier: Disk}) // same owner, same key: not a new key
	tb.Remove(id, Put{Key: 1, Tier: Device})
	tb.Remove(id, Put{Key: 1, Tier: Disk})
	tb.acquireShared(CPUShare, 2)
	tb.acquireShared(CPUShare, 2)
	tb.releaseShared(CPUShare, 2)
	tb.releaseShared(CPUShare, 2)
	tb.Store(id, Put{Key: 3, Tier: Device})
	tb.ClearOwner(id, AllEngineTiers)
	tb.RemoveEngineOwner(id)
	want := []seen{
		{OwnerUpdated, "i", 0}, {KeyAdded, "i", 1}, {KeyEvicted, "i", 1},
		{KeyAdded, "", 2}, {KeyEvicted, "", 2}, {KeyAdded, "i", 3},
		{OwnerCleared, "i", 0}, {OwnerCleared, "i", 0},
	}
	if diff := cmp.Diff(want, r.take()); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	r.mu.Lock()
	r.on = false
	r.mu.Unlock()
	tb.Store(tb.AddEngineOwner("j", 0), Put{Key: 4, Tier: Device})
	if got := r.take(); len(got) != 0 {
		t.Fatalf("a watcher not watching got %v", got)
	}
}
