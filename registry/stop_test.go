package registry

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
)

// slowSource's Stop blocks until release is closed, so a test can hold a
// stop in progress and see what the registry does meanwhile.
type slowSource struct {
	entered chan struct{} // closed when Stop starts
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	done    bool // Stop has returned
	stale   bool
}

func newSlowSource() *slowSource {
	return &slowSource{entered: make(chan struct{}), release: make(chan struct{})}
}

func (s *slowSource) Stop() {
	s.once.Do(func() { close(s.entered) })
	<-s.release
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
}
func (s *slowSource) stopped() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.done }
func (s *slowSource) Stale() bool   { s.mu.Lock(); defer s.mu.Unlock(); return s.stale }
func (s *slowSource) State() string { return "live" }

// slowFactory hands out slowSources and records them; only the first
// blocks in Stop until released, later ones stop at once.
type slowFactory struct {
	mu      sync.Mutex
	started []*slowSource
}

func (f *slowFactory) start(Service, index.OwnerID) (Source, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := newSlowSource()
	if len(f.started) > 0 {
		close(s.release)
	}
	f.started = append(f.started, s)
	return s, nil
}

func (f *slowFactory) source(i int) *slowSource {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started[i]
}

// within fails the test if f does not return before a generous deadline:
// it guards against a deadlock, it does not measure anything.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s blocked behind a source's stop", what)
	}
}

// TestReadsDoNotWaitForAStop: while an unregistered service's source is
// still stopping, listings, contexts and readiness answer, and the service
// is already gone from the listing.
func TestReadsDoNotWaitForAStop(t *testing.T) {
	f := &slowFactory{}
	ix := index.New(index.Options{})
	r := New(Options{Contexts: contexts.New(ix), Start: f.start})
	if _, err := r.Register(svc(t, "a", 0, "tcp://h:1")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Register(svc(t, "b", 0, "tcp://h:2")); err != nil {
		t.Fatal(err)
	}
	unregistered := make(chan error, 1)
	go func() { unregistered <- r.Unregister(KeyOf("a", "default", 0)) }()
	src := f.source(0)
	<-src.entered

	var keys []ServiceKey
	within(t, "Services", func() {
		for _, s := range r.Services() {
			keys = append(keys, s.Key())
		}
	})
	if diff := cmp.Diff([]ServiceKey{KeyOf("b", "default", 0)}, keys); diff != "" {
		t.Errorf("services while stopping (-want +got):\n%s", diff)
	}
	within(t, "Contexts", func() { r.Contexts() })
	within(t, "Connected", func() { r.Connected(KeyOf("b", "default", 0)) })
	within(t, "StaleCount", func() { r.StaleCount() })

	close(src.release)
	if err := <-unregistered; err != nil {
		t.Fatal(err)
	}
	r.Close()
	if n := len(ix.Tables()); n != 0 {
		t.Errorf("%d tables left after Close", n)
	}
}

// TestSameKeyWaitsForTheStop: a Register of the key being unregistered,
// and a Register of another key on its endpoint, return only after the old
// source has stopped, and then find the key free; a second Unregister of
// it waits and answers not found. The index ends with exactly the owners
// registered.
func TestSameKeyWaitsForTheStop(t *testing.T) {
	f := &slowFactory{}
	ix := index.New(index.Options{})
	r := New(Options{Contexts: contexts.New(ix), Start: f.start})
	a := svc(t, "a", 0, "tcp://h:1")
	if _, err := r.Register(a); err != nil {
		t.Fatal(err)
	}
	old := f.source(0)
	unregistered := make(chan error, 1)
	go func() { unregistered <- r.Unregister(a.Key()) }()
	<-old.entered

	type result struct {
		err         error
		oldStopped  bool
		description string
	}
	results := make(chan result, 3)
	go func() {
		_, err := r.Register(a)
		results <- result{err, old.stopped(), "register same key"}
	}()
	go func() {
		err := r.Unregister(a.Key())
		results <- result{err, old.stopped(), "unregister again"}
	}()
	close(old.release)
	if err := <-unregistered; err != nil {
		t.Fatal(err)
	}
	got := map[string]result{}
	for range 2 {
		res := <-results
		got[res.description] = res
	}
	// The second Unregister either ran after the stop and before the new
	// Register (not found), or after the new Register (removing it); both
	// are consistent. Whatever ran, it ran after the old source stopped.
	for d, res := range got {
		if !res.oldStopped {
			t.Errorf("%s returned before the old source stopped", d)
		}
	}
	if err := got["register same key"].err; err != nil {
		t.Errorf("register same key: %v", err)
	}
	if err := got["unregister again"].err; err != nil && !errors.Is(err, ErrNotFound) {
		t.Errorf("unregister again: %v", err)
	}
	// Whatever the order, the index holds (a, 0) exactly when the registry does.
	registered := len(r.Services()) == 1
	var owners map[string][]int
	if tbl := ix.Table(a.Context()); tbl != nil {
		owners = tbl.Instances()
	}
	want := map[string][]int(nil)
	if registered {
		want = map[string][]int{"a": {0}}
	}
	if diff := cmp.Diff(want, owners, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("index owners (-want +got), registered=%v:\n%s", registered, diff)
	}
	r.Close()
}
