package producer

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
)

// A cut and a restore carry replicas, entries and token counts into a new
// store, with silence and statistics aged as at the cut: the time between
// the cut and the restore (the service's downtime) does not count.
func TestCutRestoreKeepsAges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, ix := newStore()
		k := index.ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"}
		ra, rb := ReplicaKey{"t", "m", "a"}, ReplicaKey{"t", "m", "b"}
		s.SetStats(ra, Stats{HitRate: 0.5, ClientVersion: "x"})
		s.Writer(k, "a").Put(index.Device, 1, 16)
		s.Writer(k, "a").Put(index.CPULocal, 2, 32)
		time.Sleep(20 * time.Second)
		s.Touch(rb)
		s.Writer(k, "b").Put(index.Device, 1, 16)
		s.Writer(k, "b").Put(index.Device, 3, 48) // b's alone
		time.Sleep(10 * time.Second)

		pc := s.BeginCut()
		var tc index.TableCut
		for _, x := range ix.BeginCut().Finish() {
			if x.IsScope && x.Scope == k {
				tc = x
			}
		}
		// Clearing b after the cut does not lose the counts the cut copied.
		s.Clear(rb)
		var owners []string
		for _, o := range tc.Owners {
			owners = append(owners, o.Instance)
		}
		var tokens []int32
		_, _, err := index.WalkEntries(tc.Entries, len(owners), func(key uint64, _ []index.EntryHolder) {
			n, ok := pc.Tokens(k, key)
			if !ok {
				t.Errorf("key %d: no token count", key)
			}
			tokens = append(tokens, n)
		})
		if err != nil {
			t.Fatal(err)
		}
		pc.Finish()
		byKey := map[ReplicaKey]ReplicaState{}
		for _, r := range pc.Replicas {
			byKey[r.Key] = r
		}
		if byKey[ra].SilentFor != 30*time.Second || byKey[rb].SilentFor != 10*time.Second || byKey[ra].StatsAge != 30*time.Second || !byKey[ra].HasStats {
			t.Fatalf("replicas at the cut: %+v", pc.Replicas)
		}

		// A new store, an hour later.
		s2, _ := newStore()
		time.Sleep(time.Hour)
		for _, r := range pc.Replicas {
			s2.RestoreReplica(r)
		}
		if err := s2.RestoreScope(k, owners, tc.Entries, tokens); err != nil {
			t.Fatal(err)
		}
		last, st, hasStats, ok := s2.Replica(ra)
		if !ok || !hasStats || time.Now().Sub(last) != 30*time.Second || time.Now().Sub(st.At) != 30*time.Second || st.ClientVersion != "x" {
			t.Errorf("restored a: last %v stats %+v %v %v", time.Now().Sub(last), st, hasStats, ok)
		}
		if got := s2.Replicas("t", "m", "vllm"); !cmp.Equal(got, []string{"a", "b"}) {
			t.Errorf("replicas %v", got)
		}
		sc, _ := s2.Scope(k)
		for key, want := range map[uint64]int32{1: 16, 2: 32, 3: 48} {
			if n, ok := sc.Tokens(key); !ok || n != want {
				t.Errorf("tokens of %d: %d %v, want %d", key, n, ok, want)
			}
		}
		// Expiry continues from the restored silence: b (silent 10 s of a
		// minute) outlives a (30 s) by 20 s.
		time.Sleep(31 * time.Second)
		if n := s2.Sweep(); n != 1 {
			t.Fatalf("swept %d, want a alone", n)
		}
		if got := s2.Replicas("t", "m", "vllm"); !cmp.Equal(got, []string{"b"}) {
			t.Errorf("after a expired: %v", got)
		}
	})
}
