package registry

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/internal/hashing"
)

// recorder keeps what the registry asked to record, failing on demand.
type recorder struct {
	sets [][]ServiceKey
	fail error
}

func (rc *recorder) record(all []Service) error {
	if rc.fail != nil {
		return rc.fail
	}
	keys := []ServiceKey{}
	for _, s := range all {
		keys = append(keys, s.Key())
	}
	rc.sets = append(rc.sets, keys)
	return nil
}

func keysOf(r *Registry) []ServiceKey {
	out := []ServiceKey{}
	for _, s := range r.Services() {
		out = append(out, s.Key())
	}
	return out
}

func TestRecorderSeesEachChangeFirst(t *testing.T) {
	f := &factory{}
	r, _ := newReg(f, 10)
	rc := &recorder{}
	r.SetRecorder(rc.record)
	a, b := svc(t, "a", 0, "tcp://h:1"), svc(t, "b", 0, "tcp://h:2")
	for _, s := range []Service{b, a, a} { // the repeat changes nothing
		if _, err := r.Register(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Unregister(b.Key()); err != nil {
		t.Fatal(err)
	}
	want := [][]ServiceKey{{"b|default|0"}, {"a|default|0", "b|default|0"}, {"a|default|0"}}
	if diff := cmp.Diff(want, rc.sets); diff != "" {
		t.Errorf("recorded sets (-want +got):\n%s", diff)
	}
	// Shutting down forgets nothing durable.
	r.Close()
	if len(rc.sets) != 3 {
		t.Errorf("Close recorded %v", rc.sets[3:])
	}
}

// A change that cannot be recorded is not applied: no service, no context,
// no source, and an unregistration leaves the service running.
func TestUnrecordedChangeIsNotApplied(t *testing.T) {
	f := &factory{}
	r, ix := newReg(f, 10)
	rc := &recorder{}
	r.SetRecorder(rc.record)
	a := svc(t, "a", 0, "tcp://h:1")
	if _, err := r.Register(a); err != nil {
		t.Fatal(err)
	}
	rc.fail = errors.New("disk full")
	b := svc(t, "b", 0, "tcp://h:2")
	b.ModelName = "other"
	if _, err := r.Register(b); !errors.Is(err, ErrNotRecorded) {
		t.Fatalf("Register: %v, want ErrNotRecorded", err)
	}
	if err := r.Unregister(a.Key()); !errors.Is(err, ErrNotRecorded) {
		t.Fatalf("Unregister: %v, want ErrNotRecorded", err)
	}
	if diff := cmp.Diff([]ServiceKey{"a|default|0"}, keysOf(r)); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	if len(f.started) != 1 || f.started[0].stopped != 0 {
		t.Errorf("sources started %d, first stopped %d times", len(f.started), f.started[0].stopped)
	}
	if ix.Table(b.Context()) != nil {
		t.Error("the unrecorded registration's context exists")
	}
	if _, ok := r.opts.Contexts.WithEngines(a.Context()); !ok {
		t.Error("the kept registration's context is unbound")
	}
}

// A source that fails to start takes its recorded registration back.
func TestFailedStartIsTakenBack(t *testing.T) {
	f := &factory{fail: errors.New("no socket")}
	r, _ := newReg(f, 10)
	rc := &recorder{}
	r.SetRecorder(rc.record)
	if _, err := r.Register(svc(t, "a", 0, "tcp://h:1")); err == nil {
		t.Fatal("Register succeeded")
	}
	want := [][]ServiceKey{{"a|default|0"}, {}}
	if diff := cmp.Diff(want, rc.sets, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("recorded sets (-want +got):\n%s", diff)
	}
}

func TestFreeze(t *testing.T) {
	f := &factory{}
	r, _ := newReg(f, 10)
	a, b := svc(t, "a", 0, "tcp://h:1"), svc(t, "b", 1, "tcp://h:2")
	r.Register(b)
	r.Register(a)
	var got []Frozen
	r.Freeze(func(fs []Frozen) { got = fs })
	want := []Frozen{{Service: a, Source: f.started[1]}, {Service: b, Source: f.started[0]}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(hashing.Profile{}), cmp.Comparer(func(x, y Source) bool { return x == y })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
