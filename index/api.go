// Package index keeps, per context, which owners hold which projected block
// keys in which storage tier, and walks a query's key chain against it.
package index

// Tier is one of the contract's four storage tiers, in cumulative order.
type Tier uint8

const (
	Device Tier = iota
	CPULocal
	CPUShare
	Disk
	numTiers
)

// TierMask is a set of tiers; bit i is Tier(i).
type TierMask uint8

// AllEngineTiers are the tiers an engine owner can hold.
const AllEngineTiers = TierMask(1<<Device | 1<<CPULocal | 1<<Disk)

// ContextKey selects one table: blocks from different contexts are never
// comparable, so every lookup is scoped by it.
type ContextKey struct {
	Tenant    string
	Model     string
	Lora      string
	BlockSize int
}

// OwnerID is an engine owner (instance, dp_rank) interned within a table.
type OwnerID uint32

// Chain yields a query's block keys lazily; the walk stops calling Next at the
// first block nobody holds, so the unmatched tail is never hashed.
type Chain interface {
	// Next returns block i's key and the number of tokens it covers.
	Next() (key uint64, covered int, ok bool)
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
// Instances is sorted by instance id.
type QueryResult struct {
	Instances []InstanceHits

	scratch queryScratch
}
