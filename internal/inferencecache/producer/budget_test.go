package producer

import (
	"fmt"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// A producer that reports new keys without end under a bounded index:
// the index evicts the oldest, and the scope's token counts follow it
// instead of growing with every key ever reported.
func TestTokenCountsFollowEviction(t *testing.T) {
	ix := index.New(index.Options{Stripes: 4, MemoryLimit: 1 << 20})
	defer ix.Close()
	s := New(Options{Index: ix, TTL: time.Hour})
	k := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"}
	w := s.Writer(k, "a")
	const n = 200_000 // ~7 times what 1 MiB holds
	for i := range n {
		w.Put(index.Device, uint64(i+1), 16)
	}
	eventtest.WaitFor(t, "evictions", 10*time.Second, func() bool { return ix.Evictions(index.EvictedScope) > 0 })
	sc, _ := s.Scope(k)
	counts := 0
	for i := range sc.sc.tokens {
		sh := &sc.sc.tokens[i]
		sh.mu.Lock()
		counts += len(sh.m)
		sh.mu.Unlock()
	}
	held := sc.Table.PrefixCount()
	if counts > 2*held+tokenShards*minPruneAt {
		t.Fatalf("%d token counts kept for %d keys held (of %d reported)", counts, held, n)
	}
	if got, ok := sc.Tokens(n); !ok || got != 16 {
		t.Fatalf("the newest key's token count: %d %v", got, ok)
	}
}

// Replicas beyond MaxReplicasPerScope are refused and counted; the ones
// taken keep working.
func TestReplicasPerScopeBounded(t *testing.T) {
	s, _ := newStore()
	k := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"}
	for i := range MaxReplicasPerScope + 10 {
		s.Writer(k, fmt.Sprint("r", i)).Put(index.Device, uint64(i+1), 16)
	}
	if got := s.RefusedReplicas(); got != 10 {
		t.Fatalf("%d refused, want 10", got)
	}
	sc, _ := s.Scope(k)
	if got := sc.Table.OwnerCount(); got != MaxReplicasPerScope {
		t.Fatalf("%d owners, want %d", got, MaxReplicasPerScope)
	}
	if sc.Table.Has(uint64(MaxReplicasPerScope+5)) || !sc.Table.Has(1) {
		t.Fatal("a refused replica's key was stored, or an accepted one's was not")
	}
	if _, ok := sc.Tokens(uint64(MaxReplicasPerScope + 5)); ok {
		t.Fatal("a refused replica's token count was kept")
	}
}
