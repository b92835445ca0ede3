package registry

import "fmt"

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
// the rules Apply enforces, for a store that holds the set elsewhere:
// identical reports a registration already present with the same
// configuration (success without change); a different configuration for
// the key, an endpoint used by another service, or a context bound to
// another hash profile is a *ConflictError; a full set is
// ErrTooManyServices (max <= 0 means DefaultMaxServices).
func Check(existing []Service, svc Service, max int) (identical bool, err error) {
	if max <= 0 {
		max = DefaultMaxServices
	}
	key := svc.Key()
	ctx := svc.Context()
	for i := range existing {
		if existing[i].Key() == key {
			if !sameConfig(&existing[i], &svc) {
				return false, &ConflictError{Msg: fmt.Sprintf("service %s is already registered with a different configuration", key)}
			}
			return true, nil
		}
	}
	for i := range existing {
		if existing[i].Endpoint == svc.Endpoint {
			return false, &ConflictError{Msg: fmt.Sprintf("endpoint %s is already used by service %s", svc.Endpoint, existing[i].Key())}
		}
	}
	for i := range existing {
		if existing[i].Context() == ctx && existing[i].Profile != svc.Profile {
			return false, &ConflictError{Msg: "every service of a context must use the same hash profile; this context is bound to another one"}
		}
	}
	if len(existing) >= max {
		return false, ErrTooManyServices
	}
	return false, nil
}
