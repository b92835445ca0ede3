// Package streampos holds the values a source and the durable state pass
// each other: where a restored source resumes its stream, where a running
// one is for a snapshot, and how a restored one settled. It is its own
// package so that the durable state, a stage the subscriber calls, needs
// nothing of the subscriber.
package streampos

import (
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/events"
)

// Resume is where a source restored from a snapshot picks its stream up.
type Resume struct {
	// Seq is the last sequence the restored entries reflect.
	Seq uint64
	// Stale restores a source that was stale: it stays stale.
	Stale bool
	// Bindings are a Mooncake source's restored object bindings; each
	// takes its shared reference again at Start.
	Bindings []events.Binding
	// Digest, when HasDigest, fingerprints the batch applied at Seq: with
	// replay, the first message after the restart is checked against the
	// publisher's record there, so a publisher that restarted meanwhile
	// is a new epoch rather than a continuation (docs/events.md#restarts).
	Digest    uint64
	HasDigest bool
	// Confirmed says a live peer that follows the same stream vouched for
	// the position (a replica bootstrapped from a peer's snapshot): the
	// source settles at once as Peer instead of catching up
	// (docs/replicas.md#warm-start-from-a-peer).
	Confirmed bool
	// StdMap, for an engine registered with the standard hash, is its
	// engine-hash → standard-hash map as of Seq (its removals need it).
	StdMap []events.StdEntry
}

// Position is a source's place in its stream for a snapshot.
type Position struct {
	Seq      uint64
	HasSeq   bool
	Stale    bool
	Bindings []events.Binding
	// Digest fingerprints the batch applied at Seq (sources with replay).
	Digest    uint64
	HasDigest bool
	// CatchingUp says the position is a restored one not confirmed yet:
	// a peer bootstrapping from this snapshot must not take it as
	// confirmed.
	CatchingUp bool
	// StdMap is a standard-hash engine's engine-hash → standard-hash map
	// (HasStdMap), as of Seq.
	StdMap    []events.StdEntry
	HasStdMap bool
}

// Outcome is how a restored source settled, reported once per source.
type Outcome string

// Outcomes, as conductor_restore_sources labels them.
const (
	// InOrder: the first live message followed the recorded sequence;
	// nothing was missed.
	InOrder Outcome = "in_order"
	// Replay: the downtime's gap was recovered through replay.
	Replay Outcome = "replay"
	// Cold: the gap could not be recovered; the restored entries were
	// dropped and the stream applies from the first message received.
	Cold Outcome = "cold"
	// Restarted: the publisher restarted while the conductor was down;
	// the restored entries were dropped and its new stream indexed.
	Restarted Outcome = "restarted"
	// Peer: the position came from a live peer's snapshot and was taken
	// as confirmed (the peer follows the same stream); the source answers
	// like the peer from the start, and later epochs follow the usual
	// rules.
	Peer Outcome = "peer"
	// Lagging: nothing confirmed the restored entries by the catch-up
	// deadline: they were dropped, and the stream applies from the next
	// message received, as for a new registration
	// (docs/state.md#what-survives-a-restart).
	Lagging Outcome = "lagging"
)

// Restore is one restored source's handle on the durable state, which
// makes one per source its snapshot knows: what the source resumes from,
// and where the source says it is catching up and, once, how it settled.
// The durable state's readiness waits on the handles catching up, and
// tells them when the catch-up deadline has passed; the source reads that
// on its own goroutine. Its methods are safe for concurrent use.
type Restore struct {
	Resume
	// Deadline, when set, is when the catch-up timeout ends for this
	// source: a confirmation the source is still waiting for then (its
	// replay endpoint silent) gives up and the source settles as Lagging.
	// The durable state sets it before handing the handle over.
	Deadline time.Time
	count    func(Outcome) // the durable state's tally; nil counts nothing
	phase    atomic.Int32
	expired  atomic.Bool
}

const (
	restoreUnclaimed  = iota // no source started with it (yet)
	restoreCatchingUp        // its source is catching up
	restoreSettled
)

// NewRestore returns the handle of a source resuming at r; count, when set,
// is told the outcome when the source settles.
func NewRestore(r Resume, count func(Outcome)) *Restore {
	return &Restore{Resume: r, count: count}
}

// Begin says a source started from the handle and is catching up.
func (r *Restore) Begin() { r.phase.CompareAndSwap(restoreUnclaimed, restoreCatchingUp) }

// Settle ends the catch-up with outcome; only the first call counts.
func (r *Restore) Settle(o Outcome) {
	if r.phase.Load() == restoreSettled {
		return
	}
	if r.count != nil {
		r.count(o)
	}
	// Last: whoever sees the source settled also sees the outcome counted.
	r.phase.Store(restoreSettled)
}

// CatchingUp reports whether a source began from the handle and has not
// settled.
func (r *Restore) CatchingUp() bool { return r.phase.Load() == restoreCatchingUp }

// Expire says the catch-up deadline has passed: a source still catching
// up drops its restored entries and settles as Lagging.
func (r *Restore) Expire() { r.expired.Store(true) }

// Expired reports whether Expire was called.
func (r *Restore) Expired() bool { return r.expired.Load() }
