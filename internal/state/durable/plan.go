package durable

import (
	"sort"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
	"github.com/mooncake-conductor-go/conductor/registry"
)

// plan is a loaded snapshot waiting to be handed to the services that are
// registered at start-up.
type plan struct {
	sources  map[string]*snapshot.Source
	used     map[string]bool
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
	p := &plan{sources: map[string]*snapshot.Source{}, used: map[string]bool{}, contexts: map[index.ContextKey]*planContext{},
		scopes: snap.Scopes, replicas: snap.Replicas}
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
// position or a stale state, and for engines a context recorded under the
// same hash profile.
func (p *plan) take(svc registry.Service) (*snapshot.Source, bool) {
	key := string(svc.Key())
	src, ok := p.sources[key]
	if !ok || p.used[key] || src.Type != svc.Type.String() || src.Registration != fingerprint(&svc) || (!src.HasSeq && !src.Stale) {
		return nil, false
	}
	if svc.IsEngine() {
		if pc, ok := p.contexts[svc.Context()]; ok && pc.profile != profileOf(&svc.Profile) {
			return nil, false
		}
		if svc.Profile.IsStandard() {
			// The engine-hash → standard-hash map a removal needs is not
			// in the snapshot: restored blocks could never be removed,
			// so such a source starts cold (docs/state.md).
			return nil, false
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

// unused lists recorded sources no registration took, sorted.
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
