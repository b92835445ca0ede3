package index

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// TestVersionMovesWithEveryChange: each way of changing what a query can
// see gives the table a new version, and reading changes nothing.
func TestVersionMovesWithEveryChange(t *testing.T) {
	tb := newTable(ContextKey{Model: "m", BlockSize: 16}, hashing.Profile{}, 8)
	a := tb.AddEngineOwner("a", 0)
	tb.Store(a, Device, 1)
	tb.AcquireShared(CPUShare, 2)
	for _, tc := range []struct {
		name   string
		change func()
	}{
		{"store", func() { tb.Store(a, CPULocal, 3) }},
		{"store batch", func() { tb.StoreBatch(a, []uint64{4, 5}, []TierMask{1 << Device, 1 << Disk}) }},
		{"put", func() { tb.Put(a, Disk, 6) }},
		{"remove", func() { tb.Remove(a, CPULocal, 3) }},
		{"evict", func() { tb.Evict(a, 6) }},
		{"acquire shared", func() { tb.AcquireShared(Disk, 7) }},
		{"release shared", func() { tb.ReleaseShared(CPUShare, 2) }},
		{"clear owner", func() { tb.ClearOwner(a, AllEngineTiers) }},
		{"add owner", func() { tb.AddEngineOwner("b", 0) }},
		{"remove owner", func() { tb.RemoveEngineOwner(a) }},
		{"drop", func() { tb.drop() }},
	} {
		before := tb.Version()
		var res QueryResult
		tb.Query(chainOf(1, 2, 3), "", &res)
		if tb.Version() != before {
			t.Fatalf("before %s: a query changed the version", tc.name)
		}
		tc.change()
		if tb.Version() == before {
			t.Errorf("%s left the version as it was", tc.name)
		}
	}
}

// TestQueryVersionedReportsConcurrentChange: a walk during which a writer
// changed the table is not exact; one without is.
func TestQueryVersionedReportsConcurrentChange(t *testing.T) {
	tb := newTable(ContextKey{Model: "m", BlockSize: 16}, hashing.Profile{}, 8)
	a := tb.AddEngineOwner("a", 0)
	for k := uint64(1); k <= 4; k++ {
		tb.Store(a, Device, k)
	}
	var res QueryResult
	if _, exact := tb.QueryVersioned(chainOf(1, 2, 3, 4), "", &res); !exact {
		t.Error("a quiet walk was not exact")
	}
	// The chain stores a block while the walk is under way.
	ch := &writingChain{keyChain: chainOf(1, 2, 3, 4), at: 2, write: func() { tb.Store(a, Device, 9) }}
	if _, exact := tb.QueryVersioned(ch, "", &res); exact {
		t.Error("a walk with a write in the middle was reported exact")
	}
}

// writingChain runs write when the walk asks for key number at.
type writingChain struct {
	*keyChain
	at    int
	write func()
}

func (c *writingChain) Next() (uint64, int, bool) {
	if c.keyChain.i == c.at {
		c.write()
	}
	return c.keyChain.Next()
}
