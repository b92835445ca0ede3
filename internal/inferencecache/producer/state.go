package producer

import (
	"fmt"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
)

// ReplicaState is what a snapshot keeps of one replica besides its
// entries: how long it had been silent and its latest statistics, with
// their age. Ages rather than times, because a restart must not count the
// service's own downtime as the replica's silence: a restored replica is as
// far from expiry as it was at the cut.
type ReplicaState struct {
	Key ReplicaKey
	// SilentFor is the time since the replica was last heard from.
	SilentFor time.Duration
	HasStats  bool
	Stats     Stats
	// StatsAge is the time since the statistics were reported.
	StatsAge time.Duration
}

// Cut is the producer side's state at a snapshot's cut: every replica's
// liveness and statistics, and the scopes whose token counts the snapshot
// reads after the cut.
type Cut struct {
	s        *Store
	scopes   map[index.ScopeKey]*scope
	Replicas []ReplicaState
	done     bool
}

// BeginCut records the replicas as they are now. Call it while the Gate is
// held for writing (beside index.BeginCut), then Finish once the token
// counts have been read. Until Finish, counts of keys nobody holds any more
// are kept, so every key the index cut copied still has its count.
func (s *Store) BeginCut() *Cut {
	s.cutting.Add(1)
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	c := &Cut{s: s, scopes: make(map[index.ScopeKey]*scope, len(s.scopes))}
	for k, sc := range s.scopes {
		c.scopes[k] = sc
	}
	for k, r := range s.replicas {
		st := ReplicaState{Key: k, SilentFor: max(0, now.Sub(time.Unix(0, r.lastSeen.Load())))}
		r.mu.Lock()
		if r.hasStats {
			st.HasStats, st.Stats, st.StatsAge = true, r.stats, max(0, now.Sub(r.statsAt))
		}
		r.mu.Unlock()
		c.Replicas = append(c.Replicas, st)
	}
	return c
}

// Tokens returns the token count recorded for key in scope k, as last
// reported (a re-report after the cut may have replaced it).
func (c *Cut) Tokens(k index.ScopeKey, key uint64) (int32, bool) {
	sc := c.scopes[k]
	if sc == nil {
		return 0, false
	}
	return Scope{Table: sc.t, sc: sc}.Tokens(key)
}

// Finish ends the cut.
func (c *Cut) Finish() {
	if !c.done {
		c.done = true
		c.s.cutting.Add(-1)
	}
}

// RestoreReplica recreates a replica's record from a snapshot, its
// silence and statistics aged as they were at the cut.
func (s *Store) RestoreReplica(st ReplicaState) {
	now := s.now()
	s.mu.Lock()
	r := s.replicas[st.Key]
	if r == nil {
		r = &replica{}
		s.replicas[st.Key] = r
	}
	s.mu.Unlock()
	r.lastSeen.Store(now.Add(-st.SilentFor).UnixNano())
	if st.HasStats {
		r.mu.Lock()
		r.stats, r.statsAt, r.hasStats = st.Stats, now.Add(-st.StatsAge), true
		r.mu.Unlock()
	}
}

// RestoreScope recreates a scope from a snapshot: owners are its
// replicas, entries encoded as index.TableCut.Entries with positions into
// owners, and tokens the count of each encoded block in order (negative:
// none recorded). The caller validated entries (index.WalkEntries); an
// error means they did not decode and the scope may be partly restored.
func (s *Store) RestoreScope(k index.ScopeKey, owners []string, entries []byte, tokens []int32) error {
	ids := make([]index.OwnerID, len(owners))
	ows := make([]*owner, len(owners))
	var sc *scope
	for i, id := range owners {
		// Every owner has a replica record (the snapshot lists them);
		// one missing is created as just heard from, so expiry sees it.
		rk := ReplicaKey{Tenant: k.Tenant, Model: k.Model, Replica: id}
		if _, _, _, ok := s.Replica(rk); !ok {
			s.Touch(rk)
		}
		w := s.Writer(k, id)
		sc, ows[i], ids[i] = w.sc, w.o, w.o.id
	}
	if sc == nil {
		return nil
	}
	held := make([]int64, len(owners))
	block := 0
	_, _, err := index.WalkEntries(entries, len(owners), func(key uint64, hs []index.EntryHolder) {
		for _, h := range hs {
			held[h.Owner]++
		}
		if block < len(tokens) && tokens[block] >= 0 {
			sc.setTokens(key, tokens[block])
		}
		block++
	})
	if err != nil {
		return fmt.Errorf("restore scope: %w", err)
	}
	if err := sc.t.Restore(entries, ids); err != nil {
		return fmt.Errorf("restore scope: %w", err)
	}
	for i, o := range ows {
		o.entries.Add(held[i])
	}
	return nil
}
