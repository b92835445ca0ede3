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
	// atRestored says the source's position is still the restored one:
	// nothing applied and the stream not reset since (Position reports
	// it).
	atRestored bool
	// confirm says the source asks its replay endpoint for the restored
	// batch as soon as it runs (confirmResume); confirming, that it is
	// doing so.
	confirm    bool
	confirming bool
	// peerFirst says the position came confirmed from a live peer and
	// no live message has been handled since: the first one is checked
	// like one after a reconnection, and a gap it shows that cannot be
	// filled starts the stream over instead of making the source stale.
	peerFirst bool
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
	if r := s.resume.restore; r != nil {
		if !p.HasSeq && s.resume.atRestored {
			p.Seq, p.HasSeq = r.Seq, true
			p.Digest, p.HasDigest = r.Digest, r.HasDigest
		}
		// Not confirmed yet: a peer bootstrapping from this cut must
		// not take it as confirmed.
		p.CatchingUp = r.CatchingUp()
	}
	if b, ok := s.apply.dec.(events.Bindings); ok && p.HasSeq {
		p.Bindings = b.ExportBindings()
	}
	if m, ok := s.apply.dec.(events.StandardMap); ok && p.HasSeq {
		p.StdMap, p.HasStdMap = m.ExportStdMap()
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
	s.resume.catchingUp, s.resume.atRestored = true, true
	r.Begin()
	if b, ok := s.apply.dec.(events.Bindings); ok {
		b.ImportBindings(r.Bindings)
	}
	if m, ok := s.apply.dec.(events.StandardMap); ok && !m.ImportStdMap(r.StdMap) {
		// The durable state restores a standard-hash engine only with
		// its map, within the bound; without it the restored blocks
		// could never be removed.
		s.log.Warn().Int("std_map_entries", len(r.StdMap)).Msg("the engine-hash map of the restored source cannot be taken back; its restored entries are dropped")
		s.resetStream()
		s.settleResume(streampos.Cold)
		return
	}
	if s.rec.replay != nil && q.hasDigest {
		// Confirmed (or not) by the replay endpoint as soon as the SUB
		// is connected, without waiting for a live message: an idle
		// engine publishes none (docs/state.md#what-survives-a-restart).
		// A position from a peer is asked about too: what was published
		// between the peer's cut and this subscription is fetched, and a
		// restart meanwhile shows.
		s.resume.confirm = true
	}
	if r.Confirmed {
		// A live peer following the same stream applied up to Seq:
		// nothing to confirm, and the source answers like the peer
		// from the start. A later restart shows by the usual rules,
		// the first message being checked like one after a
		// reconnection (docs/replicas.md#warm-start-from-a-peer).
		s.resume.peerFirst = true
		s.log.Info().Uint64("restored_seq", r.Seq).Msg("restored position taken as confirmed: it comes from a live peer that follows the same stream")
		s.settleResume(streampos.Peer)
	}
}

// confirmResume runs on the goroutine of a restored source with a replay
// endpoint and a digest, once its SUB is connected and before any live
// message was handled: it asks the endpoint for the
// restored sequence A and everything after it, buffering live messages
// meanwhile. The record at A is checked against the digest: the same
// batch confirms the process, and the records after it are applied; another
// one, or nothing at or after A, is a new process, whose own buffer is then
// indexed; A gone from the window (newer records only) resumes cold. It
// ends at the catch-up deadline at the latest (Restore.Deadline), settling
// as lagging then. It returns errStopped if Stop interrupted it.
func (s *Subscriber) confirmResume() error {
	s.resume.confirm, s.resume.confirming = false, true
	defer func() {
		s.resume.confirming = false
		// Checked (or started over): the first live message of a
		// peer's position needs no check of its own any more.
		s.resume.peerFirst = false
	}()
	s.log.Debug().Uint64("restored_seq", s.seq.applied).Msg("asking the replay endpoint for the restored position's batch")
	s.rec.anchor = true
	s.setState(Recovering)
	s.rec.beginEmpty(s.tuning, s.receiveLimits())
	deadline := time.Now().Add(s.tuning.ReplayTotalTimeout)
	if d := s.resume.restore.Deadline; !d.IsZero() && d.Before(deadline) {
		deadline = d
	}
	return s.replayRounds(false, true, deadline)
}

// catchUpOver reports whether the restored source's catch-up deadline has
// passed.
func (s *Subscriber) catchUpOver() bool {
	d := s.resume.restore.Deadline
	return s.resume.restore.Expired() || (!d.IsZero() && !time.Now().Before(d))
}

// lagFromBuffered settles a restored source whose confirmation did not
// arrive by the catch-up deadline as lagging: its restored entries go, and
// the live messages buffered meanwhile apply as a fresh stream would.
func (s *Subscriber) lagFromBuffered(err error) {
	msgs := s.rec.take()
	s.log.Warn().Err(err).Uint64("restored_seq", s.seq.applied).
		Msg("restored source not confirmed by its publisher by the catch-up timeout (its replay endpoint did not answer); its restored entries are dropped and its stream starts over")
	s.apply.enter()
	s.resetStream()
	s.settleResume(streampos.Lagging)
	s.apply.leave()
	s.setState(Live)
	s.applyFresh(msgs)
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
	s.log.Warn().Str("reason", why.String()).Uint64("restored_seq", s.seq.applied).
		Msg("restored source cannot catch up: what its publisher sent since the restored position cannot be had; its restored entries are dropped and it starts over")
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
	s.applyFresh(msgs)
}

// applyFresh applies live messages held during a recovery to a stream
// just reset: the first is its baseline.
func (s *Subscriber) applyFresh(msgs []liveMsg) {
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

// firstAfterPeer ends the check of the first live message after a peer's
// position was taken as confirmed.
func (s *Subscriber) firstAfterPeer() { s.resume.peerFirst = false }
