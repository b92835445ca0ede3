package registry

import (
	"errors"
	"fmt"
	"sort"
)

// ErrNotRecorded is a registration change that could not be made durable;
// it was not applied. The API answers it with 503: the service is
// unavailable for changes until its state directory is writable again.
var ErrNotRecorded = errors.New("registration change could not be recorded")

// Recorder makes a complete set of registrations durable; it returns only
// once the set would survive a crash. The registry calls it, with its lock
// held, before applying each change.
type Recorder func(all []Service) error

// SetRecorder makes every later accepted Register and Unregister durable
// through rec before it takes effect (nil: no recording). Start-up sets it
// once the restored registrations are in place.
func (r *Registry) SetRecorder(rec Recorder) {
	r.mu.Lock()
	r.recorder = rec
	r.mu.Unlock()
}

// record makes the set the registry would hold after a change durable:
// the current services, plus add (when not nil), minus drop (when not "").
// The caller holds r.mu.
func (r *Registry) record(add *Service, drop ServiceKey) error {
	if r.recorder == nil {
		return nil
	}
	all := make([]Service, 0, len(r.services)+1)
	for k, e := range r.services {
		if k != drop {
			all = append(all, e.svc)
		}
	}
	if add != nil {
		all = append(all, *add)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Key() < all[j].Key() })
	if err := r.recorder(all); err != nil {
		return fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	return nil
}

// Frozen is one registration while Freeze holds the registry still.
type Frozen struct {
	Service Service
	// Source is nil when no source runs (tests without a factory).
	Source Source
}

// Freeze calls f with every registration, ordered by key, while no
// registration can change; snapshots use it to take their cut. f must not
// call back into the registry.
func (r *Registry) Freeze(f func([]Frozen)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Frozen, 0, len(r.services))
	for _, e := range r.services {
		out = append(out, Frozen{Service: e.svc, Source: e.source})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Service.Key() < out[j].Service.Key() })
	f(out)
}
