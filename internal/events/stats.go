package events

import (
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/index"
)

// Stats are figures the decoders of a process add to and the metrics
// export without a source label: applied BlockStored events by KV-cache
// group kind, and the standard-hash maps' size and unreachable blocks. The
// app owns one (Config.Stats); its methods are safe for concurrent use and
// on a nil receiver (nothing counted).
type Stats struct {
	groupKinds     [index.NumGroupKinds]atomic.Uint64
	stdMapBytes    atomic.Int64
	stdUnreachable atomic.Uint64
}

// GroupKindEvents returns the counts of applied BlockStored events by
// KV-cache group kind (index.GroupKind), since start-up.
func (s *Stats) GroupKindEvents() (out [index.NumGroupKinds]uint64) {
	if s == nil {
		return out
	}
	for i := range out {
		out[i] = s.groupKinds[i].Load()
	}
	return out
}

// StandardMapBytes is the accounted size of every source's engine-hash →
// standard-hash map, for the memory metrics.
func (s *Stats) StandardMapBytes() int64 {
	if s == nil {
		return 0
	}
	return s.stdMapBytes.Load()
}

// StandardUnreachableBlocks counts the blocks engines stored that the
// standard hash cannot key for a plain query.
func (s *Stats) StandardUnreachableBlocks() uint64 {
	if s == nil {
		return 0
	}
	return s.stdUnreachable.Load()
}

func (s *Stats) addGroupKind(k index.GroupKind) {
	if s != nil {
		s.groupKinds[k].Add(1)
	}
}

func (s *Stats) addStdMapBytes(n int64) {
	if s != nil {
		s.stdMapBytes.Add(n)
	}
}

func (s *Stats) addStdUnreachable() {
	if s != nil {
		s.stdUnreachable.Add(1)
	}
}
