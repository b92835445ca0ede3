// Package membudget is the process's one memory budget: the rule that
// derives it from the memory limit the process runs under and splits it
// among the index and every cache (docs/index-memory.md#the-budget).
//
// The rule, in order:
//
//  1. The budget is the limit less a headroom of a quarter of it, at
//     least MinHeadroom: what lives outside the Go runtime's soft limit
//     (the binary's pages, libzmq's threads and queues, the C heap), a
//     fixed amount that dominates small limits, and what the runtime
//     overshoots its soft limit by.
//  2. The index comes first: half the budget is its part. The index
//     accounts its live structures only, and the resident size of what it
//     accounts is up to IndexResidentFactor times that (slot tables at
//     64-80 % load, slices grown by doubling, the garbage collector's
//     headroom), so its accounted limit is its part divided by that.
//  3. Each cache then takes a fixed share of the budget, capped at the
//     size it has when no limit is known: the verified links (with their
//     verification backlog) an eighth, the prefix memo and the token memo
//     (one part for both doors) a thirty-second each.
//  4. The receive path (every source's receive queue in libzmq and what
//     a recovery buffers) shares an eighth, capped like a cache; unlike
//     the caches it has no size when no limit is known: the subscribers
//     then keep their own constants.
//  5. What the caps and shares leave is slack for the rest: requests and
//     their bodies in flight, decoded batches.
//
// An override (a cache's own MiB flag, --index-memory-mib) replaces that
// part's size and leaves the others as the rule gives them.
package membudget

import (
	"fmt"
	"strings"
)

// Part names one part of the budget, the {part} label of the metrics.
type Part string

const (
	// Index is the index's accounted memory (index.Options.MemoryLimit).
	Index Part = "index"
	// Links is the verified links and their verification backlog
	// (hashing.NewLinks).
	Links Part = "links"
	// HashMemo is the prefix memo of digest chains (hashing.NewMemo).
	HashMemo Part = "hash_memo"
	// TokenMemo is the one token memo both doors share
	// (tokenmemo.New).
	TokenMemo Part = "token_memo"
	// Receive is every source's receive path: libzmq's receive queues
	// (C heap) and the batches a recovery holds
	// (subscriber.ResourcesOptions.ReceiveBytes). 0 is unbounded.
	Receive Part = "receive"
)

// Parts lists the parts in the order the start-up log and the metrics
// give them.
var Parts = []Part{Index, Links, HashMemo, TokenMemo, Receive}

// MiB is a mebibyte.
const MiB = 1 << 20

// MinHeadroom is the least the budget keeps below the limit.
const MinHeadroom = 40 * MiB

// MinLimit is the smallest limit a budget is derived from: below it the
// headroom and the runtime's own needs leave nothing to split.
const MinLimit = 64 * MiB

// IndexResidentFactor is how much resident memory an accounted byte of
// the index may take (docs/index-memory.md#resident-size).
const IndexResidentFactor = 2

// Unbounded sizes are what each cache has when no limit is known, and the
// caps of their shares under one.
var Unbounded = map[Part]int64{
	Links:     128 * MiB,
	HashMemo:  64 * MiB,
	TokenMemo: 64 * MiB,
	Receive:   64 * MiB,
}

// shares are the caches' fractions of the budget, as divisors.
var shares = map[Part]int64{
	Links:     8,
	HashMemo:  32,
	TokenMemo: 32,
	Receive:   8,
}

// Budget is the split: the total and each part's size in bytes. A zero
// Total is unbounded: the index is then unbounded (its size 0) and each
// cache has its Unbounded size, unless overridden.
type Budget struct {
	// Limit is the memory limit the budget was derived from (0: none),
	// and Source where it came from.
	Limit  int64
	Source string
	// Total is the budget: Limit less the headroom (0: unbounded). The
	// service sets the Go runtime's soft memory limit to it.
	Total int64
	// Size is each part's size; 0 for the index is unbounded, 0 for a
	// cache is off.
	Size map[Part]int64
	// Overridden names the parts their own flag sized.
	Overridden map[Part]bool
}

// GoLimit is the Go runtime's soft memory limit under b: the budget less
// the half of the receive part that libzmq's queues hold in the C heap,
// which the runtime does not see (0: unbounded).
func (b Budget) GoLimit() int64 {
	if b.Total == 0 {
		return 0
	}
	return b.Total - b.Size[Receive]/2
}

// Headroom is what the budget keeps below limit.
func Headroom(limit int64) int64 { return max(limit/4, MinHeadroom) }

// FromLimit is the budget auto derives from limit: limit less its
// Headroom.
func FromLimit(limit int64, source string) (total int64, err error) {
	if limit < MinLimit {
		return 0, fmt.Errorf("memory limit %d MiB (%s) is under the %d MiB the service needs", limit/MiB, source, MinLimit/MiB)
	}
	return limit - Headroom(limit), nil
}

// Split applies the rule to a budget of total bytes (0: unbounded),
// derived from limit (0 when total was given directly) found in source,
// and the overrides (bytes per part; a part absent from the map follows
// the rule).
func Split(total, limit int64, source string, overrides map[Part]int64) Budget {
	b := Budget{Limit: limit, Source: source, Total: total, Size: map[Part]int64{}, Overridden: map[Part]bool{}}
	if total > 0 {
		b.Size[Index] = total / 2 / IndexResidentFactor
		for p, d := range shares {
			b.Size[p] = min(total/d, Unbounded[p])
		}
	} else {
		b.Size[Index] = 0
		for p, n := range Unbounded {
			b.Size[p] = n
		}
		b.Size[Receive] = 0
	}
	for p, n := range overrides {
		b.Size[p], b.Overridden[p] = n, true
	}
	return b
}

// Describe is the start-up log's account of the split.
func (b Budget) Describe() string {
	var sb strings.Builder
	if b.Total == 0 {
		sb.WriteString("memory unbounded: no memory limit known (no cgroup memory.max or memory.limit_in_bytes, no GOMEMLIMIT); set --memory-mib to bound it")
	} else if b.Limit == 0 {
		fmt.Fprintf(&sb, "memory budget %d MiB (%s)", b.Total/MiB, b.Source)
	} else {
		fmt.Fprintf(&sb, "memory budget %d MiB: the %d MiB limit of %s less %d MiB of headroom", b.Total/MiB, b.Limit/MiB, b.Source, (b.Limit-b.Total)/MiB)
	}
	sb.WriteString("; parts:")
	for _, p := range Parts {
		n := b.Size[p]
		switch {
		case (p == Index || p == Receive) && n == 0:
			fmt.Fprintf(&sb, " %s unbounded", p)
		case p == Index:
			fmt.Fprintf(&sb, " %s %d MiB accounted", p, n/MiB)
		default:
			fmt.Fprintf(&sb, " %s %d MiB", p, n/MiB)
		}
		if b.Overridden[p] {
			sb.WriteString(" (override)")
		}
		sb.WriteByte(',')
	}
	return strings.TrimSuffix(sb.String(), ",")
}

// Total names the whole budget in the metrics: its size is Budget.Total,
// its use the process's resident size.
const Total Part = "total"
