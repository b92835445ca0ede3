package subscriber

import (
	"slices"
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
}

// Resume outcomes, reported once per restored source through
// Config.OnResume.
const (
	// ResumedInOrder: the first live message followed the recorded
	// sequence; nothing was missed.
	ResumedInOrder = "in_order"
	// ResumedReplay: the downtime's gap was recovered through replay.
	ResumedReplay = "replay"
	// ResumedCold: the gap could not be recovered; the restored entries
	// were dropped and the stream applies from the first message received.
	ResumedCold = "cold"
	// ResumedRestarted: the publisher restarted while the conductor was
	// down; the restored entries were dropped and its new stream indexed.
	ResumedRestarted = "restarted"
	// ResumedLagging: nothing confirmed the restored entries by the
	// catch-up deadline (ExpireResume): they were dropped, and the stream
	// applies from the next message received, as for a new registration
	// (docs/state.md#what-survives-a-restart).
	ResumedLagging = "lagging"
)

// Position is a source's place in its stream for a snapshot.
type Position struct {
	Seq      uint64
	HasSeq   bool
	Stale    bool
	Bindings []events.Binding
	// Digest fingerprints the batch applied at Seq (sources with replay).
	Digest    uint64
	HasDigest bool
}

// Position reports the last applied sequence, the state and (Mooncake) the
// object bindings. The caller must hold Config.Gate for writing, which is
// what makes the answer match the index: no batch is half-applied.
func (s *Subscriber) Position() Position {
	p := Position{Stale: s.State() == Stale}
	if p.Stale {
		return p // nothing of it is in the index
	}
	p.Seq, p.HasSeq = s.LastSeq()
	if p.HasSeq {
		p.Digest, p.HasDigest = s.digest, s.hasDigest
	}
	if !p.HasSeq && s.resumePending.Load() {
		p.Seq, p.HasSeq = s.cfg.Resume.Seq, true
		p.Digest, p.HasDigest = s.cfg.Resume.Digest, s.cfg.Resume.HasDigest
	}
	if b, ok := s.dec.(events.Bindings); ok && p.HasSeq {
		p.Bindings = b.ExportBindings()
	}
	return p
}

// Resumed reports whether a restored source has settled: caught up in
// order, through replay, cold, restarted or lagging (or it was never
// restored).
func (s *Subscriber) Resumed() bool { return !s.resumePending.Load() }

// ExpireResume tells a restored source that the catch-up deadline has
// passed. If nothing has confirmed its restored entries yet (a publisher
// that is gone, or silent), they are dropped within pollInterval: an entry
// nothing confirmed may be the state of an engine that no longer exists,
// and would answer higher than the truth. The source settles as
// ResumedLagging and goes on subscribing. Safe from any goroutine.
func (s *Subscriber) ExpireResume() { s.resumeExpired.Store(true) }

// expireResume, on the run goroutine, drops what the snapshot restored
// once ExpireResume was called and the source is still catching up.
func (s *Subscriber) expireResume() {
	if !s.resuming || !s.resumeExpired.Load() {
		return
	}
	s.log.Warn().Uint64("restored_seq", s.applied).
		Msg("restored source not confirmed by its publisher by the catch-up timeout; its restored entries are dropped and its stream starts over")
	s.gate()
	s.resetStream()
	s.settleResume(ResumedLagging)
	s.ungate()
}

// gate enters the section that changes the index or the sequence state:
// cuts (Config.Gate held for writing) never see half of one. Sections nest
// (a stale transition inside a batch), only the outermost takes the lock.
func (s *Subscriber) gate() {
	if s.cfg.Gate == nil {
		return
	}
	if s.gateDepth == 0 {
		s.cfg.Gate.RLock()
	}
	s.gateDepth++
}

func (s *Subscriber) ungate() {
	if s.cfg.Gate == nil {
		return
	}
	if s.gateDepth--; s.gateDepth == 0 {
		s.cfg.Gate.RUnlock()
	}
}

// startResume sets up a restored source before its goroutine starts: the
// stream continues after Resume.Seq, and a Mooncake source holds its
// bindings again.
func (s *Subscriber) startResume() {
	r := s.cfg.Resume
	if r == nil {
		return
	}
	if r.Stale {
		// Why it went stale is not kept; it recovers like one that
		// lost messages.
		s.retracted = true
		s.staleAt, s.staleWhy = time.Now(), events.ReasonNone
		s.setState(Stale)
		return
	}
	s.started, s.applied, s.high = true, r.Seq, r.Seq
	if s.replay != nil && r.HasDigest {
		s.digest, s.hasDigest = r.Digest, true
	}
	s.resuming = true
	s.resumePending.Store(true)
	if b, ok := s.dec.(events.Bindings); ok {
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
func (s *Subscriber) settleResume(outcome string) {
	if !s.resuming {
		return
	}
	s.resuming = false
	s.log.Info().Str("outcome", outcome).Uint64("last_applied", s.applied).Msg("restored source resumed")
	if s.cfg.OnResume != nil {
		s.cfg.OnResume(outcome)
	}
	// Last: whoever sees Resumed also sees the outcome counted.
	s.resumePending.Store(false)
}

// resumeCold drops what the snapshot restored and makes the source a fresh
// one: the next message applied is its baseline.
func (s *Subscriber) resumeCold(why events.Reason) {
	s.log.Warn().Str("reason", why.String()).Msg("restored source cannot catch up; its restored entries are dropped and it starts over")
	// One gate section: no cut sees the entries gone but the restored
	// position still claimed.
	s.gate()
	s.resetStream()
	s.settleResume(ResumedCold)
	s.ungate()
}

// coldFromBuffered resumes cold in the middle of a recovery: the messages
// buffered meanwhile apply from the first as a fresh stream would.
func (s *Subscriber) coldFromBuffered(why events.Reason) {
	msgs := slices.Clone(s.buffered)
	clear(s.buffered)
	s.buffered = s.buffered[:0]
	s.budget.Reset()
	s.resumeCold(why)
	s.setState(Live)
	for _, m := range msgs {
		switch {
		case !s.started:
			s.baseline(m.seq, m.payload)
		case m.seq == s.applied+1:
			s.high = m.seq
			s.applyBatch(m.seq, m.payload)
		default:
			// A hole among messages received live: the live stream
			// itself lost them, which is the publisher's side.
			s.cfg.Counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
			s.markStale(events.StaleGap, m.seq)
			return
		}
		if s.State() == Stale {
			return
		}
	}
}
