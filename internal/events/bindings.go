package events

import (
	"maps"
	"slices"

	"github.com/mooncake-conductor-go/conductor/index"
)

// Binding is one object (or SGLang logical page) a Mooncake master
// reported in a shared tier, as the decoder hands it over to be kept
// across a restart. The snapshot file has its own record of it
// (Binding, converted by durable state): the decoders and the
// subscriber do not know the file format, and a field added to one and
// not the other fails the conversion at compile time.
type Binding struct {
	Backend    string
	Tenant     string
	Identity   string
	Tier       uint8 // an index.Tier: CPUShare or Disk
	Model      string
	Lora       string
	BlockSize  int
	Prefix     uint64
	FullHash   string
	Group      string
	Components []string
}

// Bindings is what the Mooncake decoder offers for durable state: its
// object bindings (which hold the shared tiers' references) copied out for
// a snapshot, and taken back after a restart.
type Bindings interface {
	// ExportBindings copies the binding table. The caller makes sure no
	// batch is being applied meanwhile.
	ExportBindings() []Binding
	// ImportBindings re-creates bindings before the first batch.
	ImportBindings([]Binding)
}

// BindingBytes is what a saved binding accounts for against the index's
// budget once restored (docs/index-memory.md#snapshots-and-peers), not
// counting its block, which other bindings may share.
func BindingBytes(sb Binding) int64 {
	b := binding{key: bindingKey{backend: sb.Backend, tenant: sb.Tenant, identity: sb.Identity},
		ctx: index.ContextKey{Model: sb.Model, Lora: sb.Lora}, fullHash: sb.FullHash, group: sb.Group}
	if sb.Components != nil {
		b.components = make(map[string]struct{}, len(sb.Components))
		for _, c := range sb.Components {
			b.components[c] = struct{}{}
		}
	}
	return index.EstimateRefBytes(b.accounted())
}

// ExportBindings implements Bindings.
func (d *mooncakeDecoder) ExportBindings() []Binding {
	out := make([]Binding, 0, len(d.bindings))
	for k, b := range d.bindings {
		if b.ref.Gone() {
			continue // evicted: restoring it would bring back what the budget let go
		}
		sb := Binding{
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
func (d *mooncakeDecoder) ImportBindings(bs []Binding) {
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
		if cur, dup := d.bindings[bk]; dup && !cur.ref.Gone() {
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
		d.bind(bk, b)
	}
}
