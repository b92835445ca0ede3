// Package index keeps, per context, which owners hold which projected block
// keys in which storage tier, and walks a query's key chain against it.
// Its words (context, owner, tier, stripe, walk, hint, scope, cut,
// generation) are defined in docs/architecture.md#glossary.
//
// The surface, in a dozen lines:
//
//   - New(Options) is an Index: EnsureTable/Table/DropTable per ContextKey
//     (Conductor contexts; their hash profiles are kept beside the tables
//     by internal/contexts), EnsureScope/Scope/DropScope per ScopeKey
//     (producer-fed scopes); a memory budget (Options.MemoryLimit) evicts
//     the least recently stored; SetWatcher sees changes; BeginCut cuts.
//   - A Table registers engine owners (AddEngineOwner, RemoveEngineOwner;
//     SetLayout and NoteGroup for hybrid layouts) and has one write path:
//     Store(id, Put) and Remove(id, Put), where Put names the key, tier,
//     KV-cache group and whether it replaces the owner's holding; ClearOwner
//     retracts tiers of all an owner holds; Restore takes a cut back.
//   - Acquire/Release take and give back a SharedRef, one Mooncake
//     binding's reference on a shared tier; Orphans returns evicted ones.
//   - Query walks a Chain into a QueryResult; Explain says why walks stop.
//   - Cut.Finish gives a TableCut per table; WalkEntries and SplitEntries
//     read its Entries.
package index
