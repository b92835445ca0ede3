// The app: what newApp starts, in order, and the one stop order that
// undoes it.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/bgjob"
	"github.com/mooncake-conductor-go/conductor/internal/buildinfo"
	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/etcdreg"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/grpcapi"
	"github.com/mooncake-conductor-go/conductor/internal/inferencecache/producer"
	"github.com/mooncake-conductor-go/conductor/internal/membudget"
	"github.com/mooncake-conductor-go/conductor/internal/metrics"
	"github.com/mooncake-conductor-go/conductor/internal/pprofsrv"
	"github.com/mooncake-conductor-go/conductor/internal/procmem"
	"github.com/mooncake-conductor-go/conductor/internal/query"
	"github.com/mooncake-conductor-go/conductor/internal/state/durable"
	"github.com/mooncake-conductor-go/conductor/internal/tokenmemo"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	"github.com/mooncake-conductor-go/conductor/registry"
	"github.com/mooncake-conductor-go/conductor/server"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

// app is the wired service: one index, one registry, one HTTP server.
type app struct {
	log zerolog.Logger
	reg *registry.Registry
	ix  *index.Index
	// contexts is the catalogue of registered contexts, for the gRPC door.
	contexts *contexts.Catalogue
	srv      *server.Server
	ln       net.Listener
	// memReturn runs returnMemory after a context is dropped.
	memReturn *bgjob.Job
	// state keeps registrations and the index across restarts.
	state *durable.State
	// door is the InferenceCache gRPC door when --grpc-addr is set, with
	// its listener and the producer-fed side of the index.
	door   *grpcapi.Server
	doorLn net.Listener
	prod   *producer.Store
	// tokenMemo is the token memo both doors share (nil: off).
	tokenMemo *tokenmemo.Memo
	// pprof serves runtime profiles with --pprof-addr (nil: off).
	pprof *pprofsrv.Server
	// shared links the replica to etcd (nil for a single node).
	shared *etcdreg.Replica
	// stops is what newApp started, stopped newest first: by newApp
	// itself when a later step fails, by close otherwise.
	stops     stopStack
	closeOnce sync.Once
	closeErr  error
}

// drainTimeout bounds how long the doors let in-flight requests and
// calls finish at shutdown; then they are cut, so the last snapshot and
// the sources' stop get the rest of shutdownTimeout.
const drainTimeout = 3 * time.Second

// shutdownTimeout bounds a shutdown end to end: when close has not
// returned by then, the process exits with an error.
const shutdownTimeout = 5 * time.Second

// stopStack is the one stop order, in the spirit of Prometheus's run
// group: each step newApp takes pushes the function that undoes it, and
// run undoes them newest first, the same on the failure path and at
// shutdown, so the two cannot drift apart.
type stopStack struct {
	stops []namedStop
}

type namedStop struct {
	name string
	stop func(ctx context.Context) error
}

// push adds what undoes the step just taken.
func (s *stopStack) push(name string, stop func(ctx context.Context) error) {
	s.stops = append(s.stops, namedStop{name, stop})
}

// run stops everything newest first, each step even when an earlier one
// failed, and empties the stack. ctx bounds the steps that wait for
// others (the doors' drains). The error names every step that failed.
func (s *stopStack) run(ctx context.Context) error {
	var errs []error
	for i := len(s.stops) - 1; i >= 0; i-- {
		if err := s.stops[i].stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.stops[i].name, err))
		}
	}
	s.stops = nil
	return errors.Join(errs...)
}

// nothingToReport adapts a stop that cannot fail.
func nothingToReport(f func()) func(context.Context) error {
	return func(context.Context) error { f(); return nil }
}

// removalPause spaces the background reclaiming of an unregistered engine's
// index entries (index.Options.RemovalPause), so that giving the memory
// back takes a small share of a core instead of competing with queries
// (BENCHMARKS.md, queries while a large engine is reclaimed). Queries stop
// reporting the engine at once either way.
const removalPause = 200 * time.Microsecond

func newApp(cfg *config.Config, log zerolog.Logger) (*app, error) {
	for _, w := range cfg.Warnings {
		log.Warn().Msg(w)
	}
	// Before anything grows: restoring a snapshot is the first large
	// allocation.
	applyMemoryBudget(cfg.Memory, log)
	if err := zmqx.ReserveSockets(registry.DefaultMaxServices * subscriber.SocketsPerSource); err != nil {
		return nil, err
	}
	a := &app{log: log}
	// failed tells the final-snapshot step that the start failed: a
	// failed start writes nothing into the state directory.
	failed := false
	fail := func(err error) (*app, error) {
		failed = true
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		if serr := a.stops.run(ctx); serr != nil {
			log.Warn().Err(serr).Msg("stopping what had started after a failed start")
		}
		return nil, err
	}
	// The HTTP port is taken before the state directory is opened, so a
	// second process refused the port leaves the directory as it was.
	addr := net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	a.ln = ln
	// The HTTP server closes it when it serves; this is for a start that
	// fails before it does.
	a.stops.push("HTTP listener", nothingToReport(func() { _ = ln.Close() }))
	sh, err := etcdreg.Connect(etcdreg.ClientConfig{
		Endpoints: cfg.Etcd.Endpoints, CAFile: cfg.Etcd.CAFile, CertFile: cfg.Etcd.CertFile, KeyFile: cfg.Etcd.KeyFile,
		Username: cfg.Etcd.Username, Password: cfg.Etcd.Password,
	})
	if err != nil {
		return fail(err)
	}
	a.shared = sh
	a.stops.push("etcd client", nothingToReport(sh.Close))
	state, err := durable.Open(durable.Options{
		Path: cfg.StateDir, Reset: cfg.StateReset, SnapshotInterval: cfg.SnapshotInterval,
		CatchUpTimeout: cfg.CatchUpTimeout, Logger: log, SharedRegistrations: sh != nil,
		Peers: sh.BootstrapPeers(cfg.BootstrapFrom, cfg.Etcd.Prefix, cfg.Etcd.AdvertiseURL, log), PeerToken: cfg.AuthToken,
		IndexMemoryLimit: cfg.IndexMemoryBytes,
	})
	if err != nil {
		return fail(err)
	}
	a.state = state
	a.stops.push("state directory", nothingToReport(state.Release))
	ix := index.New(index.Options{RemovalPause: removalPause, MemoryLimit: cfg.IndexMemoryBytes})
	// The registry writes the catalogue of contexts (each one's table and
	// hash profile); the doors' lookups read it.
	cat := contexts.New(ix)
	// What every source shares: the ingest counters and decoder figures
	// the metrics export, the budget of optional connection monitors, the
	// C receive batches and the C heap trimmer.
	sources := subscriber.NewResources(subscriber.ResourcesOptions{ReceiveBytes: cfg.Memory.Size[membudget.Receive]})
	// One engine answers both doors and owns the caches of its lookups:
	// the prefix memo and the verified links, forgotten through
	// engine.Forget. Ingest fills the links.
	backlog := linkBacklogBytes(cfg.Memory, cfg.LinkMemoBytes)
	links := hashing.NewLinks(cfg.LinkMemoBytes - backlog)
	links.SetBacklogLimit(int64(backlog))
	engine := query.New(query.Options{Contexts: cat, Memo: hashing.NewMemo(cfg.MemoBytes), Links: links})
	// One token memo, with the whole of its part of the budget, serves
	// both doors (MessagePack bodies here, protobuf varints there): a
	// prompt one door learned is a hit on the other. With the gRPC door
	// on, producer-scope lookups use it too, so it goes only once no
	// scope is left either. The doors consult it; the app, not the
	// engine, forgets it.
	tokenMemo := tokenmemo.New(cfg.TokenMemoBytes)
	a.tokenMemo = tokenMemo
	// forget empties the caches once nothing is left for them to answer
	// about: the engine's with the last context, the token memo then too,
	// unless the gRPC door is on and a producer scope is left.
	forget := func() {
		engine.Forget()
		if cat.Len() == 0 && (cfg.GRPCAddr == "" || len(ix.Scopes()) == 0) {
			tokenMemo.Reset()
		}
	}
	memReturn := bgjob.New(returnMemory, nil)
	// door is set once the gRPC door is open, for the sources' state
	// changes its watchers hear of; sources may change state from their
	// goroutines before that.
	var door atomic.Pointer[grpcapi.Server]
	// A nil set (the check turned off) gives services no checker.
	var checks *hashcheck.Set
	if cfg.HashCheckEvery > 0 {
		checks = hashcheck.NewSet(hashcheck.Options{Logger: log, Every: cfg.HashCheckEvery})
	}
	reg := registry.New(registry.Options{
		Contexts: cat,
		Start: sourceFactory{
			log: log, contexts: cat, shared: sources, checks: checks, links: links, limits: budgetedSources(cfg.Memory),
			watch: staticKeys(cfg), state: state, stateChanged: sourceStateTeller(&door), staleMode: staleRecovery(cfg),
		}.New,
		Logger: log,
		OnContextDropped: func(_ index.ContextKey, remaining int) {
			if remaining == 0 {
				// Nothing left to query: remembered chains, links
				// and token arrays would only keep their budgets
				// resident.
				forget()
			}
			memReturn.Request()
		},
	})
	a.reg, a.ix, a.contexts, a.memReturn = reg, ix, cat, memReturn
	a.stops.push("index", nothingToReport(func() {
		ix.Close() // after the registry, whose removals feed it
		// No goroutine outlives the service: the memory return the last
		// drops requested, and the subscribers' C-heap trims.
		memReturn.Wait()
		sources.Trimmer().Wait()
		sources.Close()
	}))
	a.stops.push("sources", nothingToReport(reg.Close))
	if err := registerAtStart(cfg, state, reg, log); err != nil {
		return fail(err)
	}
	if err := sh.Join(etcdreg.Options{Prefix: cfg.Etcd.Prefix, Registry: reg, Static: cfg.StaticServices(), Logger: log}, cfg.Etcd.Endpoints); err != nil {
		return fail(err)
	}
	a.stops.push("shared registrations", nothingToReport(sh.Leave))
	fromFile := cfg.StaticServices()
	// The producer-fed side exists with the gRPC door; its scopes are
	// restored from the snapshot before snapshots start.
	var prod *producer.Store
	if cfg.GRPCAddr != "" {
		prod = producer.New(producer.Options{Index: ix, Gate: state.Gate(),
			OnScopesDropped: func(remaining int) {
				if remaining > 0 {
					return
				}
				// The last producer-fed scope went (cleared or
				// expired): with no context left either, the
				// token memo only keeps its budget resident.
				forget()
				memReturn.Request()
			}})
		state.AttachProducer(prod)
	}
	state.Start(reg, ix, fromFile)
	a.stops.push("final snapshot", func(context.Context) error {
		// No shared change applies while shutting down: the last
		// snapshot is cut, and the sources stop after it, with the
		// registrations it saw. The snapshot is taken while every
		// source still runs; stopping them retracts their entries.
		sh.Leave()
		if failed {
			state.Discard()
			return nil
		}
		return state.Close()
	})
	// Restoring a snapshot read it whole and split it by owner; that
	// memory is garbage now, and RSS is what operators read.
	memReturn.Request()
	if cfg.PprofAddr != "" {
		pp, err := pprofsrv.Start(cfg.PprofAddr)
		if err != nil {
			return fail(err)
		}
		a.pprof = pp
		a.stops.push("profiling listener", func(context.Context) error { return pp.Close() })
		log.Info().Str("addr", pp.Addr()).Msg("serving Go profiles (--pprof-addr)")
	}
	build := buildinfo.Get()
	budget := membudget.NewCollector(cfg.Memory, map[membudget.Part]func() int64{
		membudget.Total:     procmem.RSS,
		membudget.Index:     ix.MemoryBytes,
		membudget.Links:     func() int64 { return int64(links.Bytes()) + links.BacklogBytes() },
		membudget.HashMemo:  func() int64 { return int64(engine.Memo().Bytes()) },
		membudget.TokenMemo: func() int64 { return int64(tokenMemo.Bytes()) },
		membudget.Receive:   sources.ReceiveHeld,
	})
	m := metrics.New(metrics.Options{Index: ix, Registry: reg, Ingest: ingestSeries(sources.Counters()), SourceStates: sourceStates(), Events: sources.Events(), Memo: engine.Memo(), Links: links, TokenMemo: tokenMemo, Build: &build, HashChecks: checks,
		Extra: append([]prometheus.Collector{state.Collector(), budget}, sh.Collectors()...)})
	static := make([]registry.ServiceKey, len(fromFile))
	for i, svc := range fromFile {
		static[i] = svc.Key()
	}
	ready := func() (bool, string, int) {
		if ok, why := state.Ready(); !ok {
			return false, why, 0
		}
		if !reg.Connected(static...) {
			return false, "static registrations are not connected yet", 0
		}
		return true, "", reg.StaleCount()
	}
	srv := server.New(server.Options{
		Registry: reg, Contexts: cat, Logger: log,
		Observer: m, Metrics: m.Serve, AuthToken: cfg.AuthToken, Engine: engine, TokenMemo: tokenMemo,
		Ready:       ready,
		DebugRoutes: cfg.DebugRoutes,
		Snapshot:    state.WriteSnapshot,
	})
	a.srv = srv
	a.stops.push("HTTP server", func(ctx context.Context) error {
		// Stops accepting, lets in-flight requests finish until ctx
		// ends, and closes idle connections; requests still running
		// then are cut when the process exits.
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		} else if err != nil {
			log.Warn().Dur("after", drainTimeout).Msg("HTTP requests still in flight at the end of the drain; cutting them")
		}
		return nil
	})
	if cfg.GRPCAddr != "" {
		// Health follows /readyz exactly.
		if err := a.openDoor(cfg, prod, m, engine, tokenMemo, func() bool { ok, _, _ := ready(); return ok }); err != nil {
			return fail(err)
		}
		door.Store(a.door)
	}
	log.Info().Str("addr", ln.Addr().String()).Int("static_services", len(cfg.Static)).Str("state_dir", state.Dir()).Msg("conductor listening")
	warnOpenRoutes(log, ln.Addr(), cfg)
	sh.Advertise(cfg.Etcd.AdvertiseURL)
	return a, nil
}

// openDoor sets up the InferenceCache gRPC door on cfg.GRPCAddr.
func (a *app) openDoor(cfg *config.Config, prod *producer.Store, m *metrics.Metrics, engine *query.Engine, tokenMemo *tokenmemo.Memo, ready func() bool) error {
	door, err := grpcapi.New(grpcapi.Options{
		Contexts: a.contexts, Producer: prod, Engine: engine, TokenMemo: tokenMemo, Logger: a.log,
		AuthToken: cfg.AuthToken, Ready: ready,
		TLSCert: cfg.GRPCTLSCert, TLSKey: cfg.GRPCTLSKey,
		Registerer: m.Registerer(), Gatherer: m.Gatherer(),
	})
	if err != nil {
		return fmt.Errorf("grpc: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		door.Stop()
		return fmt.Errorf("listen on %s: %w", cfg.GRPCAddr, err)
	}
	prod.Start()
	a.door, a.doorLn, a.prod = door, ln, prod
	a.stops.push("gRPC door", func(ctx context.Context) error {
		// Ends its streams, lets unary calls finish until ctx ends,
		// and detaches from the index; the producer store stops with it.
		door.Shutdown(ctx)
		prod.Close()
		return nil
	})
	a.log.Info().Str("addr", ln.Addr().String()).Bool("tls", cfg.GRPCTLSCert != "").Msg("InferenceCache gRPC door listening")
	return nil
}

// registerAtStart registers the config file's services and the recorded
// ones: engines before Mooncake streams (whose restored bindings need their
// contexts bound), the file's before the record's. A recorded registration
// that conflicts with the file loses to it, with a warning naming both.
func registerAtStart(cfg *config.Config, state *durable.State, reg *registry.Registry, log zerolog.Logger) error {
	// The file's first, then the record's: within each kind of source,
	// EnginesFirst keeps this order.
	type atStart struct {
		svc  registry.Service
		name string // the file's name for it; "" for a recorded one
	}
	var all []atStart
	for _, st := range cfg.Static {
		all = append(all, atStart{st.Service, st.Name})
	}
	for _, svc := range state.Recorded() {
		all = append(all, atStart{svc: svc})
	}
	return registry.EnginesFirst(all, func(a atStart) bool { return a.svc.IsEngine() }, func(a atStart) error {
		_, err := reg.Register(a.svc)
		switch {
		case err == nil:
		case a.name != "":
			return fmt.Errorf("static registration %q: %w", a.name, err)
		default:
			log.Warn().Err(err).Str("service", string(a.svc.Key())).Str("endpoint", a.svc.Endpoint).Str("config", cfg.Path).
				Msg("recorded registration not restored: it conflicts with the config file's registrations, which win, or its source could not start")
		}
		return nil
	})
}

// serve runs the HTTP server and, when on, the gRPC door; it returns when
// either stops.
func (a *app) serve() error {
	if a.door == nil {
		return a.srv.Serve(a.ln)
	}
	errc := make(chan error, 2)
	go func() { errc <- a.door.Serve(a.doorLn) }()
	go func() { errc <- a.srv.Serve(a.ln) }()
	return <-errc
}

// close runs the stop order: the doors stop accepting and drain (bounded
// by drainTimeout), the last snapshot is written, every subscriber stops
// and closes its sockets, and the state directory is released. Its error
// names the steps that failed (the last snapshot not written among them).
// A second call returns the first one's error.
func (a *app) close() error {
	a.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
		defer cancel()
		a.closeErr = a.stops.run(ctx)
	})
	return a.closeErr
}

// sourceFactory connects the registry to the ZMQ subscribers: New starts
// the subscriber of one registration. Each engine service also gets a hash
// checker, whose counts live as long as its source.
type sourceFactory struct {
	log zerolog.Logger
	// contexts holds each service's table (its context is in it by the
	// time the registry starts the source) and the contexts Mooncake
	// streams may bind to.
	contexts *contexts.Catalogue
	shared   *subscriber.Resources
	checks   *hashcheck.Set // nil: the hash check is off
	links    *hashing.Links
	limits   sourceLimits
	// watch are the registrations readiness waits for (the config file's).
	watch map[registry.ServiceKey]bool
	// state restores sources from the snapshot and holds the gate.
	state *durable.State
	// stateChanged, when set, is told every state change of a source.
	stateChanged func(registry.Service, subscriber.State)
	staleMode    subscriber.StaleRecovery
}

// New starts the source of svc, bound to its context's table, as owner
// there for an engine.
func (f sourceFactory) New(svc registry.Service, owner index.OwnerID) (registry.Source, error) {
	key := string(svc.Key())
	table := f.contexts.Get(svc.Context()).Table
	var chk *hashcheck.Checker
	if svc.IsEngine() && f.checks != nil {
		chk = f.checks.Add(key, &svc.Profile, svc.BlockSize, svc.LoraName)
	}
	cfg := subscriber.Config{
		Source: subscriber.SourceConfig{
			Key: key, Type: svc.Type, Endpoint: svc.Endpoint, ReplayEndpoint: svc.ReplayEndpoint, DPRank: svc.DPRank,
		},
		Index: subscriber.IndexConfig{
			Context: svc.Context(), Profile: svc.Profile, Engine: table, Owner: owner,
			Lookup: subscriber.ContextLookup(f.contexts.WithEngines),
			// The registry removes the owner after Stop, and the index
			// then reclaims its entries in the background.
			OwnerRemovedAfterStop: true,
		},
		Verify:  subscriber.VerifyConfig{HashCheck: chk, Links: f.links, LinkDefer: f.limits.linkDefer},
		Session: subscriber.SessionConfig{WatchConnection: f.watch[svc.Key()], StaleRecovery: f.staleMode},
		// A source the snapshot knows gets its entries back before it
		// subscribes, and resumes its stream where the snapshot left it.
		Durable:   subscriber.DurableConfig{Gate: f.state.Gate(), Restore: f.state.Resume(svc, table, owner)},
		Report:    subscriber.ReportConfig{Logger: f.log}, // the subscriber adds the service key itself
		Resources: f.shared,
	}
	if f.stateChanged != nil {
		cfg.Report.OnState = func(st subscriber.State) { f.stateChanged(svc, st) }
	}
	sub, err := subscriber.Start(cfg)
	if err != nil {
		f.checks.Remove(chk)
		return nil, err
	}
	return source{Subscriber: sub, stopped: func() { f.checks.Remove(chk) }}, nil
}

// ingestSeries hands the subscribers' ingestion counters to the metrics in
// the metrics' own terms (docs/architecture.md: metrics knows nothing of
// the subscriber): every series the counters export, zero or not.
func ingestSeries(c *subscriber.Counters) func(yield func(family, sourceType, reason string, value uint64)) {
	return func(yield func(family, sourceType, reason string, value uint64)) {
		for _, s := range c.All() {
			yield(s.Metric, s.Source, s.Reason, s.Value)
		}
	}
}

// sourceStates names every state a subscriber can be in, for the metrics
// to export each from start-up.
func sourceStates() []string {
	var out []string
	for _, st := range subscriber.States() {
		out = append(out, st.String())
	}
	return out
}

// sourceStateTeller tells the gRPC door, once it is open, that a source
// changed state, for StreamCacheEvents' REPLICA_UPDATED. A source stopping
// is left out: it stops when it is unregistered, which ALL_CLEARED tells,
// or when a re-registration replaces it, whose new source tells its own
// states.
func sourceStateTeller(door *atomic.Pointer[grpcapi.Server]) func(registry.Service, subscriber.State) {
	return func(svc registry.Service, st subscriber.State) {
		if st == subscriber.Stopped {
			return
		}
		if d := door.Load(); d != nil {
			d.ReplicaStateChanged(svc.Context(), svc.InstanceID)
		}
	}
}

// returnMemory hands memory freed by a dropped context back to the OS (two
// forced GCs plus a scavenge, then a trim of the C heap that held libzmq's
// buffers): otherwise it would come back over minutes or never, and
// operators read RSS. One collection is not enough: what it takes out of
// sync.Pools (query state, fasthttp's contexts) waits in the pools' victim
// caches until the next one, and each collection only halves an idle
// goroutine's grown stack. The app runs it in the background (app.memReturn:
// drops during a run get one more run after it); it takes milliseconds.
func returnMemory() {
	runtime.GC()
	debug.FreeOSMemory() // the second collection, then the scavenge
	zmqx.TrimCHeap()     // libzmq's receive buffers live in the C heap
}

// applyMemoryBudget sets the Go runtime's soft memory limit to the
// budget, so the collector works harder as the heap nears it instead of
// letting the process outgrow its container, and logs the split. An
// unbounded budget leaves the runtime as GOMEMLIMIT set it.
func applyMemoryBudget(b membudget.Budget, log zerolog.Logger) {
	ev := log.Info().Int64("memory_budget_bytes", b.Total)
	for _, p := range membudget.Parts {
		ev = ev.Int64(string(p)+"_bytes", b.Size[p])
	}
	if b.Total > 0 {
		debug.SetMemoryLimit(b.GoLimit())
	}
	ev.Msg(b.Describe())
}

// sourceLimits are what the memory budget bounds in each subscriber
// (zero: the subscriber's defaults).
type sourceLimits struct {
	// linkDefer is what the subscriber may hold of events waiting for
	// verification (subscriber.VerifyConfig.LinkDefer).
	linkDefer int
}

// linkBacklogBytes is the part of the links' memory that every source's
// verification backlog shares under a bounded budget b: an eighth; the
// tables get the rest (docs/index-memory.md#the-budget). Unbounded, it is
// 0: each source keeps only its own bound, because one shared bound sheds
// the verification of simultaneous bursts (half the blocks of the
// cold-8k preset's four publishers), which queries then pay for.
func linkBacklogBytes(b membudget.Budget, linkBytes int) int {
	if b.Total == 0 {
		return 0
	}
	return linkBytes / 8
}

// budgetedSources are the subscribers' limits under budget b: an eighth
// of the links' part for each one's verification backlog, which the
// budget counts with the links (docs/index-memory.md#the-budget); their
// receive paths share the receive part through subscriber.Resources.
// Unbounded, the subscribers' defaults.
func budgetedSources(b membudget.Budget) sourceLimits {
	if b.Total == 0 {
		return sourceLimits{}
	}
	return sourceLimits{linkDefer: int(max(b.Size[membudget.Links]/8, 1))}
}

// staleRecovery is --stale-recovery as the subscribers take it (config
// has checked the value).
func staleRecovery(cfg *config.Config) subscriber.StaleRecovery {
	m, _ := subscriber.ParseStaleRecovery(cfg.StaleRecovery)
	return m
}

// staticKeys are the config file's registrations: readiness waits for
// their connections, so their subscribers always watch for one (others do
// within subscriber.MaxOptionalMonitors, to report their state).
func staticKeys(cfg *config.Config) map[registry.ServiceKey]bool {
	keys := make(map[registry.ServiceKey]bool, len(cfg.Static))
	for _, st := range cfg.Static {
		keys[st.Service.Key()] = true
	}
	return keys
}

// source adapts a subscriber to the registry's view of a source.
type source struct {
	*subscriber.Subscriber
	stopped func() // drops what lives as long as the source (its hash checker)
}

// Stop stops the subscription, then drops the service's hash-check series.
func (s source) Stop() {
	s.Subscriber.Stop()
	s.stopped()
}

func (s source) State() string { return s.Subscriber.State().String() }

// Connected reports whether the subscription has reached its publisher.
func (s source) Connected() bool { return s.Subscriber.Connected() }

var _ registry.ConnectionReporter = source{}
