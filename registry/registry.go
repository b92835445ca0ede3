// Package registry owns the set of registered publishers: it enforces the
// contract's registration rules, binds each context to one hash profile, and
// starts and stops the event source behind every service.
package registry

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// ServiceKey identifies a registration: instance_id|tenant_id|dp_rank.
type ServiceKey string

// KeyOf builds the service key the contract defines.
func KeyOf(instanceID, tenantID string, dpRank int) ServiceKey {
	return ServiceKey(instanceID + "|" + tenantID + "|" + strconv.Itoa(dpRank))
}

// Service is one publisher's registration, with its resolved hash profile.
type Service struct {
	Endpoint       string
	ReplayEndpoint string
	Type           sourcetype.Type
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int
	DPRank         int
	// CacheGroup is nil when the client sent none; otherwise 0.
	CacheGroup *int
	Profile    hashing.Profile
	// Groups is the declared KV-cache group layout (N 0: learned from
	// events); never echoed in the contract's responses.
	Groups KVCacheGroups
}

// Key is the service's registry key.
func (s *Service) Key() ServiceKey { return KeyOf(s.InstanceID, s.TenantID, s.DPRank) }

// Context is the index context the service's blocks belong to.
func (s *Service) Context() index.ContextKey {
	return index.ContextKey{Tenant: s.TenantID, Model: s.ModelName, Lora: s.LoraName, BlockSize: s.BlockSize}
}

// IsEngine reports whether the service is an engine (vLLM or SGLang), whose
// instance is a scheduling target, rather than a Mooncake master stream.
func (s *Service) IsEngine() bool { return s.Type.IsEngine() }

// sameConfig reports whether two registrations are identical; nil and 0
// cache groups both mean group 0.
func sameConfig(a, b *Service) bool {
	ac, bc := *a, *b
	ac.CacheGroup, bc.CacheGroup = nil, nil
	return ac == bc
}

// Source is a running event subscription. Stop must be idempotent, close
// everything it opened and retract everything it contributed to the index.
type Source interface {
	Stop()
	Stale() bool
	// State names the source's condition for listings and metrics
	// ("connecting", "live", "recovering", "disconnected", "stale", ...).
	State() string
}

// ConnectionReporter is a Source that can tell whether it has reached its
// publisher (a subscriber watching its connection). Readiness waits for
// the config file's sources through it; a Source without it counts as
// connected once started.
type ConnectionReporter interface {
	Source
	Connected() bool
}

// SourceFactory starts the event source for a service whose context is
// in the catalogue (Options.Contexts) by then. owner is the service's
// engine owner in the context's table (engines only; zero otherwise): the
// one thing about a source the registry decides. Which contexts have
// engine registrations, what Mooncake streams bind to, the registry
// records in the catalogue (contexts.Catalogue.WithEngines).
type SourceFactory func(svc Service, owner index.OwnerID) (Source, error)

// Options configure a Registry.
type Options struct {
	// Contexts is the catalogue the registry writes: a context enters it
	// (its table created) with its first service and leaves it (its table
	// dropped) with its last.
	Contexts *contexts.Catalogue
	// Start starts a service's source; nil runs no sources (tests).
	Start SourceFactory
	// MaxServices bounds the number of registrations (default 4096).
	MaxServices int
	Logger      zerolog.Logger
	// OnContextDropped, when set, is called (with the registry locked)
	// after a context's last service is gone and its table dropped, with
	// the number of contexts still registered; main uses it to hand the
	// freed memory back to the OS, and to empty caches once nothing is
	// registered.
	OnContextDropped func(ctx index.ContextKey, remaining int)
}

// ConflictError is a registration that contradicts the existing state; the
// API answers it with invalid_registration.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// SourceError is a registration whose event source could not be set up
// (its endpoint passed the rules but a socket could not be made for it).
type SourceError struct {
	Key ServiceKey
	Err error
}

func (e *SourceError) Error() string { return fmt.Sprintf("start source for %s: %v", e.Key, e.Err) }

func (e *SourceError) Unwrap() error { return e.Err }

// Errors the API maps to statuses.
var (
	ErrNotFound        = errors.New("service not found")
	ErrTooManyServices = errors.New("too many registered services")
)

type entry struct {
	svc    Service
	owner  index.OwnerID
	source Source
}

type contextState struct {
	*contexts.Entry
	services int
	engines  int
}

// Registry is safe for concurrent use. Register and Unregister serialize on
// one mutex; queries never take it. A source is stopped with the mutex
// released (stopping waits for its goroutine, which may take a while), so
// listings, readiness and scrapes do not queue behind it; while a service
// is stopping its key is marked in stopping, and a Register or Unregister
// of that key, or a Register naming its endpoint, waits for the stop to
// finish and then decides on the state it left.
type Registry struct {
	opts Options

	mu        sync.Mutex
	services  map[ServiceKey]*entry
	endpoints map[string]ServiceKey
	contexts  map[index.ContextKey]*contextState
	// stopping holds, per key whose source is being stopped outside mu,
	// a channel closed when the stop is over and its effects are applied.
	stopping map[ServiceKey]chan struct{}

	// recorder, when set, makes each change durable first (under mu).
	recorder Recorder
	// store, when set, owns Register and Unregister (see SetStore).
	store atomic.Pointer[storeRef]
}

// DefaultMaxServices bounds registrations unless Options say otherwise.
const DefaultMaxServices = 4096

// New returns an empty registry.
func New(opts Options) *Registry {
	if opts.MaxServices <= 0 {
		opts.MaxServices = DefaultMaxServices
	}
	return &Registry{
		opts:      opts,
		services:  make(map[ServiceKey]*entry),
		endpoints: make(map[string]ServiceKey),
		contexts:  make(map[index.ContextKey]*contextState),
		stopping:  make(map[ServiceKey]chan struct{}),
	}
}

// Register adds svc, or confirms an identical registration. An identical
// registration of a stale service restarts its source, since registering
// again is the only in-band way out of the stale state. It reports whether
// anything changed. With a shared Store set, the store decides and the
// change reaches this registry through Apply.
func (r *Registry) Register(svc Service) (changed bool, err error) {
	if st := r.sharedStore(); st != nil {
		return st.Register(svc)
	}
	return r.Apply(svc)
}

// Apply is Register on this registry alone, whatever the store: the
// shared store applies the changes it observes through it, and start-up
// registers the config file's services with it.
func (r *Registry) Apply(svc Service) (changed bool, err error) {
	key := svc.Key()
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		done := r.stopping[key]
		if other, ok := r.endpoints[svc.Endpoint]; ok && done == nil {
			done = r.stopping[other]
		}
		if done == nil {
			break
		}
		r.waitLocked(done)
	}

	identical, err := decide(registrySet{r}, &svc, r.opts.MaxServices)
	if err != nil {
		return false, err
	}
	if identical {
		old := r.services[key]
		if old.source == nil || !old.source.Stale() {
			return false, nil
		}
		return r.restart(key, old)
	}
	ctxKey := svc.Context()
	cs := r.contexts[ctxKey]
	// Durable before it takes effect: a registration that was answered 200
	// and then lost by a crash would be a bug.
	if err := r.record(&svc, ""); err != nil {
		return false, err
	}

	if cs == nil {
		cs = &contextState{Entry: r.opts.Contexts.Ensure(ctxKey, svc.Profile)}
		r.contexts[ctxKey] = cs
	}
	e := &entry{svc: svc}
	if svc.IsEngine() {
		e.owner = cs.Table.AddEngineOwner(svc.InstanceID, svc.DPRank)
		cs.Table.SetLayout(e.owner, svc.Groups.Specs())
	}
	src, err := r.start(svc, e.owner)
	if err != nil {
		// Take the recorded registration back; if that fails too, the
		// next start finds a registration whose source could not start,
		// and reports it then.
		if rerr := r.record(nil, ""); rerr != nil {
			r.opts.Logger.Error().Err(rerr).Str("service", string(key)).Msg("could not take back the recorded registration of a service whose source failed to start")
		}
		if svc.IsEngine() {
			cs.Table.RemoveEngineOwner(e.owner)
		}
		if cs.services == 0 {
			delete(r.contexts, ctxKey)
			r.opts.Contexts.Drop(ctxKey)
		}
		return false, err
	}
	e.source = src
	cs.services++
	if svc.IsEngine() {
		cs.engines++
		if cs.engines == 1 {
			r.opts.Contexts.SetEngines(ctxKey, true)
		}
	}
	r.services[key] = e
	r.endpoints[svc.Endpoint] = key
	r.opts.Logger.Info().Str("service", string(key)).Str("type", svc.Type.String()).Str("endpoint", svc.Endpoint).Msg("service registered")
	return true, nil
}

// waitLocked waits, with mu released, until done is closed.
func (r *Registry) waitLocked(done <-chan struct{}) {
	r.mu.Unlock()
	<-done
	r.mu.Lock()
}

// stopReleased stops src with mu released, so reads and scrapes do not
// queue behind a slow stop. The caller holds mu; key stays marked as
// stopping (same-key changes wait for it) until the returned function runs,
// which the caller defers so the mark goes only once its change is done.
func (r *Registry) stopReleased(key ServiceKey, src Source) (unmark func()) {
	done := make(chan struct{})
	r.stopping[key] = done
	r.mu.Unlock()
	src.Stop()
	r.mu.Lock()
	return func() {
		delete(r.stopping, key)
		close(done)
	}
}

// restart replaces a stale service's source; the caller holds mu, which is
// released while the old source stops (it retracted its blocks when it went
// stale) and the key is marked stopping meanwhile.
func (r *Registry) restart(key ServiceKey, e *entry) (bool, error) {
	defer r.stopReleased(key, e.source)()
	src, err := r.start(e.svc, e.owner)
	if err != nil {
		e.source = nil
		return false, err
	}
	e.source = src
	r.opts.Logger.Info().Str("service", string(key)).Msg("stale service restarted by re-registration")
	return true, nil
}

func (r *Registry) start(svc Service, owner index.OwnerID) (Source, error) {
	if r.opts.Start == nil {
		return nil, nil
	}
	src, err := r.opts.Start(svc, owner)
	if err != nil {
		return nil, &SourceError{Key: svc.Key(), Err: err}
	}
	return src, nil
}

// Unregister stops the service's source, removes everything it contributed
// and forgets the context when its last service goes. The service leaves
// listings at once; the source is stopped with the registry unlocked. With
// a shared Store set, the store decides and the change arrives as Remove.
func (r *Registry) Unregister(key ServiceKey) error {
	if st := r.sharedStore(); st != nil {
		return st.Unregister(key)
	}
	return r.unregister(key, true, false)
}

// Remove is Unregister on this registry alone, whatever the store; it
// records nothing (the shared store is the record).
func (r *Registry) Remove(key ServiceKey) error { return r.unregister(key, false, false) }

// unregister is Unregister; record says whether the change is recorded
// (Close's shutdown removals are not: the services come back at restart),
// closing that it is Close's, which the log must not call an
// unregistration.
func (r *Registry) unregister(key ServiceKey, record, closing bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.stopping[key] != nil {
		r.waitLocked(r.stopping[key])
	}
	e, ok := r.services[key]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if record {
		if err := r.record(nil, key); err != nil {
			return err
		}
	}
	stop, clear := r.remove(key, e)
	// The two phases are logged because they are what an unregistration
	// waits for: the source's goroutine, then the owner's removal from the
	// index (its entries are reclaimed in the background when the index
	// has a RemovalPause, as the service's does).
	msg := "service unregistered"
	if closing {
		msg = "subscriber stopped at shutdown; the registration is kept"
	}
	r.opts.Logger.Info().Str("service", string(key)).Dur("source_stop", stop).Dur("index_clear", clear).Msg(msg)
	return nil
}

// remove forgets a registration and returns how long stopping its source and
// clearing its index entries took. The caller holds mu, which is released
// while the source stops; the key is marked stopping meanwhile and keeps its
// endpoint, so neither can be registered again before the old socket is
// closed and the old owner is gone from the index.
func (r *Registry) remove(key ServiceKey, e *entry) (stop, clear time.Duration) {
	delete(r.services, key)
	ctxKey := e.svc.Context()
	cs := r.contexts[ctxKey]
	if e.svc.IsEngine() {
		cs.engines--
		if cs.engines == 0 {
			r.opts.Contexts.SetEngines(ctxKey, false)
		}
	}
	t0 := time.Now()
	if e.source != nil {
		defer r.stopReleased(key, e.source)()
	}
	t1 := time.Now()
	delete(r.endpoints, e.svc.Endpoint)
	if e.svc.IsEngine() {
		cs.Table.RemoveEngineOwner(e.owner)
	}
	t2 := time.Now()
	cs.services--
	if cs.services == 0 {
		delete(r.contexts, ctxKey)
		r.opts.Contexts.Drop(ctxKey)
		if r.opts.OnContextDropped != nil {
			r.opts.OnContextDropped(ctxKey, len(r.contexts))
		}
	}
	return t1.Sub(t0), t2.Sub(t1)
}

// Close unregisters every service, stopping all sources, for shutdown:
// nothing is recorded, so the services come back at the next start.
func (r *Registry) Close() {
	r.mu.Lock()
	keys := make([]ServiceKey, 0, len(r.services))
	for key := range r.services {
		keys = append(keys, key)
	}
	r.mu.Unlock()
	for _, key := range keys {
		_ = r.unregister(key, false, true) // one unregistered meanwhile is gone already
	}
}

// ServiceStatus is a registration as read endpoints show it.
type ServiceStatus struct {
	Service
	Stale bool
	// State is the source's state name ("none" when no source runs).
	State string
	// StateDetail says why the source is in its state when the name
	// alone does not (why it is disconnected: the connection lost, or
	// the endpoint not a ZMQ publisher); empty otherwise.
	StateDetail string
	// Restarts and StaleRecoveries count, since the source started, the
	// publisher restarts it detected and the stale states it left by
	// itself (sources that report them; zero otherwise).
	Restarts, StaleRecoveries uint64
	// Events counts the source's rejected and ignored events by reason
	// (sources that count them; nil otherwise).
	Events EventCounter
}

// EventCounter is a source that counts its rejected and ignored events by
// reason (the ZMQ subscriber does): fn is called for every reason, zero or
// not, that the source reports.
type EventCounter interface {
	EventCounts(fn func(rejected bool, reason string, n uint64))
}

// epochReporter is a source that counts publisher restarts and stale
// recoveries (the ZMQ subscriber does).
type epochReporter interface {
	Restarts() uint64
	StaleRecoveries() uint64
}

// detailReporter is a source that explains its state (the ZMQ
// subscriber, when disconnected).
type detailReporter interface {
	StateDetail() string
}

// Services lists registrations ordered by service key.
func (r *Registry) Services() []ServiceStatus {
	r.mu.Lock()
	out := make([]ServiceStatus, 0, len(r.services))
	for _, e := range r.services {
		st := ServiceStatus{Service: e.svc, State: "none"}
		if e.source != nil {
			st.Stale, st.State = e.source.Stale(), e.source.State()
			if dr, ok := e.source.(detailReporter); ok {
				st.StateDetail = dr.StateDetail()
			}
			if ep, ok := e.source.(epochReporter); ok {
				st.Restarts, st.StaleRecoveries = ep.Restarts(), ep.StaleRecoveries()
			}
			st.Events, _ = e.source.(EventCounter)
		}
		out = append(out, st)
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out
}

// StaleCount is the number of registrations whose source has gone stale.
func (r *Registry) StaleCount() int {
	n := 0
	for _, s := range r.Services() {
		if s.Stale {
			n++
		}
	}
	return n
}

// ContextView is one context as /global_view shows it.
type ContextView struct {
	Context     index.ContextKey
	Profile     hashing.Profile
	PrefixCount int
	// Instances maps each engine instance to its registered ranks, sorted.
	Instances map[string][]int
}

// Contexts lists registered contexts in index.ContextKey.Compare order.
func (r *Registry) Contexts() []ContextView {
	r.mu.Lock()
	out := make([]ContextView, 0, len(r.contexts))
	for k, cs := range r.contexts {
		out = append(out, ContextView{Context: k, Profile: cs.Profile, PrefixCount: cs.Table.PrefixCount(), Instances: cs.Table.Instances()})
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b ContextView) int { return a.Context.Compare(b.Context) })
	return out
}

// Connected reports whether every named service is registered and its source
// has connected to its publisher. Sources that cannot tell (not a
// ConnectionReporter) count as connected once started.
func (r *Registry) Connected(keys ...ServiceKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		e, ok := r.services[k]
		if !ok || e.source == nil {
			return false
		}
		if c, ok := e.source.(ConnectionReporter); ok && !c.Connected() {
			return false
		}
	}
	return true
}
