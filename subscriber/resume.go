package subscriber

import (
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
)

// resumption owns a restore from a snapshot: the durable state's handle
// (DurableConfig.Restore) and whether the catch-up is under way.
type resumption struct {
	restore    *streampos.Restore
	catchingUp bool // restored, catch-up not settled yet
}

// Position reports the last applied sequence, the state and (Mooncake) the
// object bindings. The caller must hold DurableConfig.Gate for writing,
// which is what makes the answer match the index: no batch is half-applied.
func (s *Subscriber) Position() streampos.Position {
	p := streampos.Position{Stale: s.State() == Stale}
	if p.Stale {
		return p // nothing of it is in the index
	}
	p.Seq, p.HasSeq = s.LastSeq()
	if p.HasSeq {
		p.Digest, p.HasDigest = s.seq.digest, s.seq.hasDigest
	}
	if r := s.resume.restore; !p.HasSeq && r != nil && r.CatchingUp() {
		p.Seq, p.HasSeq = r.Seq, true
		p.Digest, p.HasDigest = r.Digest, r.HasDigest
	}
	if b, ok := s.apply.dec.(events.Bindings); ok && p.HasSeq {
		p.Bindings = b.ExportBindings()
	}
	return p
}

// Resumed reports whether a restored source has settled: caught up in
// order, through replay, cold, restarted or lagging (or it was never
// restored).
func (s *Subscriber) Resumed() bool {
	r := s.resume.restore
	return r == nil || !r.CatchingUp()
}

// expireResume, on the run goroutine, drops what the snapshot restored
// once the durable state said the catch-up deadline passed
// (streampos.Restore.Expire) and the source is still catching up: an entry
// nothing confirmed may be the state of an engine that no longer exists,
// and would answer higher than the truth. The source settles as Lagging
// and goes on subscribing.
func (s *Subscriber) expireResume() {
	if !s.resume.catchingUp || !s.resume.restore.Expired() {
		return
	}
	s.log.Warn().Uint64("restored_seq", s.seq.applied).
		Msg("restored source not confirmed by its publisher by the catch-up timeout; its restored entries are dropped and its stream starts over")
	s.apply.enter()
	s.resetStream()
	s.settleResume(streampos.Lagging)
	s.apply.leave()
}

// startResume sets up a restored source before its goroutine starts: the
// stream continues after Restore.Seq, and a Mooncake source holds its
// bindings again.
func (s *Subscriber) startResume() {
	r := s.cfg.Durable.Restore
	if r == nil {
		return
	}
	s.resume.restore = r
	if r.Stale {
		// Why it went stale is not kept; it recovers like one that
		// lost messages.
		s.apply.retracted = true
		s.seq.staleAt, s.seq.staleWhy = time.Now(), events.ReasonNone
		s.setState(Stale)
		return
	}
	q := &s.seq
	q.started, q.applied, q.high = true, r.Seq, r.Seq
	if s.rec.replay != nil && r.HasDigest {
		q.digest, q.hasDigest = r.Digest, true
	}
	s.resume.catchingUp = true
	r.Begin()
	if b, ok := s.apply.dec.(events.Bindings); ok {
		b.ImportBindings(r.Bindings)
	}
}

// resumable reports whether a stale trigger, hit while a restored source
// catches up, is the conductor's own downtime rather than the publisher's
// fault: a gap that cannot be recovered, or a publisher that restarted
// meanwhile. Those resume cold instead of going stale.
func resumable(why events.Reason) bool {
	switch why {
	case events.StaleGap, events.StaleRegression, events.StaleReplay, events.StaleDeadline, events.StaleBufferOverflow:
		return true
	}
	return false
}

// settleResume ends the catch-up with an outcome.
func (s *Subscriber) settleResume(outcome streampos.Outcome) {
	if !s.resume.catchingUp {
		return
	}
	s.resume.catchingUp = false
	s.log.Info().Str("outcome", string(outcome)).Uint64("last_applied", s.seq.applied).Msg("restored source resumed")
	s.resume.restore.Settle(outcome)
}

// resumeCold drops what the snapshot restored and makes the source a fresh
// one: the next message applied is its baseline.
func (s *Subscriber) resumeCold(why events.Reason) {
	s.log.Warn().Str("reason", why.String()).Msg("restored source cannot catch up; its restored entries are dropped and it starts over")
	// One gate section: no cut sees the entries gone but the restored
	// position still claimed.
	s.apply.enter()
	s.resetStream()
	s.settleResume(streampos.Cold)
	s.apply.leave()
}

// coldFromBuffered resumes cold in the middle of a recovery: the messages
// buffered meanwhile apply from the first as a fresh stream would.
func (s *Subscriber) coldFromBuffered(why events.Reason) {
	msgs := s.rec.take()
	s.resumeCold(why)
	s.setState(Live)
	q := &s.seq
	for _, m := range msgs {
		switch {
		case !q.started:
			s.baseline(m.seq, m.payload)
		case m.seq == q.applied+1:
			q.high = m.seq
			s.applyBatch(m.seq, m.payload)
		default:
			// A hole among messages received live: the live stream
			// itself lost them, which is the publisher's side.
			s.counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
			s.markStale(events.StaleGap, m.seq)
			return
		}
		if s.State() == Stale {
			return
		}
	}
}
