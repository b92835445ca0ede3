package index

import "cmp"

// Tier is one of the contract's four storage tiers, in cumulative order.
type Tier uint8

const (
	// Device is engine accelerator memory of one (instance, dp rank).
	Device Tier = iota
	// CPULocal is engine-local host memory (SGLang cpu/cpu_pinned).
	CPULocal
	// CPUShare is the shared host pool (Mooncake memory replicas); it is
	// never held by an engine owner and counts for every instance.
	CPUShare
	// Disk is disk-backed storage: an engine's own (SGLang HiCache L3),
	// counting for that owner, or Mooncake's, counting for every instance.
	Disk
	numTiers
)

// TierMask is a set of tiers; bit i is Tier(i).
type TierMask uint8

// AllEngineTiers are the tiers an engine owner can hold.
const AllEngineTiers = TierMask(1<<Device | 1<<CPULocal | 1<<Disk)

// DefaultTenant is the tenant an empty or omitted tenant_id means; the
// doors and the registry fill it in before a ContextKey reaches a table.
const DefaultTenant = "default"

// ContextKey selects one table: blocks from different contexts are never
// comparable, so every lookup is scoped by it.
type ContextKey struct {
	Tenant    string
	Model     string
	Lora      string
	BlockSize int
}

// Compare orders contexts by tenant, model, LoRA name and block size: the
// one order every listing of contexts (/global_view, metrics) uses.
func (k ContextKey) Compare(o ContextKey) int {
	return cmp.Or(cmp.Compare(k.Tenant, o.Tenant), cmp.Compare(k.Model, o.Model),
		cmp.Compare(k.Lora, o.Lora), cmp.Compare(k.BlockSize, o.BlockSize))
}

// OwnerID is an engine owner (instance, dp_rank) interned within a table.
// Once the owner is removed its id is retired: operations carrying it are
// no-ops, even after its slot is reissued to a new owner.
type OwnerID uint32

// Chain yields a query's block keys lazily; the walk stops calling Next one
// block past the first block nobody holds (it hashes a block ahead, see
// walkKeys), so the rest of the unmatched tail is never hashed.
type Chain interface {
	// Next returns block i's key and the number of tokens it covers.
	Next() (key uint64, covered int, ok bool)
}

// ReadyChain is a Chain that can tell how many of its next keys it has
// without hashing: a hashing.Chain serving a remembered prefix from its
// memo. Query takes those keys in one batch and reads their blocks one
// stripe at a time, which saves a read lock per block; keys that cost
// hashing are still produced one by one, only as far as the walk needs.
type ReadyChain interface {
	Chain
	Ready() int
}

// BatchChain is a ReadyChain that hands its ready keys over in one call,
// each with a hint of where its block lies (see locate.go; 0 for
// none): keys from verified links carry the one ingest took. The walk
// checks a hinted slab entry before probing the slot table (locate.go).
type BatchChain interface {
	ReadyChain
	// TakeReady is Next for up to n of the keys Ready counts: it appends
	// each key, the tokens it covers and its hint to keys, covs and
	// hints. (Plain slices: the chains that implement it live below
	// this package.)
	TakeReady(n int, keys []uint64, covs []int, hints []uint32) ([]uint64, []int, []uint32)
}

// TierCounts are cumulative token counts: Device <= CPULocal <= CPUShare <= Disk.
type TierCounts struct {
	Device, CPULocal, CPUShare, Disk int
}

// RankHits is one dp rank's counts.
type RankHits struct {
	Rank int
	TierCounts
}

// InstanceHits is one instance's answer; Max is the per-tier maximum over
// Ranks (sorted by rank).
type InstanceHits struct {
	Instance string
	Max      TierCounts
	Ranks    []RankHits
}

// QueryResult is reused across queries to keep /query allocation-free;
// Instances is sorted by instance id. It also carries the walk's working
// memory, so one QueryResult must not be used by two queries at once.
type QueryResult struct {
	Instances []InstanceHits

	scratch queryScratch
}
