package subscriber

import (
	"time"

	"github.com/zeebo/xxh3"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
)

// StaleRecovery says what a stale source does after its entries are
// retracted (docs/events.md#stale-recovery).
type StaleRecovery uint8

const (
	// StaleRecoveryAuto (the default) takes the first message after
	// Tuning.StaleHoldOff as a new baseline, as an identical
	// re-registration would. A deliberate deviation from the contract,
	// whose rule is StaleRecoveryOff.
	StaleRecoveryAuto StaleRecovery = iota
	// StaleRecoveryOff ignores the source until it is registered again.
	StaleRecoveryOff
)

// String returns the flag value naming the mode.
func (m StaleRecovery) String() string {
	if m == StaleRecoveryOff {
		return "off"
	}
	return "auto"
}

// ParseStaleRecovery reads a --stale-recovery value.
func ParseStaleRecovery(v string) (StaleRecovery, bool) {
	switch v {
	case "auto":
		return StaleRecoveryAuto, true
	case "off":
		return StaleRecoveryOff, true
	}
	return 0, false
}

// DefaultStaleHoldOff is how long a stale source ignores messages before
// the next one becomes its baseline: long enough for a burst that overran
// a queue to pass (re-baselining inside it would only find the next gap),
// short enough that a message published soon after the gap is indexed.
const DefaultStaleHoldOff = 2 * time.Second

// Evidence names what showed a publisher restart, in logs
// (docs/events.md#restarts).
type Evidence string

const (
	// EvidenceRegression: a live sequence at or below the highest one
	// received.
	EvidenceRegression Evidence = "regression"
	// EvidenceReconnectJump: after a reconnection, a sequence other than
	// the next one, on a source without replay.
	EvidenceReconnectJump Evidence = "reconnect_jump"
	// EvidenceReplayMismatch: the replay endpoint's record at the last
	// applied sequence is not the batch that was applied.
	EvidenceReplayMismatch Evidence = "replay_mismatch"
	// EvidenceReplayBehind: asked by a restored source for its last
	// applied sequence, the replay endpoint holds nothing at or after it
	// (its newest record is older).
	EvidenceReplayBehind Evidence = "replay_behind"
)

// digestOf fingerprints an applied payload, so a replay endpoint's record
// at the same sequence can later be told apart from it. 64 bits: a restart
// that published a different batch there is missed with probability 2^-64.
func digestOf(payload []byte) uint64 { return xxh3.Hash(payload) }

// matchesDigest is the replay anchor check: the publisher's record at the
// last applied sequence is the batch that was applied.
func (s *Subscriber) matchesDigest(payload []byte) bool { return digestOf(payload) == s.seq.digest }

// Restarts is how many publisher restarts this source detected (each a new
// epoch: the old process's entries dropped, the new stream indexed).
func (s *Subscriber) Restarts() uint64 { return s.seq.restarts.Load() }

// StaleRecoveries is how many times this source left the stale state by
// itself (StaleRecoveryAuto).
func (s *Subscriber) StaleRecoveries() uint64 { return s.seq.recoveries.Load() }

// resetStream drops everything the source contributed and forgets its
// sequence state, so that the next message applied is a baseline. The
// caller holds the gate, so no cut sees the source between the two.
func (s *Subscriber) resetStream() {
	s.apply.enter()
	s.apply.retract()
	s.apply.retracted = false
	s.seq.reset()
	s.conn.reconnected = false
	s.resume.atRestored, s.resume.confirm = false, false
	s.apply.leave()
}

// newEpoch handles a publisher restart shown by evidence at live message
// (seq, payload): the old process's entries go, and the new stream is
// indexed from its start. With replay, what the new process published
// before seq is fetched from its own buffer first (docs/events.md#restarts).
func (s *Subscriber) newEpoch(ev Evidence, seq uint64, payload []byte) error {
	s.countRestart(ev, seq)
	s.apply.enter()
	s.resetStream()
	s.settleResume(streampos.Restarted)
	if s.rec.replay != nil && seq > 0 {
		// The gate is not held across a replay, which may take
		// seconds: a cut meanwhile sees a source with nothing applied.
		s.apply.leave()
		s.seq.high = seq
		return s.recover(liveMsg{seq: seq, payload: payload}, true)
	}
	s.baseline(seq, payload)
	s.apply.leave()
	return nil
}

// countRestart counts and logs one detected restart.
func (s *Subscriber) countRestart(ev Evidence, seq uint64) {
	q := &s.seq
	q.restarts.Add(1)
	e := s.log.Info().Str("evidence", string(ev)).Uint64("seq", seq)
	if q.started {
		e = e.Uint64("last_applied", q.applied).Uint64("highest_received", q.high)
	}
	e.Msg("publisher restarted: its previous entries are dropped and the new stream is indexed")
	if s.cfg.test.onEpoch != nil {
		s.cfg.test.onEpoch()
	}
}

// recoversFrom reports whether a source made stale for why leaves the stale
// state by itself under StaleRecoveryAuto: lost messages do; a batch the
// registration rejects (dp rank) or a decoder panic would only come back.
func recoversFrom(why events.Reason) bool {
	switch why {
	case events.StaleGap, events.StaleReplay, events.StaleDeadline, events.StaleBufferOverflow, events.ReasonNone:
		return true
	}
	return false
}

// willRecover reports whether this stale source will take a later message
// as a new baseline, so its SUB socket must stay open.
func (s *Subscriber) willRecover() bool {
	return s.cfg.Session.StaleRecovery == StaleRecoveryAuto && recoversFrom(s.seq.staleWhy)
}

// tryStaleRecovery makes the live message (seq, payload) the new baseline
// of a stale source once its hold-off has passed; it reports whether it
// did.
func (s *Subscriber) tryStaleRecovery(seq uint64, payload []byte) bool {
	q := &s.seq
	if !s.willRecover() || time.Since(q.staleAt) < s.tuning.StaleHoldOff {
		return false
	}
	q.recoveries.Add(1)
	s.log.Info().Str("stale_reason", q.staleWhy.String()).Uint64("seq", seq).Dur("stale_for", time.Since(q.staleAt)).
		Msg("stale source recovered: this message is its new baseline")
	s.apply.enter()
	defer s.apply.leave()
	s.resetStream()
	s.baseline(seq, payload)
	return true
}

// EventCounts calls fn for every reason this source counts its rejected and
// ignored events by, zero or not (ServiceOutcomes.Each), since it started.
func (s *Subscriber) EventCounts(fn func(rejected bool, reason string, n uint64)) {
	s.outcomes.Each(fn)
}
