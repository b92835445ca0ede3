package memostore

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

type entry struct {
	Record
	name string
	span int // extends any entry of the same name with a smaller span
}

func (e *entry) Rec() *Record { return &e.Record }

func newEntry(name string, span int, size int, fps ...uint64) *entry {
	e := &entry{name: name, span: span}
	e.Fps, e.Size = fps, size
	return e
}

func (e *entry) extends(o *entry) bool { return o.name == e.name && o.span <= e.span }

func filed(s *Store[*entry], fp uint64) []string {
	var out []string
	s.Lookup(fp, func(e *entry) bool {
		out = append(out, fmt.Sprintf("%s/%d", e.name, e.span))
		return true
	})
	return out
}

// check asserts the store's invariants: within its budget plus one
// crossing entry, a byte count that matches the shards' orders, no dead
// entry filed, and every filed entry in some shard's eviction order.
func check(t *testing.T, s *Store[*entry], maxEntry int) {
	t.Helper()
	ordered := map[*entry]bool{}
	total := 0
	for i := range s.shards {
		for _, e := range s.shards[i].order {
			ordered[e] = true
			total += e.Size
		}
	}
	if int64(total) != s.bytes.Load() {
		t.Errorf("shards' orders hold %d bytes, the store counts %d", total, s.bytes.Load())
	}
	if int64(total) > s.budget+int64(maxEntry) {
		t.Errorf("store holds %d bytes, budget %d", total, s.budget)
	}
	for i := range s.shards {
		for fp, b := range s.shards[i].buckets {
			if len(b) > BucketCap {
				t.Errorf("bucket %d holds %d entries", fp, len(b))
			}
			for _, e := range b {
				if e.Dead() {
					t.Errorf("dead entry %s filed under %d", e.name, fp)
				}
				if !ordered[e] {
					t.Errorf("entry %s filed outside the eviction order", e.name)
				}
			}
		}
	}
}

func TestBudgetEvictsOldestFirst(t *testing.T) {
	s := New[*entry](0) // MinBytes
	const size = 100 << 10
	var all []*entry
	for i := range 200 {
		e := newEntry(fmt.Sprint(i), 0, size, uint64(i)*shards+3) // all in shard 3
		all = append(all, e)
		s.Insert(e, e.extends)
	}
	check(t, s, size)
	// 4 MiB holds forty 100 KiB entries, the newest ones.
	keep := MinBytes / size
	for i, e := range all {
		if live := !e.Dead(); live != (i >= 200-keep) {
			t.Errorf("entry %d live=%v", i, live)
		}
	}
	if got := s.Bytes(); got != keep*size {
		t.Errorf("Bytes() = %d, want %d", got, keep*size)
	}
}

// TestBudgetIsTheStores: entries larger than a 64th of the budget (a long
// prompt's) are kept, the oldest elsewhere making room; one larger than
// the whole budget is not filed at all.
func TestBudgetIsTheStores(t *testing.T) {
	s := New[*entry](MinBytes)
	var all []*entry
	for i := range 20 {
		e := newEntry(fmt.Sprint(i), 0, 1<<20, uint64(i)) // 1 MiB each, shards 0..19
		all = append(all, e)
		s.Insert(e, e.extends)
		if e.Dead() {
			t.Fatalf("entry %d was evicted by its own insert", i)
		}
	}
	check(t, s, 1<<20)
	live := 0
	for _, e := range all {
		if !e.Dead() {
			live++
		}
	}
	if live != 4 || all[19].Dead() {
		t.Errorf("%d of 20 one-MiB entries live (want 4, the newest among them)", live)
	}
	huge := newEntry("huge", 0, MinBytes+1, 77)
	s.Insert(huge, huge.extends)
	if got := filed(s, 77); len(got) != 0 {
		t.Errorf("an entry over the whole budget was filed: %v", got)
	}
	check(t, s, 1<<20)
}

func TestSupersededEntriesAreRetired(t *testing.T) {
	s := New[*entry](1 << 20)
	short := newEntry("p", 1, 100, 7)
	s.Insert(short, short.extends)
	other := newEntry("q", 1, 100, 7)
	s.Insert(other, other.extends)
	long := newEntry("p", 2, 100, 7, 9)
	s.Insert(long, long.extends)
	if !short.Dead() || other.Dead() || long.Dead() {
		t.Errorf("dead: short %v other %v long %v", short.Dead(), other.Dead(), long.Dead())
	}
	if got, want := fmt.Sprint(filed(s, 7)), "[p/2 q/1]"; got != want {
		t.Errorf("filed under 7: %s, want %s", got, want)
	}
	check(t, s, 100)
	// The retired entry's bytes leave when the eviction order reaches it.
	s.Insert(newEntry("r", 1, 100, 7), func(*entry) bool { return false })
	check(t, s, 100)
}

func TestBucketKeepsNewest(t *testing.T) {
	s := New[*entry](1 << 20)
	for i := range BucketCap + 3 {
		e := newEntry(fmt.Sprint(i), 0, 10, 5, uint64(100+i))
		s.Insert(e, e.extends)
	}
	got := filed(s, 5)
	if len(got) != BucketCap || got[0] != fmt.Sprintf("%d/0", BucketCap+2) {
		t.Errorf("bucket 5 = %v", got)
	}
	// The dropped ones stay reachable through their deeper fingerprint.
	if got := filed(s, 100); len(got) != 1 {
		t.Errorf("bucket 100 = %v", got)
	}
	check(t, s, 10)
}

func TestResetForgetsEverything(t *testing.T) {
	s := New[*entry](1 << 20)
	e := newEntry("a", 0, 10, 1, 2)
	s.Insert(e, e.extends)
	s.Reset()
	if !e.Dead() || s.Bytes() != 0 || len(filed(s, 1)) != 0 {
		t.Errorf("after Reset: dead %v, %d bytes, %v filed", e.Dead(), s.Bytes(), filed(s, 1))
	}
	check(t, s, 0)
}

func TestConcurrentUse(t *testing.T) {
	s := New[*entry](0)
	const size = 100 << 10 // forty fit
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				switch {
				case g == 0 && i%500 == 0:
					s.Reset()
				case i%2 == 0:
					e := newEntry(fmt.Sprint(i%50), i, size, uint64(i%50), uint64(i))
					s.Insert(e, e.extends)
				default:
					filed(s, uint64(i%50))
				}
			}
		})
	}
	wg.Wait()
	check(t, s, 4*size) // each goroutine may be over by its entry at once
}

func TestFiledUnder(t *testing.T) {
	fps := []uint64{1, 2, 4, 8, 99} // depths 1, 2, 4, 8, then the whole query
	for _, c := range []struct {
		n    int
		want []uint64
	}{
		{1, []uint64{1, 99}},
		{3, []uint64{1, 2, 4, 99}},
		{4, []uint64{1, 2, 4, 8, 99}},
		{5, []uint64{1, 2, 4, 8, 99}}, // covers every depth: the deepest once
	} {
		got := FiledUnder(fps, c.n)
		if !slices.Equal(got, c.want) {
			t.Errorf("FiledUnder(%v, %d) = %v, want %v", fps, c.n, got, c.want)
		}
		if len(got) > 0 && &got[0] == &fps[0] {
			t.Errorf("FiledUnder(%v, %d) shares the query's slice", fps, c.n)
		}
	}
}

func TestCommonPrefix(t *testing.T) {
	long := make([]byte, 10_000)
	for i := range long {
		long[i] = byte(i * 7)
	}
	for _, at := range []int{0, 1, 7, 8, 63, 4095, 4096, 4097, 9_999} {
		other := slices.Clone(long)
		other[at]++
		if got := CommonPrefix(long, other); got != at {
			t.Errorf("differing at %d: CommonPrefix = %d", at, got)
		}
	}
	if got := CommonPrefix(long, long[:5000]); got != 5000 {
		t.Errorf("a prefix of the other: CommonPrefix = %d, want 5000", got)
	}
	if got := CommonPrefix(nil, long); got != 0 {
		t.Errorf("empty: CommonPrefix = %d", got)
	}
}

// TestNilStoreAndCounts: a nil store (a memo turned off) resets, reports
// no memory and no counts; Count adds up what Stats reports, across Reset.
func TestNilStoreAndCounts(t *testing.T) {
	var off *Store[*entry]
	off.Reset()
	if off.Bytes() != 0 {
		t.Error("a nil store accounts for memory")
	}
	if h, m := off.Stats(); h != 0 || m != 0 {
		t.Errorf("a nil store counts %d hits, %d misses", h, m)
	}
	s := New[*entry](MinBytes)
	s.Count(3, 0)
	s.Count(0, 5)
	s.Reset()
	s.Count(2, 1)
	if h, m := s.Stats(); h != 5 || m != 6 {
		t.Errorf("Stats %d, %d; want 5, 6", h, m)
	}
}
