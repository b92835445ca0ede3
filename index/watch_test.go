package index

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// lockCheckingWatcher records changes and, for every key change, whether
// the key's stripe was write-locked while it was told.
type lockCheckingWatcher struct {
	got      []ChangeKind
	unlocked []ChangeKind
}

func (w *lockCheckingWatcher) Watching() bool { return true }

func (w *lockCheckingWatcher) Changed(c Change) {
	w.got = append(w.got, c.Kind)
	if c.Kind != KeyAdded && c.Kind != KeyEvicted {
		return
	}
	if s := c.Table.stripeFor(mix(c.Key)); s.mu.TryLock() {
		s.mu.Unlock()
		w.unlocked = append(w.unlocked, c.Kind)
	}
}

// TestKeyChangesAreToldUnderTheStripeLock: every writer tells the watcher
// of a key's change while it still holds the key's stripe, so the changes
// of one key reach watchers in the order the index applied them (an add
// told after unlocking could overtake a concurrent removal of the key).
func TestKeyChangesAreToldUnderTheStripeLock(t *testing.T) {
	ix := New(Options{Stripes: 4})
	w := &lockCheckingWatcher{}
	ix.SetWatcher(w)
	ctx := ix.EnsureTable(testCtx)
	scope := ix.EnsureScope(ScopeKey{Tenant: "t", Model: "m", Scheme: "vllm"})
	a, r := ctx.AddEngineOwner("a", 0), scope.AddEngineOwner("r", 0)

	ctx.Store(a, Put{Key: 1, Tier: Device})
	ctx.Store(a, Put{Key: 1, Tier: CPULocal}) // the owner already holds the key: no change told
	ctx.Remove(a, Put{Key: 1, Tier: Device})
	ctx.Remove(a, Put{Key: 1, Tier: CPULocal})
	ctx.acquireShared(CPUShare, 2)
	ctx.acquireShared(CPUShare, 2)
	ctx.releaseShared(CPUShare, 2)
	ctx.releaseShared(CPUShare, 2)
	scope.Store(r, Put{Key: 3, Tier: Device, Replace: true})
	scope.Remove(r, Put{Key: 3, Replace: true})

	want := []ChangeKind{OwnerUpdated, OwnerUpdated,
		KeyAdded, KeyEvicted, KeyAdded, KeyEvicted, KeyAdded, KeyEvicted}
	if diff := cmp.Diff(want, w.got); diff != "" {
		t.Errorf("changes told (-want +got):\n%s", diff)
	}
	if len(w.unlocked) != 0 {
		t.Errorf("told with the key's stripe unlocked: %v", w.unlocked)
	}
}
