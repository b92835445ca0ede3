package durable

import (
	"sort"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// plan is a loaded snapshot waiting to be handed to the services that are
// registered at start-up.
type plan struct {
	sources map[string]*snapshot.StreamPosition
	used    map[string]bool
	// refused says why a registered source could not resume from its
	// record, for the log.
	refused map[string]string
	// version is the file's format; fromPeer says a live peer sent it,
	// whose confirmed positions a source takes as confirmed.
	version  uint32
	fromPeer bool
	contexts map[index.ContextKey]*planContext
	// scopes and replicas are the producer-fed side, for AttachProducer.
	scopes   []snapshot.Scope
	replicas []snapshot.Replica
}

// planContext is one context's entries, split by owner so each restored
// engine source takes only its own.
type planContext struct {
	profile snapshot.Profile
	owners  map[index.Owner]*heldBlocks
}

// heldBlocks is one owner's entries, encoded as index.TableCut.Entries
// with the owner at position 0.
type heldBlocks struct {
	entries []byte
	pairs   int
	layout  index.Layout
}

func newPlan(snap *snapshot.Snapshot) *plan {
	p := &plan{sources: map[string]*snapshot.StreamPosition{}, used: map[string]bool{}, refused: map[string]string{},
		contexts: map[index.ContextKey]*planContext{}, scopes: snap.Scopes, replicas: snap.Replicas, version: snap.Version}
	for i := range snap.Sources {
		src := &snap.Sources[i]
		p.sources[src.Key] = src
	}
	for i := range snap.Contexts {
		c := &snap.Contexts[i]
		pc := &planContext{profile: c.Profile, owners: make(map[index.Owner]*heldBlocks, len(c.Owners))}
		byPos := make([]*heldBlocks, len(c.Owners))
		for i, o := range c.Owners {
			byPos[i] = &heldBlocks{}
			if i < len(c.Layouts) {
				byPos[i].layout = c.Layouts[i]
			}
			pc.owners[o] = byPos[i]
		}
		// Read validated every entry already; this split cannot fail.
		split, _ := index.SplitEntries(c.Entries, len(c.Owners))
		for i, e := range split {
			byPos[i].entries = e
		}
		_, _, _ = index.WalkEntries(c.Entries, len(c.Owners), func(_ uint64, hs []index.EntryHolder) {
			for _, h := range hs {
				byPos[h.Owner].pairs++
			}
		})
		c.Entries = nil
		p.contexts[c.Context] = pc
	}
	return p
}

// take returns svc's recorded position, once, when the snapshot has one it
// can resume from: the same registration (key and configuration), a
// position or a stale state, for engines a context recorded under the
// same hash profile, and for standard-hash engines their engine-hash map.
// A registered source it refuses is named in refused with the reason.
func (p *plan) take(svc registry.Service) (*snapshot.StreamPosition, bool) {
	key := string(svc.Key())
	src, ok := p.sources[key]
	if !ok || p.used[key] || (!src.HasSeq && !src.Stale) {
		return nil, false
	}
	refuse := func(why string) (*snapshot.StreamPosition, bool) {
		p.refused[key] = why
		return nil, false
	}
	if src.Type != svc.Type.String() || src.Registration != fingerprint(&svc) {
		return refuse("registered again with other settings since the snapshot")
	}
	if svc.IsEngine() {
		if pc, ok := p.contexts[svc.Context()]; ok && pc.profile != profileOf(&svc.Profile) {
			return refuse("its context was recorded under another hash profile")
		}
		if svc.Profile.IsStandard() && !src.Stale {
			// Restored blocks are keyed by the standard hash; a
			// removal names the engine's hash, so without the map
			// they could never be removed (docs/state.md).
			switch {
			case !src.HasStdMap:
				return refuse("a standard-hash engine whose engine-hash map the snapshot lacks (written before format version 3)")
			case len(src.StdMap) > events.DefaultStdMapEntries:
				return refuse("its engine-hash map is larger than a source's bound")
			}
		}
	}
	p.used[key] = true
	return src, true
}

// restoreOwner stores svc's recorded entries into t under id and returns
// how many (block, owner) pairs it restored.
func (p *plan) restoreOwner(svc registry.Service, t *index.Table, id index.OwnerID) int {
	pc, ok := p.contexts[svc.Context()]
	if !ok {
		return 0
	}
	o := index.Owner{Instance: svc.InstanceID, Rank: svc.DPRank}
	hb, ok := pc.owners[o]
	if !ok {
		return 0
	}
	t.RestoreLayout(id, hb.layout)
	_ = t.Restore(hb.entries, []index.OwnerID{id}) // SplitEntries encoded them
	delete(pc.owners, o)
	return hb.pairs
}

// unused lists recorded sources no registration took (refused ones
// included), sorted.
func (p *plan) unused() []string {
	var out []string
	for k, src := range p.sources {
		if !p.used[k] && (src.HasSeq || src.Stale) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
