package index

// ChangeKind says what happened to the index.
type ChangeKind uint8

const (
	// KeyAdded: an owner (or a shared tier) came to hold a key it did not.
	KeyAdded ChangeKind = iota + 1
	// KeyEvicted: an owner (or a shared tier) stopped holding a key.
	KeyEvicted
	// OwnerCleared: an owner's entries were cleared (a clear event, a
	// stale source, an unregistration, a producer's clear or expiry).
	OwnerCleared
	// OwnerUpdated: an owner was registered.
	OwnerUpdated
)

// Change is one change as it is applied. Instance is the owner's instance
// ("" for a shared tier, which belongs to no instance); Key is meaningful
// for KeyAdded and KeyEvicted.
type Change struct {
	Kind     ChangeKind
	Table    *Table
	Instance string
	Key      uint64
}

// Watcher receives every change to the index, on the goroutine applying
// it. Watching is called first on every change and must be cheap (an
// atomic load); Changed only while it reports true, and must never block,
// since ingestion waits for it.
type Watcher interface {
	Watching() bool
	Changed(Change)
}

// watcherBox lets an interface value live in an atomic.Pointer.
type watcherBox struct{ w Watcher }

// SetWatcher installs the index's one watcher (nil removes it). Changes
// applied before it returns may or may not reach the new watcher.
func (ix *Index) SetWatcher(w Watcher) {
	if w == nil {
		ix.watch.Store(nil)
		return
	}
	ix.watch.Store(&watcherBox{w})
}

// watcher returns the installed watcher while it is watching, else nil.
func (t *Table) watcher() Watcher {
	if t.ix == nil {
		return nil
	}
	if b := t.ix.watch.Load(); b != nil && b.w.Watching() {
		return b.w
	}
	return nil
}

// notify tells the watcher, if any, that owner id's holding of key
// changed (id 0: a shared tier). Writers call it holding key's stripe
// lock, so that a key's changes reach the watcher in the order they were
// applied: told after unlocking, an add racing a removal of the same key
// (two sources sharing a Mooncake object) could arrive after it, and a
// stream would keep a key the index no longer has. Watchers never block,
// so the lock is held no longer than a channel offer.
func (t *Table) notify(kind ChangeKind, id OwnerID, key uint64) {
	w := t.watcher()
	if w == nil {
		return
	}
	inst := ""
	if id != 0 {
		v := t.view.Load()
		if p := v.position(id); p >= 0 {
			inst = v.owners[p].instance
		}
	}
	w.Changed(Change{Kind: kind, Table: t, Instance: inst, Key: key})
}

// notifyOwner tells the watcher, if any, about a whole owner.
func (t *Table) notifyOwner(kind ChangeKind, instance string) {
	if w := t.watcher(); w != nil {
		w.Changed(Change{Kind: kind, Table: t, Instance: instance})
	}
}
