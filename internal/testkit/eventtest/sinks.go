package eventtest

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
)

// Owner is the engine owner id every test registration is given.
const Owner index.OwnerID = 7

// Op is one recorded sink call.
type Op struct {
	Kind  string // store, remove, clear, acquire, release
	Owner index.OwnerID
	Tier  index.Tier
	Key   uint64
	Mask  index.TierMask
	Group int // KV-cache group of an engine store or remove
}

func (o Op) String() string {
	if o.Kind == "clear" {
		return fmt.Sprintf("clear(owner %d, mask %03b)", o.Owner, o.Mask)
	}
	if o.Group != 0 {
		return fmt.Sprintf("%s(owner %d, tier %d, group %d, %d)", o.Kind, o.Owner, o.Tier, o.Group, o.Key)
	}
	return fmt.Sprintf("%s(owner %d, tier %d, %d)", o.Kind, o.Owner, o.Tier, o.Key)
}

// Recorder is an engine sink and a shared sink (the method sets of the
// events package's EngineSink and SharedSink) that logs every call. It is
// safe for concurrent use: the subscriber calls it from its own goroutine.
type Recorder struct {
	mu  sync.Mutex
	ops []Op
}

func (r *Recorder) add(o Op) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}

// Store records an engine store; it cannot say where a block lies, so its
// hint is 0.
func (r *Recorder) Store(id index.OwnerID, p index.Put) (uint32, bool) {
	r.add(Op{Kind: "store", Owner: id, Tier: p.Tier, Key: p.Key, Group: p.Group})
	return 0, true
}

// Remove records an engine removal.
func (r *Recorder) Remove(id index.OwnerID, p index.Put) bool {
	r.add(Op{Kind: "remove", Owner: id, Tier: p.Tier, Key: p.Key, Group: p.Group})
	return true
}

// NoteGroup accepts every layout but one past index.MaxGroups groups: the
// recorder keeps no layout, so conflicts are tested against a real table.
func (r *Recorder) NoteGroup(_ index.OwnerID, g int, _ index.GroupSpec) index.GroupNote {
	if g >= index.MaxGroups {
		return index.GroupTooMany
	}
	return index.GroupAgrees
}

// ClearOwner records an engine clear.
func (r *Recorder) ClearOwner(id index.OwnerID, m index.TierMask) {
	r.add(Op{Kind: "clear", Owner: id, Mask: m})
}

// Acquire records a shared reference taken.
func (r *Recorder) Acquire(ref *index.SharedRef) bool {
	r.add(Op{Kind: "acquire", Tier: ref.Tier(), Key: ref.Key(), Group: ref.Group()})
	return true
}

// Release records a shared reference dropped.
func (r *Recorder) Release(ref *index.SharedRef) {
	r.add(Op{Kind: "release", Tier: ref.Tier(), Key: ref.Key(), Group: ref.Group()})
}

// Adjust accepts a change of a reference's accounted bytes; the recorder
// keeps no budget, so it is not an operation.
func (r *Recorder) Adjust(*index.SharedRef, int64) bool { return true }

// Take returns the calls recorded so far and forgets them.
func (r *Recorder) Take() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.ops
	r.ops = nil
	return out
}

// Snapshot returns a copy of the calls recorded so far.
func (r *Recorder) Snapshot() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// SharedBalance returns acquires minus releases per (tier, key), without
// the pairs that balance out; a KV-cache group other than 0 is in the
// first word's bits above the tier's 8.
func SharedBalance(ops []Op) map[[2]uint64]int {
	m := map[[2]uint64]int{}
	for _, o := range ops {
		k := [2]uint64{uint64(o.Tier) | uint64(o.Group)<<8, o.Key}
		switch o.Kind {
		case "acquire":
			m[k]++
		case "release":
			m[k]--
		}
		if m[k] == 0 {
			delete(m, k)
		}
	}
	return m
}

// ExpectedOps translates fixture effects into the sink calls they imply.
// prior are the ops recorded before the fixture (for clear_shared, which
// releases every binding the requires created).
func ExpectedOps(t testing.TB, f *Fixture, prior []Op) []Op {
	t.Helper()
	var out []Op
	for _, ef := range f.Expect.Effects {
		switch ef.Op {
		case "store", "remove":
			tier, ok := TierNames[ef.Tier]
			if !ok {
				t.Fatalf("%s: unknown tier %q", f.ID, ef.Tier)
			}
			kind := ef.Op
			owner := Owner
			if strings.HasPrefix(ef.Owner, "shared ") {
				kind = map[string]string{"store": "acquire", "remove": "release"}[ef.Op]
				owner = 0
			}
			for _, p := range ef.Prefixes {
				out = append(out, Op{Kind: kind, Owner: owner, Tier: tier, Key: ParseU64(t, p), Group: ef.Group})
			}
		case "clear":
			var m index.TierMask
			for _, tn := range ef.Tiers {
				m |= 1 << TierNames[tn]
			}
			out = append(out, Op{Kind: "clear", Owner: Owner, Mask: m})
		case "clear_shared":
			for k, n := range SharedBalance(prior) {
				for range n {
					out = append(out, Op{Kind: "release", Tier: index.Tier(k[0] & 0xff), Key: k[1], Group: int(k[0] >> 8)})
				}
			}
		default:
			t.Fatalf("%s: unknown effect %q", f.ID, ef.Op)
		}
	}
	return out
}

// SortOps returns ops in a canonical order, for comparing calls whose
// order the contract leaves open.
func SortOps(ops []Op) []Op {
	ops = slices.Clone(ops)
	slices.SortFunc(ops, func(a, b Op) int {
		return strings.Compare(a.String(), b.String())
	})
	return ops
}

// CheckApplied compares an applied fixture with its expectation: results
// are the result names of its events in order (detail is printed beside a
// mismatch), prior the ops its requires recorded and got the ops it
// recorded itself.
func CheckApplied(t testing.TB, f *Fixture, results []string, detail any, prior, got []Op) {
	t.Helper()
	if f.Expect.Events != nil {
		var want []string
		for _, ev := range f.Expect.Events {
			want = append(want, ResultName(t, ev))
		}
		if diff := cmp.Diff(want, results); diff != "" {
			t.Errorf("event outcomes (-want +got):\n%s\noutcomes %+v", diff, detail)
		}
	}
	if diff := cmp.Diff(SortOps(ExpectedOps(t, f, prior)), SortOps(got)); diff != "" {
		t.Errorf("index ops (-want +got):\n%s", diff)
	}
}
