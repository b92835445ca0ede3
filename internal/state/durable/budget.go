package durable

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
)

// tooLarge refuses a snapshot whose entries would not fit the index's
// memory budget (Options.IndexMemoryLimit), naming both sizes. A snapshot
// records no recency, so its newest part cannot be told from the rest:
// loading what fits would keep an arbitrary, hash-chosen part, which the
// evictor would then trim further as the sources catch up. Refusing is
// explicit instead, and the refused file is kept (moved aside) for an
// operator who raises the budget (docs/index-memory.md#snapshots-and-peers).
func (s *State) tooLarge(snap *snapshot.Snapshot) error {
	limit := s.opts.IndexMemoryLimit
	if limit <= 0 {
		return nil
	}
	var need int64
	for _, c := range snap.Contexts {
		need += index.EstimateBytes(int64(c.Blocks), int64(c.Pairs))
	}
	for _, sc := range snap.Scopes {
		need += index.EstimateBytes(int64(sc.Blocks), int64(sc.Pairs))
	}
	if need <= limit {
		return nil
	}
	return fmt.Errorf("snapshot needs at least %d MiB (%d bytes) of index memory, over the %d MiB (%d bytes) budget (--index-memory-mib)",
		need>>20, need, limit>>20, limit)
}
