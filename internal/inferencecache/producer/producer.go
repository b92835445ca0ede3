// Package producer keeps what gRPC producers (InferenceCache engine
// sidecars) report: their blocks, in producer-fed scopes of the shared
// index (index.ScopeKey), plus what the index has no place for — each
// replica's latest statistics, when it was last heard from, each key's token
// count, and how many entries each replica holds per scope. A replica
// heard from neither by update nor by event for the TTL is cleared.
package producer

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
)

// DefaultTTL is how long a silent producer-fed replica is kept.
const DefaultTTL = 30 * time.Minute

// Options configure a Store.
type Options struct {
	Index *index.Index
	// TTL is how long a replica may stay silent before it is cleared
	// (default DefaultTTL).
	TTL time.Duration
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
	// Gate, when set, is held for reading around every change (Hold, and
	// the expiry sweep) and for writing by a snapshot for the instant of
	// its cut, so the cut never sees a message half-applied.
	Gate *sync.RWMutex
	// OnScopesDropped, when set, is called after a clear or an expiry
	// sweep dropped scopes left without owners, with how many scopes
	// remain, outside the store's lock. With none left the service can
	// let go of memory kept only to answer lookups on them (the gRPC
	// door's token memo), as it does when the last context goes.
	OnScopesDropped func(remaining int)
}

// Stats are a replica's latest self-reported statistics.
type Stats struct {
	CacheMemoryBytes int64
	HitRate          float32
	Pressure         float32
	ClientVersion    string
	T2HitTokens      int64
	T2QueryTokens    int64
}

// ReplicaStats is one replica's stats with their time.
type ReplicaStats struct {
	Replica string
	Stats
	At time.Time
}

// Store is the producer side of the index. Its maps are guarded by one
// RWMutex that ingestion takes for reading on the common path (scope and
// replica known); blocks themselves go straight to the index's stripes.
type Store struct {
	ix  *index.Index
	ttl time.Duration
	now func() time.Time

	mu       sync.RWMutex
	scopes   map[index.ScopeKey]*scope
	replicas map[ReplicaKey]*replica

	gate      *sync.RWMutex
	onDropped func(remaining int)
	// cutting counts cuts in progress: while one runs, token counts of
	// keys nobody holds any more are kept, so the cut reads every count
	// of the keys it copied (they are pruned at a later clear).
	cutting atomic.Int32
	// refused counts reports dropped for MaxReplicasPerScope.
	refused atomic.Uint64

	stop chan struct{}
	done chan struct{}
}

// ReplicaKey is a producer-fed replica of one (tenant, model).
type ReplicaKey struct{ Tenant, Model, Replica string }

type replica struct {
	lastSeen atomic.Int64 // unix nanoseconds

	mu       sync.Mutex
	stats    Stats
	statsAt  time.Time
	hasStats bool
}

// scope is a producer-fed scope's bookkeeping beside its index table.
type scope struct {
	st     *Store
	t      *index.Table
	owners map[string]*owner // by replica id; under Store.mu
	tokens [tokenShards]tokenShard
}

type owner struct {
	id      index.OwnerID
	entries atomic.Int64
}

const tokenShards = 16

type tokenShard struct {
	mu sync.Mutex
	m  map[uint64]int32
	// pruneAt is the size at which the shard next forgets the counts of
	// keys the index no longer holds (evicted by its memory budget, which
	// does not tell the producer): twice what was left after the last
	// prune, so pruning costs O(1) per new key.
	pruneAt int
}

// minPruneAt is a shard's first pruning size.
const minPruneAt = 4096

// MaxReplicasPerScope bounds the replicas one producer-fed scope takes as
// owners: replica ids come from clients, and each costs an owner slot and
// registration state. A report from a replica beyond it is dropped (see
// Writer) and counted by RefusedReplicas.
const MaxReplicasPerScope = 4096

// New returns an empty store; Start runs its expiry.
func New(opts Options) *Store {
	s := &Store{ix: opts.Index, ttl: opts.TTL, now: opts.Now, gate: opts.Gate, onDropped: opts.OnScopesDropped,
		scopes: map[index.ScopeKey]*scope{}, replicas: map[ReplicaKey]*replica{}}
	if s.ttl <= 0 {
		s.ttl = DefaultTTL
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s
}

// Hold pauses snapshot cuts until the returned release runs: callers wrap
// each producer message in it, so a cut sees the message whole or not at
// all.
func (s *Store) Hold() (release func()) {
	if s.gate == nil {
		return func() {}
	}
	s.gate.RLock()
	return s.gate.RUnlock
}

// TTL is the silence after which a replica is cleared.
func (s *Store) TTL() time.Duration { return s.ttl }

// Start runs the expiry sweep in the background until Close.
func (s *Store) Start() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	every := min(s.ttl/4, 30*time.Second)
	go func() {
		defer close(s.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tk.C:
				s.Sweep()
			}
		}
	}()
}

// RefusedReplicas counts the reports dropped because their scope had
// MaxReplicasPerScope replicas already.
func (s *Store) RefusedReplicas() uint64 { return s.refused.Load() }

// Close stops the sweep started by Start.
func (s *Store) Close() {
	if s.stop != nil {
		close(s.stop)
		<-s.done
		s.stop = nil
	}
}

// Touch records that the replica was heard from by an update, creating
// its record.
func (s *Store) Touch(k ReplicaKey) {
	now := s.now().UnixNano()
	s.mu.RLock()
	r := s.replicas[k]
	s.mu.RUnlock()
	if r == nil {
		s.mu.Lock()
		if r = s.replicas[k]; r == nil {
			r = &replica{}
			s.replicas[k] = r
		}
		s.mu.Unlock()
	}
	r.lastSeen.Store(now)
}

// Refresh records that a known replica was heard from by an event; it
// reports whether the replica is known.
func (s *Store) Refresh(k ReplicaKey) bool {
	s.mu.RLock()
	r := s.replicas[k]
	s.mu.RUnlock()
	if r != nil {
		r.lastSeen.Store(s.now().UnixNano())
	}
	return r != nil
}

// finite maps NaN and infinities to 0: statistics feed scores.
func finite(f float32) float32 {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return 0
	}
	return f
}

// SetStats stores the replica's latest statistics (NaN and infinities
// become 0) and touches it.
func (s *Store) SetStats(k ReplicaKey, st Stats) {
	s.Touch(k)
	st.HitRate, st.Pressure = finite(st.HitRate), finite(st.Pressure)
	s.mu.RLock()
	r := s.replicas[k]
	s.mu.RUnlock()
	if r == nil { // cleared in between
		return
	}
	r.mu.Lock()
	r.stats, r.statsAt, r.hasStats = st, s.now(), true
	r.mu.Unlock()
}

// Writer puts one replica's entries into one scope.
type Writer struct {
	sc *scope
	o  *owner
}

// Writer returns the writer for replica in scope k, creating the scope and
// registering the replica as an owner there.
func (s *Store) Writer(k index.ScopeKey, replicaID string) Writer {
	s.mu.RLock()
	sc := s.scopes[k]
	var o *owner
	if sc != nil {
		o = sc.owners[replicaID]
	}
	s.mu.RUnlock()
	if o != nil {
		return Writer{sc, o}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc = s.scopes[k]; sc == nil {
		sc = &scope{st: s, t: s.ix.EnsureScope(k), owners: map[string]*owner{}}
		s.scopes[k] = sc
	}
	if o = sc.owners[replicaID]; o == nil {
		if len(sc.owners) >= MaxReplicasPerScope {
			// A writer for owner 0, which every index operation ignores.
			s.refused.Add(1)
			return Writer{sc, &owner{}}
		}
		o = &owner{id: sc.t.AddEngineOwner(replicaID, 0)}
		sc.owners[replicaID] = o
	}
	return Writer{sc, o}
}

// Refused reports whether the writer's replica was refused for
// MaxReplicasPerScope: its Puts are no-ops.
func (w Writer) Refused() bool { return w.o.id == 0 }

// Put records that the replica holds key in tier, covering tokens tokens
// from the start of the prompt; a re-report replaces tier and count.
func (w Writer) Put(tier index.Tier, key uint64, tokens int32) {
	if w.o.id == 0 {
		return // a refused replica (MaxReplicasPerScope)
	}
	if _, added := w.sc.t.Store(w.o.id, index.Put{Key: key, Tier: tier, Replace: true}); added {
		w.o.entries.Add(1)
	}
	w.sc.setTokens(key, tokens)
}

// setTokens records how many tokens key covers, replacing any count before.
func (sc *scope) setTokens(key uint64, tokens int32) {
	sh := &sc.tokens[key%tokenShards]
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[uint64]int32{}
	}
	sh.m[key] = tokens
	if len(sh.m) >= max(sh.pruneAt, minPruneAt) && sc.st.cutting.Load() == 0 {
		for k := range sh.m {
			if !sc.t.Has(k) {
				delete(sh.m, k)
			}
		}
		sh.pruneAt = 2 * len(sh.m)
	}
	sh.mu.Unlock()
}

// Evict removes key from the replica in every scope of (tenant, model), or
// only in those of adapter when onlyAdapter is set; it returns how many
// entries went.
func (s *Store) Evict(k ReplicaKey, adapter string, onlyAdapter bool, key uint64) int {
	n := 0
	s.mu.RLock()
	defer s.mu.RUnlock()
	for sk, sc := range s.scopes {
		if sk.Tenant != k.Tenant || sk.Model != k.Model || (onlyAdapter && sk.Adapter != adapter) {
			continue
		}
		if o := sc.owners[k.Replica]; o != nil && sc.t.Remove(o.id, index.Put{Key: key, Replace: true}) {
			o.entries.Add(-1)
			n++
		}
	}
	return n
}

// Clear removes the replica from every scope of (tenant, model) and
// forgets its statistics and liveness; scopes left without owners are
// dropped from the index.
func (s *Store) Clear(k ReplicaKey) {
	s.mu.Lock()
	dropped := s.clearLocked(k)
	remaining := len(s.scopes)
	s.mu.Unlock()
	s.scopesDropped(dropped, remaining)
}

// scopesDropped tells OnScopesDropped, if anything was dropped.
func (s *Store) scopesDropped(dropped, remaining int) {
	if dropped > 0 && s.onDropped != nil {
		s.onDropped(remaining)
	}
}

// clearLocked clears one replica and returns how many scopes it dropped.
func (s *Store) clearLocked(k ReplicaKey) (dropped int) {
	delete(s.replicas, k)
	for sk, sc := range s.scopes {
		if sk.Tenant != k.Tenant || sk.Model != k.Model {
			continue
		}
		o := sc.owners[k.Replica]
		if o == nil {
			continue
		}
		delete(sc.owners, k.Replica)
		sc.t.RemoveEngineOwner(o.id)
		if len(sc.owners) == 0 {
			delete(s.scopes, sk)
			s.ix.DropScope(sk)
			dropped++
			continue
		}
		sc.pruneTokens(s)
	}
	return dropped
}

// pruneTokens forgets the token counts of keys nobody holds any more.
func (sc *scope) pruneTokens(s *Store) {
	if s.cutting.Load() > 0 {
		return
	}
	for i := range sc.tokens {
		sh := &sc.tokens[i]
		sh.mu.Lock()
		for k := range sh.m {
			if !sc.t.Has(k) {
				delete(sh.m, k)
			}
		}
		sh.mu.Unlock()
	}
}

// Sweep clears every replica silent for longer than the TTL and returns
// how many it cleared.
func (s *Store) Sweep() int {
	defer s.Hold()()
	cut := s.now().Add(-s.ttl).UnixNano()
	s.mu.Lock()
	n, dropped := 0, 0
	for k, r := range s.replicas {
		if r.lastSeen.Load() < cut {
			dropped += s.clearLocked(k)
			n++
		}
	}
	remaining := len(s.scopes)
	s.mu.Unlock()
	s.scopesDropped(dropped, remaining)
	return n
}

// Scope is a read view of one producer-fed scope.
type Scope struct {
	Table *index.Table
	sc    *scope
}

// Scope returns the scope's view; ok is false when it does not exist.
func (s *Store) Scope(k index.ScopeKey) (Scope, bool) {
	s.mu.RLock()
	sc := s.scopes[k]
	s.mu.RUnlock()
	if sc == nil {
		return Scope{}, false
	}
	return Scope{Table: sc.t, sc: sc}, true
}

// Tokens returns the token count last reported for key.
func (v Scope) Tokens(key uint64) (int32, bool) {
	sh := &v.sc.tokens[key%tokenShards]
	sh.mu.Lock()
	n, ok := sh.m[key]
	sh.mu.Unlock()
	return n, ok
}

// Level is how far down a (tenant, model, scheme) path the store holds
// entries, for the lookup's miss codes.
type Level int

const (
	// NoTenant: nothing for the tenant.
	NoTenant Level = iota
	// NoModel: the tenant, but not the model.
	NoModel
	// NoScheme: (tenant, model), but not the scheme.
	NoScheme
	// HasScheme: entries under (tenant, model, scheme).
	HasScheme
)

// Holds says how much of (tenant, model, scheme) holds entries.
func (s *Store) Holds(tenant, model, scheme string) Level {
	s.mu.RLock()
	defer s.mu.RUnlock()
	lv := NoTenant
	for sk, sc := range s.scopes {
		if sk.Tenant != tenant || !sc.holds() {
			continue
		}
		switch {
		case sk.Model != model:
			lv = max(lv, NoModel)
		case sk.Scheme != scheme:
			lv = max(lv, NoScheme)
		default:
			return HasScheme
		}
	}
	return lv
}

func (sc *scope) holds() bool {
	for _, o := range sc.owners {
		if o.entries.Load() > 0 {
			return true
		}
	}
	return false
}

// Replicas returns, sorted, the replicas holding any entry under (tenant,
// model, scheme) in any adapter: the population the lookup's
// distinguishing power and affinity count.
func (s *Store) Replicas(tenant, model, scheme string) []string {
	return s.AppendReplicas(nil, tenant, model, scheme)
}

// AppendReplicas is Replicas appending to dst (which it sorts and
// deduplicates whole), so a caller with a buffer allocates nothing.
func (s *Store) AppendReplicas(dst []string, tenant, model, scheme string) []string {
	s.mu.RLock()
	for sk, sc := range s.scopes {
		if sk.Tenant != tenant || sk.Model != model || sk.Scheme != scheme {
			continue
		}
		for id, o := range sc.owners {
			if o.entries.Load() > 0 {
				dst = append(dst, id)
			}
		}
	}
	s.mu.RUnlock()
	slices.Sort(dst)
	return slices.Compact(dst)
}

// Replica returns what a lookup needs of one replica: when it was last
// heard from, and its stats if it sent any.
func (s *Store) Replica(k ReplicaKey) (lastSeen time.Time, st ReplicaStats, hasStats, ok bool) {
	s.mu.RLock()
	r := s.replicas[k]
	s.mu.RUnlock()
	if r == nil {
		return time.Time{}, ReplicaStats{}, false, false
	}
	r.mu.Lock()
	st, hasStats = ReplicaStats{Replica: k.Replica, Stats: r.stats, At: r.statsAt}, r.hasStats
	r.mu.Unlock()
	return time.Unix(0, r.lastSeen.Load()), st, hasStats, true
}

// StatsOf returns the latest statistics of each replica of (tenant, model)
// that sent any, sorted by replica id.
func (s *Store) StatsOf(tenant, model string) []ReplicaStats {
	s.mu.RLock()
	var out []ReplicaStats
	for k, r := range s.replicas {
		if k.Tenant != tenant || k.Model != model {
			continue
		}
		r.mu.Lock()
		if r.hasStats {
			out = append(out, ReplicaStats{Replica: k.Replica, Stats: r.stats, At: r.statsAt})
		}
		r.mu.Unlock()
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b ReplicaStats) int { return cmp.Compare(a.Replica, b.Replica) })
	return out
}

// ScopeTables returns the index tables of (tenant, model)'s scopes.
func (s *Store) ScopeTables(tenant, model string) []*index.Table {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*index.Table
	for sk, sc := range s.scopes {
		if sk.Tenant == tenant && sk.Model == model {
			out = append(out, sc.t)
		}
	}
	return out
}
