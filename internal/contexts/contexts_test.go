package contexts_test

import (
	"sync"
	"testing"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/racebuild"
)

var (
	ctxA = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 16}
	ctxB = index.ContextKey{Tenant: "default", Model: "m", BlockSize: 32}
)

// TestEnsureGetDrop: a context enters with its first Ensure (table created
// in the index, profile kept), stays as it was on later Ensures, and
// leaves with Drop, its table then dead in the index.
func TestEnsureGetDrop(t *testing.T) {
	ix := index.New(index.Options{})
	cat := contexts.New(ix)
	prof := eventtest.VLLMProfile(t)
	if cat.Get(ctxA) != nil || cat.Len() != 0 {
		t.Fatal("an empty catalogue knows a context")
	}
	a := cat.Ensure(ctxA, prof)
	if a.Table == nil || a.Table != ix.Table(ctxA) || a.Table.Context() != ctxA {
		t.Fatalf("Ensure's table %p is not the index's %p for %+v", a.Table, ix.Table(ctxA), ctxA)
	}
	if a.Profile != prof {
		t.Errorf("profile %+v, want %+v", a.Profile, prof)
	}
	if again := cat.Ensure(ctxA, hashing.Profile{}); again != a || again.Profile != prof {
		t.Error("a second Ensure replaced the context or its profile")
	}
	if cat.Get(ctxA) != a || cat.Get(ctxB) != nil {
		t.Error("Get does not return what Ensure made")
	}
	b := cat.Ensure(ctxB, prof)
	seen := map[*contexts.Entry]bool{}
	for c := range cat.All() {
		seen[c] = true
	}
	if len(seen) != 2 || !seen[a] || !seen[b] || cat.Len() != 2 {
		t.Fatalf("All yields %d contexts, Len %d; want both", len(seen), cat.Len())
	}

	owner := a.Table.AddEngineOwner("i", 0)
	keys := eventtest.ChainKeys(&a.Profile, 16, make([]int32, 32))
	a.Table.Store(owner, index.Put{Key: keys[0], Tier: index.Device})
	cat.Drop(ctxA)
	if cat.Get(ctxA) != nil || ix.Table(ctxA) != nil || cat.Len() != 1 {
		t.Fatal("Drop left the context in the catalogue or its table in the index")
	}
	if a.Table.PrefixCount() != 0 {
		t.Error("a dropped context's table still holds blocks")
	}
	cat.Drop(ctxA) // no-op
	if cat.Get(ctxB) != b {
		t.Error("dropping one context lost another")
	}
	if c := cat.Ensure(ctxA, prof); c == a || c.Table == a.Table {
		t.Error("a context registered again got its dead table back")
	}
}

// TestGetAllocatesNothing: queries read the catalogue on every request.
// The race detector's instrumentation makes the iterator escape, so only
// TestWithEngines: a context is bound for Mooncake streams only while
// SetEngines says an engine registered it; another context, or one never
// in the catalogue, is not.
func TestWithEngines(t *testing.T) {
	cat := contexts.New(index.New(index.Options{}))
	a := cat.Ensure(ctxA, eventtest.VLLMProfile(t))
	cat.Ensure(ctxB, eventtest.VLLMProfile(t))
	if _, ok := cat.WithEngines(ctxA); ok {
		t.Fatal("a context without engines is bound")
	}
	cat.SetEngines(ctxA, true)
	cat.SetEngines(index.ContextKey{Model: "never"}, true)
	if got, ok := cat.WithEngines(ctxA); !ok || got != a {
		t.Fatalf("WithEngines(A) = %p, %v; want %p", got, ok, a)
	}
	for _, k := range []index.ContextKey{ctxB, {Model: "never"}} {
		if _, ok := cat.WithEngines(k); ok {
			t.Errorf("%+v is bound", k)
		}
	}
	cat.SetEngines(ctxA, false)
	if _, ok := cat.WithEngines(ctxA); ok {
		t.Error("A is still bound once its engines went")
	}
}

// the plain build counts.
func TestGetAllocatesNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	cat := contexts.New(index.New(index.Options{}))
	cat.Ensure(ctxA, eventtest.VLLMProfile(t))
	n := 0
	if a := testing.AllocsPerRun(100, func() {
		if cat.Get(ctxA) != nil {
			n++
		}
		for range cat.All() {
			n++
		}
	}); a != 0 {
		t.Errorf("Get and All allocate %v times per call", a)
	}
}

// TestConcurrentReaders: readers never see a half-built version while
// writers add and drop contexts (run with -race).
func TestConcurrentReaders(t *testing.T) {
	cat := contexts.New(index.New(index.Options{}))
	prof := eventtest.VLLMProfile(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if c := cat.Get(ctxA); c != nil && (c.Table == nil || c.Profile != prof) {
					t.Error("a reader saw an incomplete context")
					return
				}
				for c := range cat.All() {
					if c.Table == nil {
						t.Error("All yielded a context without a table")
						return
					}
				}
			}
		}()
	}
	for range 200 {
		cat.Ensure(ctxA, prof)
		cat.Ensure(ctxB, prof)
		cat.Drop(ctxA)
	}
	close(stop)
	wg.Wait()
	if cat.Get(ctxA) != nil || cat.Get(ctxB) == nil {
		t.Error("final state wrong")
	}
}
