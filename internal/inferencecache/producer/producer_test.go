package producer

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
)

// newStore returns a store on the clock time.Now reads: inside a
// synctest bubble, a fake one that time.Sleep moves.
func newStore() (*Store, *index.Index) {
	ix := index.New(index.Options{Stripes: 4})
	return New(Options{Index: ix, TTL: time.Minute}), ix
}

func TestWriteEvictClear(t *testing.T) {
	s, ix := newStore()
	k := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"}
	ka := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm", Adapter: "lora"}
	ra := ReplicaKey{"t", "m", "a"}
	s.Touch(ra)
	w := s.Writer(k, "a")
	w.Put(index.Device, 1, 16)
	w.Put(index.Device, 2, 32)
	w.Put(index.Device, 2, 32) // a re-report is not a second entry
	s.Writer(ka, "a").Put(index.Device, 1, 16)
	s.Writer(k, "b").Put(index.CPULocal, 1, 16)

	if got := s.Replicas("t", "m", "vllm"); !cmp.Equal(got, []string{"a", "b"}) {
		t.Fatalf("replicas %v", got)
	}
	if lv := s.Holds("t", "m", "vllm"); lv != HasScheme {
		t.Fatalf("Holds = %v", lv)
	}
	if lv := s.Holds("t", "m", "sglang"); lv != NoScheme {
		t.Fatalf("Holds other scheme = %v", lv)
	}
	if lv := s.Holds("t", "x", "vllm"); lv != NoModel {
		t.Fatalf("Holds other model = %v", lv)
	}
	if lv := s.Holds("u", "m", "vllm"); lv != NoTenant {
		t.Fatalf("Holds other tenant = %v", lv)
	}
	sc, _ := s.Scope(k)
	if n, ok := sc.Tokens(2); !ok || n != 32 {
		t.Fatalf("tokens of key 2 = %d %v", n, ok)
	}
	// Eviction under one adapter only leaves the base scope alone.
	if n := s.Evict(ra, "lora", true, 1); n != 1 {
		t.Fatalf("adapter eviction removed %d", n)
	}
	if n := s.Evict(ra, "", false, 1); n != 1 {
		t.Fatalf("eviction removed %d", n)
	}
	// b keeps key 1; a keeps key 2.
	s.Evict(ReplicaKey{"t", "m", "b"}, "", false, 1)
	if got := s.Replicas("t", "m", "vllm"); !cmp.Equal(got, []string{"a"}) {
		t.Fatalf("after evicting b's only key: %v", got)
	}
	s.Clear(ra)
	s.Clear(ReplicaKey{"t", "m", "b"})
	if len(ix.Scopes()) != 0 {
		t.Fatalf("cleared scopes stay: %d", len(ix.Scopes()))
	}
	if s.Holds("t", "m", "vllm") != NoTenant {
		t.Fatal("cleared replicas still hold")
	}
}

func TestStatsAndExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ix := newStore()
		ra, rb := ReplicaKey{"t", "m", "a"}, ReplicaKey{"t", "m", "b"}
		s.SetStats(ra, Stats{HitRate: float32(math.NaN()), Pressure: float32(math.Inf(1)), ClientVersion: "v"})
		s.SetStats(rb, Stats{HitRate: 0.5})
		s.Writer(index.ScopeKey{Tenant: "t", Model: "m", Scheme: "x"}, "a").Put(index.Device, 7, 16)
		got := s.StatsOf("t", "m")
		if len(got) != 2 || got[0].Replica != "a" || got[0].HitRate != 0 || got[0].Pressure != 0 || got[1].HitRate != 0.5 {
			t.Fatalf("stats %+v", got)
		}
		time.Sleep(40 * time.Second)
		s.Touch(rb)
		if !s.Refresh(rb) || s.Refresh(ReplicaKey{"t", "m", "zzz"}) {
			t.Fatal("Refresh wrong")
		}
		time.Sleep(30 * time.Second) // a silent for 70 s, b for 30 s
		if n := s.Sweep(); n != 1 {
			t.Fatalf("swept %d", n)
		}
		if got := s.StatsOf("t", "m"); len(got) != 1 || got[0].Replica != "b" {
			t.Fatalf("after expiry %+v", got)
		}
		if len(ix.Scopes()) != 0 {
			t.Fatal("the expired replica's scope stays")
		}
	})
}

// TestStartExpiresInTheBackground: the sweep Start runs clears a silent
// replica on its own, and Close stops it.
func TestStartExpiresInTheBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ix := index.New(index.Options{Stripes: 2})
		s := New(Options{Index: ix, TTL: 100 * time.Millisecond})
		s.Start()
		defer s.Close()
		s.Touch(ReplicaKey{"t", "m", "a"})
		s.Writer(index.ScopeKey{Tenant: "t", Model: "m", Scheme: "x"}, "a").Put(index.Device, 1, 16)
		// The sweep runs on its ticker: past the TTL and a sweep period, with
		// every goroutine of the bubble idle, the replica is gone.
		time.Sleep(time.Second)
		synctest.Wait()
		if n := len(ix.Scopes()); n != 0 {
			t.Fatalf("the silent replica was never cleared: %d scopes left", n)
		}
	})
}

// TestScopesDroppedHook: OnScopesDropped hears of every clear or expiry
// that dropped scopes, with how many remain, and of nothing else.
func TestScopesDroppedHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ix := index.New(index.Options{Stripes: 4})
		var got []int
		s := New(Options{Index: ix, TTL: time.Minute, OnScopesDropped: func(remaining int) { got = append(got, remaining) }})
		k1 := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"}
		k2 := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "sglang"}
		k3 := index.ScopeKey{Tenant: "u", Model: "m", Scheme: "vllm"}
		put := func(k index.ScopeKey, replica string) {
			s.Touch(ReplicaKey{k.Tenant, k.Model, replica})
			s.Writer(k, replica).Put(index.Device, 7, 16)
		}
		put(k1, "a")
		put(k1, "b")
		put(k2, "a")
		put(k3, "c")

		s.Clear(ReplicaKey{"t", "m", "b"}) // k1 keeps a: nothing dropped
		s.Clear(ReplicaKey{"t", "m", "z"}) // unknown: nothing dropped
		if len(got) != 0 {
			t.Fatalf("hook called %v without a scope dropped", got)
		}
		s.Clear(ReplicaKey{"t", "m", "a"}) // k1 and k2 go, k3 remains
		if !cmp.Equal(got, []int{1}) || ix.Scope(k1) != nil || ix.Scope(k2) != nil {
			t.Fatalf("after clearing a: hook %v, scopes %v", got, ix.Scopes())
		}
		// c expires: the last scope goes.
		time.Sleep(30 * time.Second)
		if n := s.Sweep(); n != 0 || len(got) != 1 {
			t.Fatalf("sweep within the TTL cleared %d, hook %v", n, got)
		}
		time.Sleep(time.Minute)
		if n := s.Sweep(); n != 1 || !cmp.Equal(got, []int{1, 0}) || len(ix.Scopes()) != 0 {
			t.Fatalf("sweep past the TTL cleared %d, hook %v, scopes %v", n, got, ix.Scopes())
		}
	})
}
