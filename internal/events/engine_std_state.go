package events

import "github.com/mooncake-conductor-go/conductor/index"

// StdEntry is one entry of a standard-hash engine's engine-hash →
// standard-hash map (engine_std.go), as the decoder hands it over to be
// kept across a restart (docs/state.md#what-survives-a-restart). The
// snapshot file has its own record of it, converted by the durable state.
type StdEntry struct {
	Group int32
	Tier  uint8 // an index.Tier: Device, CPULocal or Disk
	// Key is the engine's block hash, projected as the decoder reads it.
	Key uint64
	// H is the block's standard hash; 0 when the block is unreachable.
	H         uint64
	Reachable bool
}

// StandardMap is what an engine decoder under the standard hash offers for
// durable state: the map its removals and children need, copied out for a
// snapshot and taken back after a restart, so that its restored blocks stay
// removable.
type StandardMap interface {
	// ExportStdMap copies the map; ok is false when the decoder does not
	// key by the standard hash. The caller makes sure no batch is being
	// applied meanwhile.
	ExportStdMap() (entries []StdEntry, ok bool)
	// ImportStdMap re-creates the map before the first batch; false when
	// the entries are more than its bound, or when there are entries and
	// the decoder does not key by the standard hash (nothing is imported
	// then).
	ImportStdMap([]StdEntry) bool
}

// ExportStdMap implements StandardMap.
func (d *engineDecoder) ExportStdMap() ([]StdEntry, bool) {
	s := &d.std
	if !s.on {
		return nil, false
	}
	out := make([]StdEntry, 0, len(s.m))
	for k, v := range s.m {
		out = append(out, StdEntry{Group: k.group, Tier: uint8(k.tier), Key: k.k, H: v.h, Reachable: v.reachable})
	}
	return out, true
}

// ImportStdMap implements StandardMap.
func (d *engineDecoder) ImportStdMap(es []StdEntry) bool {
	s := &d.std
	if !s.on {
		return len(es) == 0
	}
	if len(es) > s.max {
		return false
	}
	for _, e := range es {
		s.put(stdKey{group: e.Group, tier: index.Tier(e.Tier), k: e.Key}, stdVal{h: e.H, reachable: e.Reachable})
	}
	return true
}
