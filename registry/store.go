package registry

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// Store decides registration changes that several replicas share. The
// single-node service has none: the registry itself decides, and a
// Recorder makes its decisions durable in the state directory. A shared
// store (etcd) decides each change against the shared set atomically and
// applies what it observes, from whichever replica, through Apply and
// Remove, so every replica runs the same subscriptions.
type Store interface {
	Register(svc Service) (changed bool, err error)
	Unregister(key ServiceKey) error
}

type storeRef struct{ Store }

// SetStore hands Register and Unregister to st from now on (nil: back to
// the registry alone). Start-up sets it once the shared set is applied.
func (r *Registry) SetStore(st Store) {
	if st == nil {
		r.store.Store(nil)
		return
	}
	r.store.Store(&storeRef{st})
}

func (r *Registry) sharedStore() Store {
	if ref := r.store.Load(); ref != nil {
		return ref.Store
	}
	return nil
}

// Check decides a registration against a set of existing ones by exactly
// the rules Apply enforces (decide), for a store that holds the set
// elsewhere: identical reports a registration already present with the
// same configuration (success without change); a different configuration
// for the key, an endpoint used by another service, or a context bound to
// another hash profile is a *ConflictError; a full set is
// ErrTooManyServices (max <= 0 means DefaultMaxServices).
func Check(existing []Service, svc Service, max int) (identical bool, err error) {
	if max <= 0 {
		max = DefaultMaxServices
	}
	return decide(serviceList(existing), &svc, max)
}

// existingSet is what the registration rules ask of the services already
// registered: a registry's maps or a store's list.
type existingSet interface {
	byKey(key ServiceKey) (*Service, bool)
	byEndpoint(endpoint string) (ServiceKey, bool)
	contextProfile(ctx index.ContextKey) (hashing.Profile, bool)
	size() int
}

// decide is the one set of registration rules, in the order they are
// checked: a registration of a known key is identical (same configuration)
// or a conflict; then an endpoint used by another service, a context bound
// to another hash profile, and a full set (at most max services) refuse it.
func decide(set existingSet, svc *Service, max int) (identical bool, err error) {
	key := svc.Key()
	if old, ok := set.byKey(key); ok {
		if !sameConfig(old, svc) {
			return false, &ConflictError{Msg: fmt.Sprintf("service %s is already registered with a different configuration", key)}
		}
		return true, nil
	}
	if other, ok := set.byEndpoint(svc.Endpoint); ok {
		return false, &ConflictError{Msg: fmt.Sprintf("endpoint %s is already used by service %s", svc.Endpoint, other)}
	}
	if p, ok := set.contextProfile(svc.Context()); ok && p != svc.Profile {
		return false, &ConflictError{Msg: "every service of a context must use the same hash profile; this context is bound to another one"}
	}
	if set.size() >= max {
		return false, ErrTooManyServices
	}
	return false, nil
}

// serviceList is a store's set, searched in order.
type serviceList []Service

func (l serviceList) byKey(key ServiceKey) (*Service, bool) {
	for i := range l {
		if l[i].Key() == key {
			return &l[i], true
		}
	}
	return nil, false
}

func (l serviceList) byEndpoint(endpoint string) (ServiceKey, bool) {
	for i := range l {
		if l[i].Endpoint == endpoint {
			return l[i].Key(), true
		}
	}
	return "", false
}

func (l serviceList) contextProfile(ctx index.ContextKey) (hashing.Profile, bool) {
	for i := range l {
		if l[i].Context() == ctx {
			return l[i].Profile, true
		}
	}
	return hashing.Profile{}, false
}

func (l serviceList) size() int { return len(l) }

// registrySet is the registry's own set; mu is held.
type registrySet struct{ r *Registry }

func (s registrySet) byKey(key ServiceKey) (*Service, bool) {
	if e, ok := s.r.services[key]; ok {
		return &e.svc, true
	}
	return nil, false
}

func (s registrySet) byEndpoint(endpoint string) (ServiceKey, bool) {
	k, ok := s.r.endpoints[endpoint]
	return k, ok
}

func (s registrySet) contextProfile(ctx index.ContextKey) (hashing.Profile, bool) {
	if cs := s.r.contexts[ctx]; cs != nil {
		return cs.Profile, true
	}
	return hashing.Profile{}, false
}

func (s registrySet) size() int { return len(s.r.services) }
