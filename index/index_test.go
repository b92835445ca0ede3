package index

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

var testCtx = ContextKey{Tenant: "default", Model: "m", BlockSize: 16}

func tc(d, l, s, k int) TierCounts { return TierCounts{d, l, s, k} }

func rk(r int, c TierCounts) RankHits { return RankHits{Rank: r, TierCounts: c} }

// inst builds the expected answer of one instance; Max is derived.
func inst(name string, ranks ...RankHits) InstanceHits {
	ih := InstanceHits{Instance: name, Ranks: ranks}
	for _, r := range ranks {
		ih.Max.Device = max(ih.Max.Device, r.Device)
		ih.Max.CPULocal = max(ih.Max.CPULocal, r.CPULocal)
		ih.Max.CPUShare = max(ih.Max.CPUShare, r.CPUShare)
		ih.Max.Disk = max(ih.Max.Disk, r.Disk)
	}
	return ih
}

// fixture gives tests named owners on a fresh table.
type fixture struct {
	ix *Index
	t  *Table
	o  map[string]OwnerID
}

func newFixture(tb testing.TB) *fixture {
	ix := New(Options{Stripes: 4})
	return &fixture{ix: ix, t: ix.EnsureTable(testCtx), o: map[string]OwnerID{}}
}

func (f *fixture) own(instance string, rank int) OwnerID {
	id := f.t.AddEngineOwner(instance, rank)
	f.o[instance+"/"+string(rune('0'+rank))] = id
	return id
}

func (f *fixture) query(c Chain, instance string) []InstanceHits {
	var res QueryResult
	f.t.Query(c, instance, &res)
	return res.Instances
}

func TestQueryRules(t *testing.T) {
	k := []uint64{101, 102, 103, 104, 105}
	cases := []struct {
		name   string
		setup  func(f *fixture)
		chain  *keyChain
		filter string
		want   []InstanceHits
		calls  int // blocks the walk decides on (see walkCalls), -1: none, 0: not checked
	}{
		{
			name: "no registered instances is empty even with shared data",
			setup: func(f *fixture) {
				f.t.acquireShared(CPUShare, k[0])
			},
			chain: chainOf(k[0]),
			want:  []InstanceHits{},
			calls: -1,
		},
		{
			name: "registered instances without a match report zeros",
			setup: func(f *fixture) {
				f.own("b", 1)
				f.own("a", 0)
				f.own("b", 0)
			},
			chain: chainOf(k[0], k[1]),
			want: []InstanceHits{
				inst("a", rk(0, tc(0, 0, 0, 0))),
				inst("b", rk(0, tc(0, 0, 0, 0)), rk(1, tc(0, 0, 0, 0))),
			},
			calls: 1,
		},
		{
			name: "tiers are cumulative per owner",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[1], Tier: Device})
				f.t.Store(a, Put{Key: k[2], Tier: CPULocal})
				f.t.Store(a, Put{Key: k[3], Tier: Disk})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(32, 48, 48, 64)))},
			calls: 5,
		},
		{
			name: "device and cpu_local on one block counts for both",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: CPULocal})
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[1], Tier: CPULocal})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(16, 32, 32, 32)))},
			calls: 3,
		},
		{
			name: "shared tiers count for every instance and rank",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.own("b", 0)
				f.own("b", 1)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.acquireShared(CPUShare, k[0])
				f.t.acquireShared(CPUShare, k[1])
				f.t.acquireShared(Disk, k[2])
			},
			chain: chainOf(k...),
			want: []InstanceHits{
				inst("a", rk(0, tc(16, 16, 32, 48))),
				inst("b", rk(0, tc(0, 0, 32, 48)), rk(1, tc(0, 0, 32, 48))),
			},
			calls: 4,
		},
		{
			name: "shared cpu does not extend an owner's prefix without its first block",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.own("b", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.acquireShared(CPUShare, k[1])
			},
			chain: chainOf(k...),
			want: []InstanceHits{
				inst("a", rk(0, tc(16, 16, 32, 32))),
				inst("b", rk(0, tc(0, 0, 0, 0))),
			},
		},
		{
			name: "engine disk counts only for its owner",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.own("b", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Disk})
			},
			chain: chainOf(k...),
			want: []InstanceHits{
				inst("a", rk(0, tc(0, 0, 0, 16))),
				inst("b", rk(0, tc(0, 0, 0, 0))),
			},
		},
		{
			name: "cpu_local and shared disk mix",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: CPULocal})
				f.t.acquireShared(Disk, k[1])
				f.t.Store(a, Put{Key: k[2], Tier: CPULocal})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 16, 16, 48)))},
		},
		{
			name: "ranks are isolated and the instance reports the maximum",
			setup: func(f *fixture) {
				r0, r1 := f.own("a", 0), f.own("a", 1)
				f.t.Store(r0, Put{Key: k[0], Tier: Device})
				f.t.Store(r0, Put{Key: k[1], Tier: Device})
				f.t.Store(r1, Put{Key: k[0], Tier: Device})
				f.t.Store(r1, Put{Key: k[1], Tier: CPULocal})
				f.t.Store(r1, Put{Key: k[2], Tier: CPULocal})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{{Instance: "a", Max: tc(32, 48, 48, 48), Ranks: []RankHits{rk(0, tc(32, 32, 32, 32)), rk(1, tc(16, 48, 48, 48))}}},
		},
		{
			name: "a gap ends the prefix",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[2], Tier: Device})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(16, 16, 16, 16)))},
			calls: 2,
		},
		{
			name: "instance filter restricts output and the walk",
			setup: func(f *fixture) {
				a, b := f.own("a", 0), f.own("b", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(b, Put{Key: k[0], Tier: Device})
				f.t.Store(b, Put{Key: k[1], Tier: Device})
				f.t.Store(b, Put{Key: k[2], Tier: Device})
			},
			chain:  chainOf(k...),
			filter: "a",
			want:   []InstanceHits{inst("a", rk(0, tc(16, 16, 16, 16)))},
			calls:  2,
		},
		{
			name: "unknown instance filter is empty",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
			},
			chain:  chainOf(k...),
			filter: "zzz",
			want:   []InstanceHits{},
			calls:  -1,
		},
		{
			name: "partial covered counts are summed",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[1], Tier: Device})
				f.t.acquireShared(CPUShare, k[2])
			},
			chain: &keyChain{keys: k[:3], cov: []int{16, 16, 5}},
			want:  []InstanceHits{inst("a", rk(0, tc(32, 32, 37, 37)))},
		},
		{
			name: "store is idempotent and remove retracts one tier",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[0], Tier: CPULocal})
				f.t.Remove(a, Put{Key: k[0], Tier: Device})
				f.t.Remove(a, Put{Key: k[0], Tier: Device})
				f.t.Remove(a, Put{Key: k[0], Tier: Disk})
				f.t.Remove(a, Put{Key: 999, Tier: Device})
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 16, 16, 16)))},
		},
		{
			name: "K and V references keep a shared block until the last release",
			setup: func(f *fixture) {
				f.own("a", 0)
				f.t.acquireShared(CPUShare, k[0]) // K
				f.t.acquireShared(CPUShare, k[0]) // V
				f.t.releaseShared(CPUShare, k[0]) // K gone, V remains
				f.t.acquireShared(CPUShare, k[1])
				f.t.releaseShared(CPUShare, k[1])
				f.t.releaseShared(CPUShare, k[1]) // below zero: no-op
				f.t.releaseShared(Disk, k[0])     // other tier: no-op
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 0, 16, 16)))},
			calls: 2,
		},
		{
			name: "release below zero does not go negative",
			setup: func(f *fixture) {
				f.own("a", 0)
				f.t.releaseShared(Disk, k[0])
				f.t.releaseShared(Disk, k[0])
				f.t.acquireShared(Disk, k[0])
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 0, 0, 16)))},
		},
		{
			name: "clear device keeps the other tiers (vLLM AllBlocksCleared)",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[0], Tier: CPULocal})
				f.t.Store(a, Put{Key: k[1], Tier: Device})
				f.t.Store(a, Put{Key: k[1], Tier: Disk})
				f.t.ClearOwner(a, 1<<Device)
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 16, 16, 32)))},
		},
		{
			name: "clear all keeps the owner registered with zeros (stale)",
			setup: func(f *fixture) {
				a, b := f.own("a", 0), f.own("b", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(a, Put{Key: k[1], Tier: Disk})
				f.t.Store(b, Put{Key: k[0], Tier: Device})
				f.t.ClearOwner(a, AllEngineTiers)
			},
			chain: chainOf(k...),
			want: []InstanceHits{
				inst("a", rk(0, tc(0, 0, 0, 0))),
				inst("b", rk(0, tc(16, 16, 16, 16))),
			},
		},
		{
			name: "remove owner retracts and forgets it",
			setup: func(f *fixture) {
				a, b := f.own("a", 0), f.own("a", 1)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.Store(b, Put{Key: k[0], Tier: Device})
				f.t.acquireShared(CPUShare, k[0])
				f.t.RemoveEngineOwner(a)
				f.t.Store(a, Put{Key: k[1], Tier: Device}) // late event of the removed owner
				f.t.RemoveEngineOwner(a)
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(1, tc(16, 16, 16, 16)))},
		},
		{
			name: "re-registering after removal starts empty",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
				f.t.RemoveEngineOwner(a)
				if again := f.own("a", 0); again == a {
					panic("owner id reused")
				}
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 0, 0, 0)))},
		},
		{
			name: "a retired id never touches the owner reusing its slot",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.RemoveEngineOwner(a)
				b := f.own("b", 0)
				if b.slot() != a.slot() || b == a {
					panic("slot not reused with a new generation")
				}
				f.t.Store(b, Put{Key: k[0], Tier: Device})
				f.t.Store(b, Put{Key: k[1], Tier: CPULocal})
				f.t.Store(a, Put{Key: k[1], Tier: Device})
				f.t.ClearOwner(a, 1<<Device)
				f.t.ClearOwner(a, AllEngineTiers)
				f.t.Remove(a, Put{Key: k[0], Tier: Device})
				f.t.RemoveEngineOwner(a)
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("b", rk(0, tc(16, 32, 32, 32)))},
		},
		{
			name: "shared tiers ignore engine tiers and vice versa",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: CPUShare})
				f.t.acquireShared(Device, k[0])
				f.t.acquireShared(CPULocal, k[0])
			},
			chain: chainOf(k...),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 0, 0, 0)))},
		},
		{
			name: "empty chain matches nothing",
			setup: func(f *fixture) {
				a := f.own("a", 0)
				f.t.Store(a, Put{Key: k[0], Tier: Device})
			},
			chain: chainOf(),
			want:  []InstanceHits{inst("a", rk(0, tc(0, 0, 0, 0)))},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			c.setup(f)
			checkInvariants(t, f.t)
			got := f.query(c.chain, c.filter)
			if got == nil {
				got = []InstanceHits{}
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got  %+v\nwant %+v", got, c.want)
			}
			switch {
			case c.calls == -1 && c.chain.calls != 0:
				t.Errorf("chain advanced %d times, want none", c.chain.calls)
			case c.calls > 0 && c.chain.calls != walkCalls(c.calls, len(c.chain.keys), 0):
				t.Errorf("chain advanced %d times, want %d", c.chain.calls, walkCalls(c.calls, len(c.chain.keys), 0))
			}
		})
	}
}

func TestContextSeparation(t *testing.T) {
	ix := New(Options{})
	t1 := ix.EnsureTable(ContextKey{Tenant: "default", Model: "m", BlockSize: 16})
	t2 := ix.EnsureTable(ContextKey{Tenant: "default", Model: "m", BlockSize: 32})
	t3 := ix.EnsureTable(ContextKey{Tenant: "other", Model: "m", BlockSize: 16})
	if ix.EnsureTable(t1.Context()) != t1 {
		t.Fatal("EnsureTable did not return the existing table")
	}
	a := t1.AddEngineOwner("a", 0)
	t2.AddEngineOwner("a", 0)
	t3.AddEngineOwner("a", 0)
	t1.Store(a, Put{Key: 7, Tier: Device})
	t1.acquireShared(CPUShare, 8)
	for _, tb := range []*Table{t2, t3} {
		var res QueryResult
		tb.Query(chainOf(7, 8), "", &res)
		want := []InstanceHits{inst("a", rk(0, tc(0, 0, 0, 0)))}
		if !reflect.DeepEqual(res.Instances, want) {
			t.Errorf("%+v leaked: %+v", tb.Context(), res.Instances)
		}
	}
	var res QueryResult
	t1.Query(chainOf(7, 8), "", &res)
	if got := res.Instances[0].Max; got != tc(16, 16, 32, 32) {
		t.Errorf("own context: %+v", got)
	}
}

func TestTablesAndDrop(t *testing.T) {
	ix := New(Options{Stripes: 3})
	if len(ix.Table(testCtx).stripesOrNil()) != 0 {
		t.Fatal("absent table is not nil")
	}
	ctxs := []ContextKey{
		{Tenant: "b", Model: "a", BlockSize: 16},
		{Tenant: "a", Model: "z", BlockSize: 16},
		{Tenant: "a", Model: "a", Lora: "x", BlockSize: 16},
		{Tenant: "a", Model: "a", BlockSize: 32},
		{Tenant: "a", Model: "a", BlockSize: 16},
	}
	for _, c := range ctxs {
		ix.EnsureTable(c)
	}
	var got []ContextKey
	for _, tb := range ix.Tables() {
		got = append(got, tb.Context())
	}
	want := []ContextKey{ctxs[4], ctxs[3], ctxs[2], ctxs[1], ctxs[0]}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v", got)
	}

	tb := ix.Table(ctxs[0])
	if len(tb.stripes) != 4 {
		t.Fatalf("stripes %d, want rounded up to 4", len(tb.stripes))
	}
	a := tb.AddEngineOwner("a", 0)
	tb.Store(a, Put{Key: 1, Tier: Device})
	tb.Store(tb.AddEngineOwner("a", 1), Put{Key: 1, Tier: Device}) // an interned holder list
	tb.acquireShared(Disk, 2)
	ix.DropTable(ctxs[0])
	ix.DropTable(ctxs[0])
	if ix.Table(ctxs[0]) != nil || len(ix.Tables()) != 4 {
		t.Fatal("table not dropped")
	}
	// Late operations on the dropped table stay harmless.
	tb.Store(a, Put{Key: 3, Tier: Device})
	tb.Remove(a, Put{Key: 1, Tier: Device})
	tb.acquireShared(CPUShare, 4)
	tb.releaseShared(Disk, 2)
	tb.ClearOwner(a, AllEngineTiers)
	b := tb.AddEngineOwner("b", 0)
	tb.Store(b, Put{Key: 5, Tier: Device})
	tb.RemoveEngineOwner(a)
	var res QueryResult
	tb.Query(chainOf(1, 2, 3), "", &res)
	if len(res.Instances) != 0 || tb.PrefixCount() != 0 || tb.TierBlocks() != [4]int{} || len(tb.Instances()) != 0 {
		t.Fatalf("dropped table answers %+v", res.Instances)
	}
	checkInvariants(t, tb)
	fresh := ix.EnsureTable(ctxs[0])
	if fresh == tb || fresh.PrefixCount() != 0 {
		t.Fatal("EnsureTable after drop must start empty")
	}
}

func (t *Table) stripesOrNil() []stripe {
	if t == nil {
		return nil
	}
	return t.stripes
}

func TestStats(t *testing.T) {
	f := newFixture(t)
	a0, a1, b := f.own("a", 0), f.own("a", 1), f.own("b", 3)
	if f.t.AddEngineOwner("a", 1) != a1 {
		t.Fatal("AddEngineOwner is not idempotent")
	}
	f.t.Store(a0, Put{Key: 1, Tier: Device})
	f.t.Store(a1, Put{Key: 1, Tier: Device})
	f.t.Store(a1, Put{Key: 2, Tier: CPULocal})
	f.t.Store(b, Put{Key: 3, Tier: Disk})
	f.t.acquireShared(Disk, 3)
	f.t.acquireShared(CPUShare, 4)
	if got := f.t.PrefixCount(); got != 4 {
		t.Errorf("PrefixCount %d", got)
	}
	if got := f.t.TierBlocks(); got != [4]int{1, 1, 1, 1} {
		t.Errorf("TierBlocks %v", got)
	}
	if got := f.t.Instances(); !reflect.DeepEqual(got, map[string][]int{"a": {0, 1}, "b": {3}}) {
		t.Errorf("Instances %v", got)
	}
	f.t.RemoveEngineOwner(a1)
	f.t.releaseShared(Disk, 3)
	if got := f.t.PrefixCount(); got != 3 {
		t.Errorf("PrefixCount after removal %d", got)
	}
	if got := f.t.TierBlocks(); got != [4]int{1, 0, 1, 1} {
		t.Errorf("TierBlocks after removal %v", got)
	}
	checkInvariants(t, f.t)
}

// TestManyOwnersPerBlock exercises the overflow lists and the reverse-list
// swaps with blocks shared by many owners.
func TestManyOwnersPerBlock(t *testing.T) {
	f := newFixture(t)
	var ids []OwnerID
	for i := range 40 {
		ids = append(ids, f.own(string(rune('a'+i%5)), i/5))
	}
	for _, id := range ids {
		for key := range uint64(300) {
			f.t.Store(id, Put{Key: key, Tier: Device})
			if key%3 == 0 {
				f.t.Store(id, Put{Key: key, Tier: CPULocal})
			}
		}
		f.t.acquireShared(CPUShare, uint64(id))
	}
	checkInvariants(t, f.t)
	for i, id := range ids {
		switch i % 4 {
		case 0:
			f.t.RemoveEngineOwner(id)
		case 1:
			f.t.ClearOwner(id, 1<<Device)
		case 2:
			for key := uint64(0); key < 300; key += 2 {
				f.t.Remove(id, Put{Key: key, Tier: Device})
			}
		}
		checkInvariants(t, f.t)
	}
	var res QueryResult
	f.t.Query(chainOf(0, 1, 2, 3), "b", &res)
	// b: ranks 0..7 hold owners i = 1, 6, 11, ... (i%5 == 1).
	if len(res.Instances) != 1 || len(res.Instances[0].Ranks) != 6 {
		t.Fatalf("%+v", res.Instances)
	}
}

func TestQueryDoesNotAllocate(t *testing.T) {
	f := newFixture(t)
	var keys []uint64
	for i := range 4 {
		for r := range 2 {
			id := f.own(string(rune('a'+i)), r)
			for k := range uint64(64) {
				f.t.Store(id, Put{Key: k, Tier: Device})
			}
		}
	}
	for k := range uint64(64) {
		keys = append(keys, k)
	}
	f.t.acquireShared(CPUShare, 64)
	c := chainOf(append(keys, 64)...)
	var res QueryResult
	f.t.Query(c, "", &res)
	allocs := testing.AllocsPerRun(100, func() {
		c.reset()
		f.t.Query(c, "", &res)
	})
	if allocs != 0 {
		t.Fatalf("Query allocates %v times per run", allocs)
	}
	if got := res.Instances[3].Ranks[1].TierCounts; got != tc(1024, 1024, 1040, 1040) {
		t.Fatalf("counts %+v", got)
	}
	// Shrinking and growing the answer again reuses the buffers too.
	allocs = testing.AllocsPerRun(100, func() {
		c.reset()
		f.t.Query(c, "b", &res)
		c.reset()
		f.t.Query(c, "", &res)
	})
	if allocs != 0 {
		t.Fatalf("filtered Query allocates %v times per run", allocs)
	}
}

// TestCompaction drives a single stripe through mass deletions from every
// path (Remove, partial and full ClearOwner, ReleaseShared) so the slab is
// compacted while owner lists are being walked.
func TestCompaction(t *testing.T) {
	ix := New(Options{Stripes: 1})
	tb := ix.EnsureTable(testCtx)
	s := &tb.stripes[0]
	a, b, c := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0), tb.AddEngineOwner("c", 0)
	const n = 6000
	for k := range uint64(n) {
		tb.Store(a, Put{Key: k, Tier: Device})
		if k%2 == 0 {
			tb.Store(b, Put{Key: k, Tier: CPULocal})
		}
		if k%3 == 0 {
			tb.acquireShared(CPUShare, k)
		}
		tb.Store(c, Put{Key: n + k, Tier: Device})
		if k%7 == 0 {
			tb.Store(c, Put{Key: n + k, Tier: CPULocal})
		}
	}
	checkInvariants(t, tb)
	peak := len(s.blocks)
	tb.ClearOwner(c, 1<<Device) // partial path: 6/7 of c's blocks vanish
	checkInvariants(t, tb)
	for k := range uint64(n) {
		if k%10 != 0 {
			tb.Remove(a, Put{Key: k, Tier: Device})
		}
	}
	checkInvariants(t, tb)
	tb.ClearOwner(b, AllEngineTiers)
	checkInvariants(t, tb)
	for k := uint64(0); k < n; k += 3 {
		tb.releaseShared(CPUShare, k)
	}
	checkInvariants(t, tb)
	want := n/10 + (n+6)/7
	if got := tb.PrefixCount(); got != want {
		t.Fatalf("PrefixCount %d, want %d", got, want)
	}
	if len(s.blocks) > 4*want || len(s.blocks) >= peak/4 {
		t.Fatalf("slab of %d blocks for %d live (peak %d): not compacted", len(s.blocks), want, peak)
	}
	var res QueryResult
	tb.Query(chainOf(0, 1), "a", &res)
	if got := res.Instances[0].Max; got != tc(16, 16, 16, 16) {
		t.Fatalf("a after compaction: %+v", got)
	}
	tb.Query(chainOf(n, n+7, n+14), "c", &res)
	if got := res.Instances[0].Max; got != tc(0, 48, 48, 48) {
		t.Fatalf("c after compaction: %+v", got)
	}
	tb.RemoveEngineOwner(a)
	tb.RemoveEngineOwner(c)
	checkInvariants(t, tb)
	if tb.PrefixCount() != 0 || s.blocks != nil {
		t.Fatalf("empty stripe keeps %d blocks", len(s.blocks))
	}
	if s.sets.sets != nil || s.sets.byHash != nil {
		t.Fatalf("empty stripe keeps %d interned holder lists", len(s.sets.sets))
	}
}

// TestClearSpansManyHolds clears owners holding several clearBudget's worth
// of blocks in one stripe, so the clear resumes across lock holds, while
// another owner keeps storing and removing in the same stripe (forcing slab
// growth and compaction between holds). Both clear paths (one tier, every
// tier) must leave exactly the expected blocks.
func TestClearSpansManyHolds(t *testing.T) {
	ix := New(Options{Stripes: 1})
	tb := ix.EnsureTable(testCtx)
	a, b, w := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0), tb.AddEngineOwner("w", 0)
	const n = 5*clearBudget + 7
	for k := range uint64(n) {
		tb.Store(a, Put{Key: k, Tier: Device})
		if k%2 == 0 {
			tb.Store(a, Put{Key: k, Tier: CPULocal})
		}
		if k%5 == 0 {
			tb.Store(b, Put{Key: k, Tier: Device})
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // another owner's writer, between the clear's holds
		defer close(done)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tb.Store(w, Put{Key: 1<<40 + i%3000, Tier: Device})
			if i >= 1500 {
				tb.Remove(w, Put{Key: 1<<40 + (i-1500)%3000, Tier: Device})
			}
		}
	}()
	tb.ClearOwner(a, 1<<Device) // partial: odd keys vanish, even keep CPULocal
	tb.RemoveEngineOwner(b)
	close(stop)
	<-done
	checkInvariants(t, tb)
	var res QueryResult
	for k := range uint64(n) {
		tb.Query(chainOf(k), "a", &res)
		want := tc(0, 0, 0, 0)
		if k%2 == 0 {
			want = tc(0, 16, 16, 16)
		}
		if len(res.Instances) != 1 || res.Instances[0].Max != want {
			t.Fatalf("key %d after the one-tier clear: %+v, want %+v", k, res.Instances, want)
		}
	}
	tb.RemoveEngineOwner(a)
	tb.RemoveEngineOwner(w)
	checkInvariants(t, tb)
	if got := tb.PrefixCount(); got != 0 {
		t.Fatalf("%d blocks left after every owner went", got)
	}
}

// TestBackgroundRemoval: with RemovalPause set, a removed owner disappears
// from answers at once, its entries are cleared in the background (Settle
// waits for that), its slot is reissued only afterwards, and Close leaves
// no goroutine behind, also when it interrupts a removal.
func TestBackgroundRemoval(t *testing.T) {
	defer goleak.VerifyNone(t)
	ix := New(Options{Stripes: 4, RemovalPause: time.Microsecond})
	defer ix.Close()
	tb := ix.EnsureTable(testCtx)
	a, b := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0)
	const n = 4 * 3 * clearBudget
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = benchKey(i)
		tb.Store(a, Put{Key: keys[i], Tier: Device})
		if i%2 == 0 {
			tb.Store(b, Put{Key: keys[i], Tier: Device})
		}
	}
	tb.RemoveEngineOwner(a)
	var res QueryResult
	tb.Query(chainOf(keys[:4]...), "", &res)
	if len(res.Instances) != 1 || res.Instances[0].Instance != "b" {
		t.Fatalf("removed owner still answered: %+v", res.Instances)
	}
	ix.Settle()
	checkInvariants(t, tb)
	if got := tb.PrefixCount(); got != n/2 {
		t.Fatalf("%d blocks after a's entries were reclaimed, want b's %d", got, n/2)
	}
	c := tb.AddEngineOwner("c", 0) // a's slot, now free, with a new generation
	if c.slot() != a.slot() || c == a {
		t.Fatalf("slot reuse: a=%v c=%v", a, c)
	}
	tb.Store(c, Put{Key: keys[1], Tier: CPULocal})
	tb.Query(chainOf(keys[1]), "c", &res)
	if got := res.Instances[0].Max; got != tc(0, 16, 16, 16) {
		t.Fatalf("c: %+v", got)
	}

	// Close in the middle of a removal: no goroutine left (goleak above),
	// and later removals clear synchronously.
	tb.RemoveEngineOwner(b)
	ix.Close()
	tb.RemoveEngineOwner(c)
	if got := tb.Instances(); len(got) != 0 {
		t.Fatalf("owners left: %v", got)
	}
	tb.Query(chainOf(keys[1]), "", &res)
	if len(res.Instances) != 0 {
		t.Fatalf("answers after every owner went: %+v", res.Instances)
	}
}

// TestReadyBatchesSpanMaxBatch: a memo-served prefix longer than
// maxReadyBatch is walked in several batches and then key by key, with the
// same answers as a walk of the same keys one at a time, for a prefix
// broken in the first, a middle and the last batch and for an unbroken one.
func TestReadyBatchesSpanMaxBatch(t *testing.T) {
	ix := New(Options{})
	tb := ix.EnsureTable(testCtx)
	a, b := tb.AddEngineOwner("a", 0), tb.AddEngineOwner("b", 0)
	n := 2*maxReadyBatch + 300
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	for _, brk := range []int{-1, 10, maxReadyBatch + 5, 2*maxReadyBatch + 7} {
		for i, k := range keys {
			if i != brk {
				tb.Store(a, Put{Key: k, Tier: Device})
			} else {
				tb.Remove(a, Put{Key: k, Tier: Device})
			}
			if i < n/2 {
				tb.Store(b, Put{Key: k, Tier: CPULocal})
			}
		}
		var want, got QueryResult
		tb.Query(chainOf(keys...), "", &want)
		plain := chainOf(keys...)
		ch, _ := asReady(plain, n-100, 0) // the last 100 keys cost hashing
		tb.Query(ch, "", &got)
		if !reflect.DeepEqual(got.Instances, want.Instances) {
			t.Fatalf("break at %d: batched %+v, one by one %+v", brk, got.Instances, want.Instances)
		}
		if brk < 0 && got.Instances[0].Max.Device != 16*n {
			t.Fatalf("unbroken prefix: %+v", got.Instances[0].Max)
		}
	}
}

// TestBackgroundRemovalThenDrop: a table dropped while the reaper clears one
// of its owners ends that job (its stripes are dead) without touching the
// dropped table's slots, Settle returns, and the reaper takes later work of
// other tables; no goroutine is left.
func TestBackgroundRemovalThenDrop(t *testing.T) {
	defer goleak.VerifyNone(t)
	ix := New(Options{Stripes: 4, RemovalPause: 50 * time.Millisecond})
	defer ix.Close()
	tb := ix.EnsureTable(testCtx)
	a := tb.AddEngineOwner("a", 0)
	for i := range 8 * clearBudget {
		tb.Store(a, Put{Key: benchKey(i), Tier: Device})
	}
	tb.RemoveEngineOwner(a)
	ix.DropTable(testCtx)
	ix.Settle()
	if got := tb.PrefixCount(); got != 0 {
		t.Fatalf("dropped table reports %d blocks", got)
	}
	other := ContextKey{Tenant: "t2", Model: "m", BlockSize: 16}
	tb2 := ix.EnsureTable(other)
	b := tb2.AddEngineOwner("b", 0)
	tb2.Store(b, Put{Key: 1, Tier: Device})
	tb2.RemoveEngineOwner(b)
	ix.Settle()
	if got := tb2.PrefixCount(); got != 0 {
		t.Fatalf("%d blocks left in the second table", got)
	}
}

// TestContextKeyCompare: tenant first, then model, LoRA and block size,
// and numerically on block size (16 before 128).
func TestContextKeyCompare(t *testing.T) {
	keys := []ContextKey{
		{Tenant: "b", Model: "a"},
		{Tenant: "a", Model: "b", BlockSize: 16},
		{Tenant: "a", Model: "a", Lora: "z", BlockSize: 16},
		{Tenant: "a", Model: "b", BlockSize: 128},
		{Tenant: "a", Model: "a", BlockSize: 16},
	}
	slices.SortFunc(keys, ContextKey.Compare)
	want := []ContextKey{
		{Tenant: "a", Model: "a", BlockSize: 16},
		{Tenant: "a", Model: "a", Lora: "z", BlockSize: 16},
		{Tenant: "a", Model: "b", BlockSize: 16},
		{Tenant: "a", Model: "b", BlockSize: 128},
		{Tenant: "b", Model: "a"},
	}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}
