// Package durable keeps the service's state across restarts: it owns the
// state directory, records registrations before they take effect, writes
// index snapshots periodically and at shutdown, and at start-up hands each
// restored source its entries and its place in its stream. docs/state.md
// describes the behaviour and the files.
package durable

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	"github.com/mooncake-conductor-go/conductor/internal/registration"
	"github.com/mooncake-conductor-go/conductor/internal/state/regstore"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// DefaultCatchUpTimeout is Options.CatchUpTimeout when it is not set (the
// service's flag has the same default).
const DefaultCatchUpTimeout = 30 * time.Second

// Options configure Open.
type Options struct {
	// Path is the state directory; "" keeps everything in memory only.
	Path string
	// Reset moves the directory's old contents aside first.
	Reset bool
	// SnapshotInterval spaces periodic snapshots; 0 disables them (the
	// snapshot at shutdown is still written).
	SnapshotInterval time.Duration
	// CatchUpTimeout bounds how long readiness waits for restored sources.
	CatchUpTimeout time.Duration
	Logger         zerolog.Logger
	// Now is time.Now unless a test sets it.
	Now func() time.Time
	// Peers are base URLs of replicas to load a snapshot from before the
	// state directory's own, in order (see bootstrap).
	Peers []string
	// PeerToken is the bearer token peers require, if any.
	PeerToken string
	// PeerTimeout bounds one peer's whole transfer (DefaultPeerTimeout).
	PeerTimeout time.Duration
	// SharedRegistrations says another store (etcd) is the record of the
	// dynamic registrations: the directory then neither reads nor writes
	// its registration record, and keeps only the index snapshot.
	SharedRegistrations bool
	// IndexMemoryLimit is the index's memory budget (0: unbounded); a
	// snapshot, from the directory or a peer, that would not fit it is
	// refused (tooLarge).
	IndexMemoryLimit int64
}

// State is the durable side of one running service. Its methods are safe
// for concurrent use.
type State struct {
	opts Options
	log  zerolog.Logger
	dir  *statedir.Dir // nil: memory only
	regs *regstore.Store

	recorded []registry.Service

	// The loaded snapshot, consumed as services are registered at start.
	planMu sync.Mutex
	plan   *plan

	// gate is held for reading by sources while they change the index and
	// for writing by a snapshot for the instant of its cut.
	gate sync.RWMutex

	reg *registry.Registry
	ix  *index.Index
	// prod is the producer-fed side of the index, when the gRPC door is
	// on (AttachProducer); its scopes are cut with the index.
	prod *producer.Store

	snapMu sync.Mutex // one snapshot at a time
	// writeHook wraps the snapshot writer (tests inject failures).
	writeHook func(io.Writer) io.Writer

	stop chan struct{}
	done chan struct{}

	readyMu  sync.Mutex
	lagTimer *time.Timer          // Start's deadline check; Close stops it
	restores []*streampos.Restore // handed to restored sources; readiness waits on them
	deadline time.Time            // zero until Start
	started  bool
	timedOut bool

	stats stats
}

// Open opens (or, with an empty path, skips) the state directory, reads the
// recorded registrations and the newest snapshot. An unreadable
// registration record is an error (start-up stops); a bad snapshot is
// logged, moved aside and replaced by an empty index.
func Open(opts Options) (*State, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CatchUpTimeout <= 0 {
		opts.CatchUpTimeout = DefaultCatchUpTimeout
	}
	s := &State{opts: opts, log: opts.Logger}
	s.stats.init()
	if opts.Path == "" {
		s.setOrigin(s.bootstrap())
		s.log.Info().Msg("no state directory: registrations and the index are kept in memory only and are lost at restart")
		return s, nil
	}
	dir, err := statedir.Open(opts.Path, statedir.Options{Reset: opts.Reset, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	// Only once the directory is ours: a second process on it is refused
	// before it downloads a peer's whole index.
	fromPeer := s.bootstrap()
	defer s.setOrigin(fromPeer)
	s.dir = dir
	if opts.Reset {
		s.log.Warn().Str("state_dir", dir.Path()).Msg("state reset: previous contents moved aside")
	}
	s.regs = regstore.New(dir)
	if !opts.SharedRegistrations {
		if s.recorded, err = s.regs.Load(); err != nil {
			dir.Close()
			return nil, err
		}
	}
	if !fromPeer {
		s.loadSnapshot()
	}
	s.log.Info().Str("state_dir", dir.Path()).Int("recorded_services", len(s.recorded)).Msg("state directory opened")
	return s, nil
}

// setOrigin records where the index came from, for
// conductor_restore_origin: an operator (or a test) can tell a replica
// that bootstrapped from a peer from one that fell back to its own state
// directory, which the log alone says only once.
func (s *State) setOrigin(fromPeer bool) {
	origin := OriginNone
	switch {
	case fromPeer:
		origin = OriginPeer
	case s.plan != nil:
		origin = OriginStateDir
	}
	s.stats.mu.Lock()
	s.stats.origin = origin
	s.stats.mu.Unlock()
}

// loadSnapshot reads the snapshot into a restore plan; a bad one is moved
// aside and the service starts with an empty index.
func (s *State) loadSnapshot() {
	t0 := time.Now()
	name := s.dir.File(snapshot.FileName)
	data, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		if len(s.recorded) > 0 {
			s.log.Error().Str("file", name).Str("reason", "missing").Msg("no index snapshot although registrations were recorded; starting with an empty index")
		}
		return
	}
	var snap *snapshot.Snapshot
	if err == nil {
		snap, err = snapshot.Read(data)
	}
	if err == nil {
		err = s.tooLarge(snap)
	}
	if err != nil {
		ev := s.log.Error().Str("file", name).Str("reason", err.Error())
		if to, merr := s.dir.MoveAside(snapshot.FileName); merr != nil {
			ev = ev.AnErr("move_aside", merr)
		} else {
			ev = ev.Str("moved_to", to)
		}
		ev.Msg("index snapshot unusable; starting with an empty index and the recorded registrations")
		return
	}
	s.plan = newPlan(snap)
	s.stats.restoreStart = t0
	s.log.Info().Str("file", name).Time("created", snap.Created).Int("sources", len(snap.Sources)).Int("contexts", len(snap.Contexts)).
		Dur("read", time.Since(t0)).Msg("index snapshot loaded")
}

// Dir is the state directory's path ("" when memory only).
func (s *State) Dir() string {
	if s.dir == nil {
		return ""
	}
	return s.dir.Path()
}

// Recorded are the registrations the directory recorded.
func (s *State) Recorded() []registry.Service { return s.recorded }

// Gate is the gate (docs/architecture.md#glossary): the lock sources and
// producers hold for reading while they change the index, and a snapshot
// holds for writing for the instant of its cut. Memory-only services take
// snapshots too, for peers (GET /snapshot), so it is always there.
func (s *State) Gate() *sync.RWMutex { return &s.gate }

// Resume restores what the snapshot holds for svc before its source
// starts: an engine's entries into its table under its new owner id, and
// the handle through which the source resumes its stream and says how it
// settled (readiness waits for the sources catching up). It returns nil
// for a source the snapshot does not know, which then starts fresh. Each
// source is restored once.
func (s *State) Resume(svc registry.Service, table *index.Table, owner index.OwnerID) *streampos.Restore {
	s.planMu.Lock()
	defer s.planMu.Unlock()
	if s.plan == nil {
		return nil
	}
	src, ok := s.plan.take(svc)
	if !ok {
		return nil
	}
	r := streampos.NewRestore(streampos.Resume{Seq: src.Seq, Stale: src.Stale, Bindings: bindingsFromFile(src.Bindings), Digest: src.Digest, HasDigest: src.HasDigest,
		StdMap: stdMapFromFile(src.StdMap), Confirmed: s.plan.fromPeer && s.plan.version >= 3 && !src.CatchingUp && !src.Stale},
		s.stats.outcome)
	// The source's own bound on waiting for a confirmation: the catch-up
	// timeout, counted from here (Start's readiness deadline comes a
	// little later, so the source has settled by then).
	r.Deadline = s.opts.Now().Add(s.opts.CatchUpTimeout)
	if svc.IsEngine() && !src.Stale && table != nil {
		n := s.plan.restoreOwner(svc, table, owner)
		s.stats.restoredPairs.Add(int64(n))
	}
	s.stats.restored.Add(1)
	s.readyMu.Lock()
	s.restores = append(s.restores, r)
	s.readyMu.Unlock()
	return r
}

// Start runs after the start-up registrations: it records the merged set,
// makes later changes durable first, drops the restore plan and starts the
// periodic snapshots. static are the config file's registrations: they are
// not recorded (the file is their record), so removing one from the file
// removes it, while a dynamic registration that replaced one is recorded.
func (s *State) Start(reg *registry.Registry, ix *index.Index, static []registry.Service) {
	s.reg, s.ix = reg, ix
	s.planMu.Lock()
	if s.plan != nil {
		for _, key := range s.plan.unused() {
			if why, ok := s.plan.refused[key]; ok {
				s.log.Info().Str("service", key).Str("reason", why).Msg("snapshot holds this registered source but it cannot resume from it; its entries are not restored and it starts fresh")
				continue
			}
			s.log.Info().Str("service", key).Msg("snapshot holds a source that is no longer registered; its entries are not restored")
		}
		s.stats.mu.Lock()
		s.stats.restoreDuration = time.Since(s.stats.restoreStart)
		s.stats.mu.Unlock()
	}
	if s.plan != nil && len(s.plan.scopes)+len(s.plan.replicas) > 0 {
		s.log.Info().Int("scopes", len(s.plan.scopes)).Msg("snapshot holds producer-fed scopes but the gRPC door is off; they are not restored")
	}
	s.plan = nil
	s.planMu.Unlock()

	s.readyMu.Lock()
	s.started = true
	s.deadline = s.opts.Now().Add(s.opts.CatchUpTimeout)
	if s.catchingUp() > 0 {
		// Count the laggards at the deadline even if nobody asks /readyz.
		s.lagTimer = time.AfterFunc(s.opts.CatchUpTimeout, func() { s.Ready() })
	}
	s.readyMu.Unlock()

	if s.dir == nil {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.loop()
	if s.opts.SharedRegistrations {
		return
	}
	fromFile := make(map[string]bool, len(static))
	for i := range static {
		fromFile[string(registration.Encode(&static[i]))] = true
	}
	record := func(all []registry.Service) error {
		dynamic := make([]registry.Service, 0, len(all))
		for i := range all {
			if !fromFile[string(registration.Encode(&all[i]))] {
				dynamic = append(dynamic, all[i])
			}
		}
		return s.regs.Save(dynamic)
	}
	all := make([]registry.Service, 0)
	for _, st := range reg.Services() {
		all = append(all, st.Service)
	}
	if err := record(all); err != nil {
		s.log.Error().Err(err).Msg("cannot record the registrations; registration changes will be refused until the state directory is writable")
	}
	reg.SetRecorder(record)
}

// loop writes a snapshot every interval until Close.
func (s *State) loop() {
	defer close(s.done)
	if s.opts.SnapshotInterval <= 0 {
		<-s.stop
		return
	}
	t := time.NewTicker(s.opts.SnapshotInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			_ = s.Snapshot()
		}
	}
}

// Snapshot takes a consistent cut and replaces the snapshot file with it.
// A failed write keeps the previous file, is logged and counted by reason,
// and is retried at the next interval.
func (s *State) Snapshot() error {
	if s.dir == nil || s.reg == nil {
		return nil
	}
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	t0 := time.Now()
	snap := s.cut()
	size, err := s.dir.WriteAtomic(snapshot.FileName, func(w io.Writer) error {
		if s.writeHook != nil {
			w = s.writeHook(w)
		}
		return snapshot.Write(w, snap)
	})
	if err != nil {
		reason := statedir.FailureReason(err)
		s.stats.failure(reason)
		s.log.Error().Err(err).Str("reason", reason).Msg("index snapshot not written; the previous one is kept")
		return err
	}
	s.stats.success(snap.Created, time.Since(t0), size)
	s.log.Debug().Dur("took", time.Since(t0)).Int64("bytes", size).Msg("index snapshot written")
	return nil
}

// positioner is a source that can say where it is in its stream. The cut
// is the one place the durable state reads sources rather than being
// called by them: a snapshot needs every source's position at one instant,
// which only a pull under the gate gives.
type positioner interface{ Position() streampos.Position }

// cut holds registrations still and the sources between batches for the
// instant it takes to mark the cut and read every source's position; the
// index is copied afterwards while everything runs.
func (s *State) cut() *snapshot.Snapshot {
	snap := &snapshot.Snapshot{Created: s.opts.Now().UTC()}
	var c *index.Cut
	var pc *producer.Cut
	// The index keeps no hash profiles: a context's is its registrations',
	// read while Freeze holds them, so it is the profile of the table the
	// cut copies.
	profiles := map[index.ContextKey]snapshot.Profile{}
	s.reg.Freeze(func(fs []registry.Frozen) {
		pos := make([]streampos.Position, len(fs))
		has := make([]bool, len(fs))
		s.gate.Lock()
		c = s.ix.BeginCut()
		if s.prod != nil {
			pc = s.prod.BeginCut()
		}
		for i, f := range fs {
			if p, ok := f.Source.(positioner); ok {
				pos[i], has[i] = p.Position(), true
			}
		}
		s.gate.Unlock()
		// The rest comes from the registrations, which Freeze still holds:
		// fingerprinting thousands of them (microseconds each) under the
		// gate would hold every source's ingest for milliseconds.
		for i, f := range fs {
			// Every service of a context has its profile (the registry
			// refuses another).
			profiles[f.Service.Context()] = profileOf(&f.Service.Profile)
			if !has[i] {
				continue
			}
			snap.Sources = append(snap.Sources, snapshot.StreamPosition{
				Key: string(f.Service.Key()), Type: f.Service.Type.String(), Registration: fingerprint(&f.Service),
				Seq: pos[i].Seq, HasSeq: pos[i].HasSeq, Stale: pos[i].Stale, Bindings: bindingsToFile(pos[i].Bindings),
				Digest: pos[i].Digest, HasDigest: pos[i].HasDigest, CatchingUp: pos[i].CatchingUp,
				StdMap: stdMapToFile(pos[i].StdMap), HasStdMap: pos[i].HasStdMap,
			})
		}
	})
	for _, tc := range c.Finish() {
		if tc.IsScope {
			if pc != nil {
				snap.Scopes = append(snap.Scopes, scopeOf(&tc, pc))
			}
			continue
		}
		prof, ok := profiles[tc.Context]
		if !ok {
			// No registration names the context: nothing would restore
			// it (a restore needs a registration of the same profile).
			continue
		}
		snap.Contexts = append(snap.Contexts, snapshot.TableSection{
			Context: tc.Context, Profile: prof,
			Owners: tc.Owners, Entries: tc.Entries, Blocks: tc.Blocks, Pairs: tc.Pairs, Layouts: tc.Layouts,
		})
	}
	if pc != nil {
		for _, r := range pc.Replicas {
			snap.Replicas = append(snap.Replicas, snapshot.Replica{
				Tenant: r.Key.Tenant, Model: r.Key.Model, Replica: r.Key.Replica,
				SilentNanos: int64(r.SilentFor), HasStats: r.HasStats, StatsAgeNanos: int64(r.StatsAge),
				CacheMemoryBytes: r.Stats.CacheMemoryBytes, HitRate: r.Stats.HitRate, Pressure: r.Stats.Pressure,
				ClientVersion: r.Stats.ClientVersion, T2HitTokens: r.Stats.T2HitTokens, T2QueryTokens: r.Stats.T2QueryTokens,
			})
		}
		slices.SortFunc(snap.Replicas, func(a, b snapshot.Replica) int {
			return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Replica, b.Replica))
		})
		pc.Finish()
	}
	return snap
}

// scopeOf is a producer-fed scope's part of a snapshot: its cut entries
// and, per block, the token count its producer reported.
func scopeOf(tc *index.TableCut, pc *producer.Cut) snapshot.Scope {
	sc := snapshot.Scope{Scope: tc.Scope, Entries: tc.Entries, Blocks: tc.Blocks, Pairs: tc.Pairs,
		Owners: make([]string, len(tc.Owners)), Tokens: make([]int32, 0, tc.Blocks)}
	for i, o := range tc.Owners {
		sc.Owners[i] = o.Instance
	}
	// The cut's own encoding: this walk cannot fail.
	_, _, _ = index.WalkEntries(tc.Entries, len(tc.Owners), func(key uint64, _ []index.EntryHolder) {
		n, ok := pc.Tokens(tc.Scope, key)
		if !ok {
			n = -1
		}
		sc.Tokens = append(sc.Tokens, n)
	})
	return sc
}

// AttachProducer restores the snapshot's producer-fed scopes and replicas
// into p and has later snapshots include p's. Call it before Start. A
// snapshot's scopes are dropped when no producer store is attached (the
// gRPC door is off), with a note in the log.
func (s *State) AttachProducer(p *producer.Store) {
	s.prod = p
	s.planMu.Lock()
	defer s.planMu.Unlock()
	if s.plan == nil || p == nil {
		return
	}
	for _, r := range s.plan.replicas {
		p.RestoreReplica(producer.ReplicaState{
			Key:       producer.ReplicaKey{Tenant: r.Tenant, Model: r.Model, Replica: r.Replica},
			SilentFor: time.Duration(r.SilentNanos), HasStats: r.HasStats, StatsAge: time.Duration(r.StatsAgeNanos),
			Stats: producer.Stats{CacheMemoryBytes: r.CacheMemoryBytes, HitRate: r.HitRate, Pressure: r.Pressure,
				ClientVersion: r.ClientVersion, T2HitTokens: r.T2HitTokens, T2QueryTokens: r.T2QueryTokens},
		})
	}
	pairs := 0
	for i := range s.plan.scopes {
		sc := &s.plan.scopes[i]
		// Read validated every entry already.
		if err := p.RestoreScope(sc.Scope, sc.Owners, sc.Entries, sc.Tokens); err != nil {
			s.log.Error().Err(err).Msg("producer scope not restored")
			continue
		}
		pairs += sc.Pairs
	}
	s.stats.restoredPairs.Add(int64(pairs))
	if len(s.plan.scopes)+len(s.plan.replicas) > 0 {
		s.log.Info().Int("scopes", len(s.plan.scopes)).Int("replicas", len(s.plan.replicas)).Int("pairs", pairs).Msg("producer-fed scopes restored")
	}
	s.plan.scopes, s.plan.replicas = nil, nil
}

// fingerprint identifies a registration's configuration.
func fingerprint(svc *registry.Service) uint64 { return xxhash.Sum64(registration.Encode(svc)) }

func profileOf(p *hashing.Profile) snapshot.Profile {
	return snapshot.Profile{Strategy: p.Strategy, Algorithm: p.Algorithm, IndexProjection: p.IndexProjection, PythonHashSeed: p.PythonHashSeed, Seed: p.Seed}
}

// Ready reports whether restored sources have settled (or the catch-up
// timeout passed) and, when not, why.
func (s *State) Ready() (bool, string) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if !s.started {
		return false, "restoring state"
	}
	waiting := s.catchingUp()
	if waiting == 0 {
		s.restores = nil
		return true, ""
	}
	if s.opts.Now().Before(s.deadline) {
		return false, fmt.Sprintf("%d restored sources are catching up", waiting)
	}
	if !s.timedOut {
		// Nothing confirmed these sources' restored entries: a publisher
		// gone for good would otherwise keep answering from them. Each
		// drops them and counts itself as lagging when it settles.
		s.timedOut = true
		for _, r := range s.restores {
			if r.CatchingUp() {
				r.Expire()
			}
		}
		s.log.Warn().Int("sources", waiting).Dur("catch_up_timeout", s.opts.CatchUpTimeout).
			Msg("restored sources not confirmed by the catch-up timeout; their restored entries are dropped; reporting ready")
	}
	return true, ""
}

// catchingUp counts the restored sources not settled yet; readyMu held.
func (s *State) catchingUp() int {
	n := 0
	for _, r := range s.restores {
		if r.CatchingUp() {
			n++
		}
	}
	return n
}

// Close stops periodic snapshots and writes a last one, whose failure it
// returns (the previous snapshot is kept; the app exits non-zero); the
// caller then stops the sources. Release gives the directory up afterwards.
func (s *State) Close() error { return s.stopLoop(true) }

// Discard stops like Close but writes no snapshot: for a start that failed,
// which must leave the directory as it found it (the snapshot file there is
// still the one it restored from, if any).
func (s *State) Discard() { _ = s.stopLoop(false) }

func (s *State) stopLoop(snapshot bool) error {
	s.readyMu.Lock()
	if s.lagTimer != nil {
		s.lagTimer.Stop()
	}
	s.readyMu.Unlock()
	if s.stop == nil {
		return nil
	}
	close(s.stop)
	<-s.done
	s.stop = nil
	if !snapshot {
		return nil
	}
	if err := s.Snapshot(); err != nil {
		return fmt.Errorf("last index snapshot: %w", err)
	}
	s.log.Info().Msg("index snapshot written at shutdown")
	return nil
}

// Release unlocks the state directory; call it last.
func (s *State) Release() {
	if s.dir != nil {
		s.dir.Close()
	}
}

// bindingsToFile copies a Mooncake source's bindings into the snapshot
// file's records (the same fields: the conversion fails to compile when
// the two differ).
func bindingsToFile(bs []events.Binding) []snapshot.Binding {
	if bs == nil {
		return nil
	}
	out := make([]snapshot.Binding, len(bs))
	for i, b := range bs {
		out[i] = snapshot.Binding(b)
	}
	return out
}

// bindingsFromFile is bindingsToFile's inverse, for a restored source.
func bindingsFromFile(bs []snapshot.Binding) []events.Binding {
	if bs == nil {
		return nil
	}
	out := make([]events.Binding, len(bs))
	for i, b := range bs {
		out[i] = events.Binding(b)
	}
	return out
}

// stdMapToFile copies a standard-hash engine's map into the snapshot
// file's records (the same fields: the conversion fails to compile when the
// two differ).
func stdMapToFile(es []events.StdEntry) []snapshot.StdEntry {
	if es == nil {
		return nil
	}
	out := make([]snapshot.StdEntry, len(es))
	for i, e := range es {
		out[i] = snapshot.StdEntry(e)
	}
	return out
}

// stdMapFromFile is stdMapToFile's inverse, for a restored source.
func stdMapFromFile(es []snapshot.StdEntry) []events.StdEntry {
	if es == nil {
		return nil
	}
	out := make([]events.StdEntry, len(es))
	for i, e := range es {
		out[i] = events.StdEntry(e)
	}
	return out
}
