// Package index keeps, per context, which owners hold which projected block
// keys in which storage tier, and walks a query's key chain against it.
// Its words (context, owner, tier, stripe, walk, hint, scope, cut,
// generation) are defined in docs/architecture.md#glossary.
//
// The surface, in a dozen lines:
//
//   - Index holds the tables: EnsureTable/Table/DropTable per ContextKey
//     (Conductor contexts), EnsureScope/Scope/DropScope per ScopeKey
//     (producer-fed scopes), the memory budget (Options.MemoryLimit) and its
//     evictions, SetWatcher for changes, BeginCut for a snapshot.
//   - Table registers owners (AddEngineOwner, RemoveEngineOwner, ClearOwner,
//     SetLayout), stores and removes blocks (Store and its batch, located
//     and group forms; Remove, RemoveGroup, Evict; Put for restore), counts
//     shared-tier references (AcquireShared*/ReleaseShared*, SharedRef) and
//     answers walks (Query, Explain, Locate).
//   - Cut and TableCut copy the owners' entries at one moment; Restore and
//     WalkEntries read them back.
//   - QueryResult, InstanceHits, RankHits and TierCounts are the answer.
//
// Layout, chosen for memory per (block, owner) (BENCHMARKS.md, index
// memory; less when owners share blocks) and for operations that cost what
// they touch:
//
//   - A Table is split into power-of-two stripes by a mix of the key; each
//     stripe has its own RWMutex, so writers of one stripe never stall
//     readers of another and a query holds one read lock per block.
//   - A stripe is a slab of 24-byte blocks (key, one inline holder, overflow
//     handle, union tier mask) with stable indices, plus a linear-probing
//     index of uint32 slots (slab index + hash fingerprint).
//   - A holder is 8 bytes: engine owner id and tier bits, plus the block's
//     position in that owner's per-stripe reverse list (which makes
//     ClearOwner and RemoveEngineOwner proportional to what the owner holds
//     and removal O(1)); shared tiers are one holder per tier whose second
//     word is the reference count.
//   - Registration is an immutable snapshot swapped atomically, so the query
//     path maps holders to reported owners without locks, and walks with one
//     bitset per cumulative tier.
package index
