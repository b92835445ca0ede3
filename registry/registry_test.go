package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

type fakeSource struct {
	mu      sync.Mutex
	stopped int
	stale   bool
}

func (f *fakeSource) Stop()       { f.mu.Lock(); f.stopped++; f.mu.Unlock() }
func (f *fakeSource) Stale() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.stale }
func (f *fakeSource) State() string {
	if f.Stale() {
		return "stale"
	}
	return "live"
}

type factory struct {
	started []*fakeSource
	fail    error
}

func (f *factory) start(Service, index.OwnerID) (Source, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	s := &fakeSource{}
	f.started = append(f.started, s)
	return s, nil
}

func profile(t *testing.T, seed string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", IndexProjection: "low64_be", PythonHashSeed: &seed})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func svc(t *testing.T, instance string, rank int, endpoint string) Service {
	return Service{Endpoint: endpoint, Type: sourcetype.VLLM, ModelName: "m", TenantID: "default", InstanceID: instance, BlockSize: 16, DPRank: rank, Profile: profile(t, "0")}
}

func newReg(f *factory, max int) (*Registry, *index.Index) {
	ix := index.New(index.Options{})
	return New(Options{Contexts: contexts.New(ix), Start: f.start, MaxServices: max}), ix
}

func TestRegisterRules(t *testing.T) {
	f := &factory{}
	r, ix := newReg(f, 3)
	a := svc(t, "a", 0, "tcp://h:1")
	if changed, err := r.Register(a); err != nil || !changed {
		t.Fatalf("first register: changed=%v err=%v", changed, err)
	}
	if changed, err := r.Register(a); err != nil || changed {
		t.Fatalf("identical register: changed=%v err=%v", changed, err)
	}
	zero := 0
	a0 := a
	a0.CacheGroup = &zero
	if changed, err := r.Register(a0); err != nil || changed {
		t.Fatalf("cache_group 0 vs nil is the same registration: changed=%v err=%v", changed, err)
	}
	var ce *ConflictError
	diff := a
	diff.ModelName = "other"
	if _, err := r.Register(diff); !errors.As(err, &ce) {
		t.Errorf("different config: %v, want ConflictError", err)
	}
	if _, err := r.Register(svc(t, "b", 0, "tcp://h:1")); !errors.As(err, &ce) {
		t.Errorf("endpoint reuse: %v, want ConflictError", err)
	}
	other := svc(t, "b", 0, "tcp://h:2")
	other.Profile = profile(t, "00")
	if _, err := r.Register(other); !errors.As(err, &ce) {
		t.Errorf("profile conflict: %v, want ConflictError", err)
	}
	if len(f.started) != 1 {
		t.Errorf("started %d sources, want 1", len(f.started))
	}
	if _, err := r.Register(svc(t, "b", 0, "tcp://h:2")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Register(svc(t, "c", 0, "tcp://h:3")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Register(svc(t, "d", 0, "tcp://h:4")); !errors.Is(err, ErrTooManyServices) {
		t.Errorf("over the limit: %v", err)
	}
	if got := len(r.Services()); got != 3 {
		t.Errorf("%d services", got)
	}
	ctx := a.Context()
	if _, ok := r.opts.Contexts.WithEngines(ctx); !ok {
		t.Error("context not bound after engine registration")
	}
	for _, k := range []ServiceKey{"a|default|0", "b|default|0", "c|default|0"} {
		if err := r.Unregister(k); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Unregister("a|default|0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second unregister: %v", err)
	}
	for i, s := range f.started {
		if s.stopped != 1 {
			t.Errorf("source %d stopped %d times", i, s.stopped)
		}
	}
	if ix.Table(ctx) != nil {
		t.Error("table survives its last service")
	}
	if _, ok := r.opts.Contexts.WithEngines(ctx); ok {
		t.Error("context still bound")
	}
	// The forgotten context accepts another profile now.
	if _, err := r.Register(other); err != nil {
		t.Errorf("rebinding a forgotten context: %v", err)
	}
}

func TestStaleServiceRestartsOnIdenticalRegister(t *testing.T) {
	f := &factory{}
	r, _ := newReg(f, 0)
	a := svc(t, "a", 0, "tcp://h:1")
	if _, err := r.Register(a); err != nil {
		t.Fatal(err)
	}
	f.started[0].stale = true
	if r.StaleCount() != 1 || !r.Services()[0].Stale {
		t.Fatal("stale not reported")
	}
	changed, err := r.Register(a)
	if err != nil || !changed {
		t.Fatalf("re-register stale: changed=%v err=%v", changed, err)
	}
	if len(f.started) != 2 || f.started[0].stopped != 1 {
		t.Fatalf("restart: started=%d oldStopped=%d", len(f.started), f.started[0].stopped)
	}
	if r.StaleCount() != 0 {
		t.Error("still stale after restart")
	}
}

func TestOnContextDropped(t *testing.T) {
	var dropped []index.ContextKey
	var remaining []int
	ix := index.New(index.Options{})
	r := New(Options{Contexts: contexts.New(ix), Start: (&factory{}).start, OnContextDropped: func(k index.ContextKey, n int) {
		dropped = append(dropped, k)
		remaining = append(remaining, n)
	}})
	a, b := svc(t, "a", 0, "tcp://h:1"), svc(t, "b", 0, "tcp://h:2")
	other := svc(t, "c", 0, "tcp://h:3")
	other.ModelName = "other-model"
	for _, s := range []Service{a, b, other} {
		if _, err := r.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Unregister(a.Key()); err != nil || len(dropped) != 0 {
		t.Fatalf("context dropped while b remains: %v %v", err, dropped)
	}
	if err := r.Unregister(b.Key()); err != nil || len(dropped) != 1 || dropped[0] != a.Context() || remaining[0] != 1 {
		t.Fatalf("last service gone: %v %v %v", err, dropped, remaining)
	}
	if err := r.Unregister(other.Key()); err != nil || len(dropped) != 2 || dropped[1] != other.Context() || remaining[1] != 0 {
		t.Fatalf("last context gone: %v %v %v", err, dropped, remaining)
	}
}

func TestStartFailureChangesNothing(t *testing.T) {
	f := &factory{fail: errors.New("boom")}
	r, ix := newReg(f, 0)
	a := svc(t, "a", 0, "tcp://h:1")
	if _, err := r.Register(a); err == nil {
		t.Fatal("want error")
	}
	if len(r.Services()) != 0 || ix.Table(a.Context()) != nil || len(r.Contexts()) != 0 {
		t.Error("failed registration left state behind")
	}
	f.fail = nil
	if _, err := r.Register(a); err != nil {
		t.Errorf("register after failure: %v", err)
	}
}

func TestMooncakeDoesNotBindContext(t *testing.T) {
	r, _ := newReg(&factory{}, 0)
	m := svc(t, "master", 0, "tcp://h:9")
	m.Type = sourcetype.Mooncake
	if _, err := r.Register(m); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.opts.Contexts.WithEngines(m.Context()); ok {
		t.Error("a Mooncake registration alone must not bind its context for events")
	}
	cv := r.Contexts()
	if len(cv) != 1 || len(cv[0].Instances) != 0 {
		t.Errorf("contexts %+v: want one context without engine instances", cv)
	}
	if _, err := r.Register(svc(t, "e", 0, "tcp://h:10")); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.opts.Contexts.WithEngines(m.Context()); !ok {
		t.Error("engine registration must bind the context")
	}
	r.Close()
	if len(r.Services()) != 0 {
		t.Error("Close left services")
	}
}

// Close stops every source but keeps the registrations for the restart:
// its log line says so, and only a real unregistration says unregistered.
func TestCloseLogsStoppedNotUnregistered(t *testing.T) {
	var logs bytes.Buffer
	ix := index.New(index.Options{})
	f := &factory{}
	r := New(Options{Contexts: contexts.New(ix), Start: f.start, Logger: zerolog.New(&logs)})
	a, b := svc(t, "a", 0, "tcp://h:1"), svc(t, "b", 0, "tcp://h:2")
	for _, s := range []Service{a, b} {
		if _, err := r.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Unregister(a.Key()); err != nil {
		t.Fatal(err)
	}
	r.Close()
	msgs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if s, ok := l["service"].(string); ok {
			msgs[s] = l["message"].(string)
		}
	}
	want := map[string]string{
		string(a.Key()): "service unregistered",
		string(b.Key()): "subscriber stopped at shutdown; the registration is kept",
	}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Errorf("log messages (-want +got):\n%s", diff)
	}
	for i, s := range f.started {
		if s.stopped != 1 {
			t.Errorf("source %d stopped %d times", i, s.stopped)
		}
	}
}

// detailSource is a source that explains its state, as the ZMQ
// subscriber does when disconnected.
type detailSource struct {
	fakeSource
	detail string
}

func (d *detailSource) State() string       { return "disconnected" }
func (d *detailSource) StateDetail() string { return d.detail }

// TestServicesCarryStateDetail: a source's StateDetail reaches the
// listing; a source without one lists none.
func TestServicesCarryStateDetail(t *testing.T) {
	const why = "not a ZMQ publisher: the peer at the endpoint broke the ZMTP handshake (protocol error)"
	ix := index.New(index.Options{})
	r := New(Options{Contexts: contexts.New(ix), Start: func(s Service, _ index.OwnerID) (Source, error) {
		if s.InstanceID == "d" {
			return &detailSource{detail: why}, nil
		}
		return &fakeSource{}, nil
	}})
	defer r.Close()
	for _, id := range []string{"d", "plain"} {
		if _, err := r.Register(svc(t, id, 0, "tcp://h:"+id)); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string][2]string{}
	for _, s := range r.Services() {
		got[s.InstanceID] = [2]string{s.State, s.StateDetail}
	}
	want := map[string][2]string{"d": {"disconnected", why}, "plain": {"live", ""}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}
