package events

import (
	"maps"
	"slices"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
)

// Bindings is what the Mooncake decoder offers for durable state: its
// object bindings (which hold the shared tiers' references) copied out for
// a snapshot, and taken back after a restart.
type Bindings interface {
	// ExportBindings copies the binding table. The caller makes sure no
	// batch is being applied meanwhile.
	ExportBindings() []snapshot.Binding
	// ImportBindings re-creates bindings before the first batch.
	ImportBindings([]snapshot.Binding)
}

// ExportBindings implements Bindings.
func (d *mooncakeDecoder) ExportBindings() []snapshot.Binding {
	out := make([]snapshot.Binding, 0, len(d.bindings))
	for k, b := range d.bindings {
		sb := snapshot.Binding{
			Backend: k.backend, Tenant: k.tenant, Identity: k.identity, Tier: uint8(k.tier),
			Model: b.ctx.Model, Lora: b.ctx.Lora, BlockSize: b.ctx.BlockSize,
			Prefix: b.prefix, FullHash: b.fullHash, Group: b.group,
		}
		if len(b.components) > 0 {
			sb.Components = slices.Sorted(maps.Keys(b.components))
		}
		out = append(out, sb)
	}
	return out
}

// ImportBindings implements Bindings: each binding takes its shared
// reference again; one whose context no engine registration binds any
// more, or binds to another profile, is dropped, as a live store would be.
func (d *mooncakeDecoder) ImportBindings(bs []snapshot.Binding) {
	if d.lookup == nil {
		return // no registrations to bind to
	}
	for _, sb := range bs {
		tier := index.Tier(sb.Tier)
		if tier != index.CPUShare && tier != index.Disk {
			continue
		}
		ctx := index.ContextKey{Tenant: sb.Tenant, Model: sb.Model, Lora: sb.Lora, BlockSize: sb.BlockSize}
		sink, prof, ok := d.lookup(ctx)
		if !ok || sink == nil || prof == nil || *prof != d.profile {
			continue
		}
		bk := bindingKey{backend: sb.Backend, tenant: sb.Tenant, identity: sb.Identity, tier: tier}
		if _, dup := d.bindings[bk]; dup {
			continue
		}
		b := &binding{sink: sink, ctx: ctx, prefix: sb.Prefix, fullHash: sb.FullHash, group: sb.Group}
		if !d.sglang {
			g, ok := vllmObjectGroup(sb.Group, "")
			if !ok {
				continue
			}
			b.vgroup = g
		}
		if d.sglang {
			b.components = make(map[string]struct{}, len(sb.Components))
			for _, c := range sb.Components {
				b.components[c] = struct{}{}
			}
		}
		if b.acquire(tier) {
			d.bindings[bk] = b
		}
	}
}
