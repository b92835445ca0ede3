package subscriber

import (
	"sync/atomic"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
)

// sequence owns the stream's state machine (docs/events.md#sequence-state-machine):
// the last applied sequence A and its fingerprint, the highest live one L,
// when and why the source went stale, and the counts of restarts and
// stale recoveries.
type sequence struct {
	applied uint64 // A: last applied sequence
	high    uint64 // L: highest live sequence received
	started bool   // A and L are set
	// digest fingerprints the batch applied at A (sources with replay),
	// checked against the replay endpoint's record at A before a gap is
	// filled or after a reconnection (epoch.go).
	digest    uint64
	hasDigest bool
	// liveNone says L is none although A is set: the stream restarted
	// from a replay endpoint's buffer before any live message arrived,
	// so the first live number at or below A is a duplicate of a
	// replayed record, not a regression.
	liveNone bool
	// staleAt and staleWhy are when and why the source went stale, for
	// StaleRecoveryAuto.
	staleAt  time.Time
	staleWhy events.Reason

	// A, published for other goroutines after the batch's effects.
	lastSeq atomic.Uint64
	hasSeq  atomic.Bool

	restarts   atomic.Uint64 // publisher restarts detected
	recoveries atomic.Uint64 // stale states left by themselves
}

// consume makes seq the last applied sequence; fingerprinted when a replay
// endpoint can be asked about it later.
func (q *sequence) consume(seq uint64, payload []byte, withReplay bool) {
	q.applied = seq
	if withReplay {
		q.digest, q.hasDigest = digestOf(payload), true
	}
}

// publish makes the last applied sequence visible to LastSeq; it runs
// after the batch's effects, so a caller that sees seq also sees its effects.
func (q *sequence) publish() {
	q.lastSeq.Store(q.applied)
	q.hasSeq.Store(true)
}

func (q *sequence) published() (uint64, bool) {
	if !q.hasSeq.Load() {
		return 0, false
	}
	return q.lastSeq.Load(), true
}

// reset forgets the stream, so that the next message applied is a
// baseline.
func (q *sequence) reset() {
	q.started, q.applied, q.high = false, 0, 0
	q.hasDigest, q.digest = false, 0
	q.liveNone = false
	q.hasSeq.Store(false)
	q.lastSeq.Store(0)
}

// onLive runs the sequence state machine
// (docs/events.md#sequence-state-machine) for one live message.
func (s *Subscriber) onLive(frames [][]byte) error {
	seq, ok := s.frameSeq(frames)
	if !ok {
		return nil
	}
	payload := frames[2]
	q := &s.seq
	// A live message came first: the checks below take the place of the
	// confirmation at subscription.
	s.resume.confirm = false
	// After a reconnection (or, for a restored source, the conductor's own
	// downtime) the next message is checked against what was applied
	// before it is taken as a continuation (docs/events.md#restarts).
	check := s.conn.reconnected || (s.resume.catchingUp && q.hasDigest) || s.resume.peerFirst
	if s.resume.peerFirst {
		defer s.firstAfterPeer()
	}
	noLive := q.liveNone
	q.liveNone = false
	// Only a publisher that restarted can hold another batch at A, and a
	// restart breaks the connection: a source whose monitor reports
	// reconnections anchors its gaps only after one, as the spec's replay
	// request (from A+1) otherwise stands; one without a monitor anchors
	// every gap.
	s.rec.anchor = check || s.conn.mon == nil
	withReplay := s.rec.replay != nil
	switch {
	case s.State() == Stale:
		if !s.tryStaleRecovery(seq, payload) {
			s.counters.add(MetricDropped, s.typ, events.DropStale, 1)
		}
	case !q.started:
		s.baseline(seq, payload)
	case noLive && seq <= q.applied:
		// already applied from the restarted publisher's buffer
		s.counters.add(MetricDropped, s.typ, events.DropDuplicate, 1)
		q.high = seq
	case seq <= q.high:
		// The live stream went backwards: a new publisher process
		// (docs/events.md#regression).
		return s.newEpoch(EvidenceRegression, seq, payload)
	case seq <= q.applied:
		// already applied through replay
		s.counters.add(MetricDropped, s.typ, events.DropDuplicate, 1)
		q.high = seq
	case seq == q.applied+1 && (!check || !withReplay):
		// In order. Without replay, a reconnection followed by the next
		// number cannot be told from a continuation.
		s.conn.reconnected = false
		q.high = seq
		s.setState(Live)
		s.settleResume(streampos.InOrder)
		s.applyBatch(seq, payload)
	case !withReplay:
		s.counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
		switch {
		case s.resume.catchingUp || s.resume.peerFirst:
			// The conductor's own downtime (or, for a replica
			// bootstrapped from a peer, the time since the peer's
			// cut) lost these; nothing says the publisher restarted.
			s.resumeCold(events.StaleGap)
			s.baseline(seq, payload)
		case s.conn.reconnected:
			return s.newEpoch(EvidenceReconnectJump, seq, payload)
		default:
			s.markStale(events.StaleGap, seq)
		}
	default:
		if seq > q.applied+1 {
			s.counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
			s.log.Info().Uint64("last_applied", q.applied).Uint64("received", seq).Msg("sequence gap; recovering through replay")
		} else {
			s.log.Debug().Uint64("last_applied", q.applied).Msg("reconnected; checking the last applied batch against the replay endpoint")
		}
		q.high = seq
		return s.recover(liveMsg{seq: seq, payload: payload}, false)
	}
	return nil
}

// baseline applies the first message of a stream; nothing before it is
// requested (slow-joiner loss is accepted, as upstream does).
func (s *Subscriber) baseline(seq uint64, payload []byte) {
	s.seq.started = true
	s.seq.high = seq
	s.setState(Live)
	s.applyBatch(seq, payload)
}

// markStale retracts everything the source contributed and ignores it from now
// on (docs/events.md#retraction). seq is the message that triggered it, if any.
func (s *Subscriber) markStale(why events.Reason, seq uint64) {
	if s.State() == Stale {
		return
	}
	if (s.resume.catchingUp || s.resume.peerFirst) && resumable(why) {
		s.coldFromBuffered(why)
		return
	}
	q := &s.seq
	s.counters.add(MetricStale, s.typ, why, 1)
	q.staleAt, q.staleWhy = time.Now(), why
	ev := s.log.Warn().Str("reason", why.String())
	if q.started {
		ev = ev.Uint64("last_applied", q.applied)
	}
	if seq != 0 {
		ev = ev.Uint64("seq", seq)
	}
	if s.willRecover() {
		ev.Dur("hold_off", s.tuning.StaleHoldOff).Msg("source is stale; its entries are retracted and the first message after the hold-off is its new baseline")
	} else {
		ev.Msg("source is stale; its entries are retracted until it is registered again")
	}
	// Retract before publishing the state, so anyone who sees Stale also
	// sees an index without the source's entries.
	s.apply.enter()
	s.apply.retract()
	s.setState(Stale)
	s.apply.leave()
	s.rec.drop()
}
