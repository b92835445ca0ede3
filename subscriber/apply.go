package subscriber

import (
	"runtime/debug"
	"sync"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/rs/zerolog"
)

// applier owns the source's decoder and what it does to the index: the
// gate sections a snapshot waits between, whether the source's entries
// were retracted, and the counting of each applied event's outcome, which
// it reads from the decoder after Apply.
type applier struct {
	dec      events.Decoder
	verifier events.Verifier // dec's waiting link verification, if any
	detail   events.RejectDetailer

	gate      *sync.RWMutex // DurableConfig.Gate
	gateDepth int           // nesting of gate sections
	retracted bool

	// Reporting the batch being applied.
	seq      uint64
	typ      sourcetype.Type
	counters *Counters
	outcomes *ServiceOutcomes
	sampled  *zerolog.Logger
	onEvent  func(seq uint64, o events.Outcome)
}

func (a *applier) init(s *Subscriber, dec events.Decoder, deferLinks bool) {
	a.dec = dec
	if v, ok := dec.(events.Verifier); ok && deferLinks {
		a.verifier = v
	}
	a.detail, _ = dec.(events.RejectDetailer)
	a.gate = s.cfg.Durable.Gate
	a.typ, a.counters, a.sampled = s.typ, s.counters, &s.sampled
	a.outcomes = &s.outcomes
	a.onEvent = s.cfg.test.onEvent
}

// enter starts a section that changes the index or the sequence state:
// cuts (the gate held for writing) never see half of one. Sections nest (a
// stale transition inside a batch); only the outermost takes the lock.
func (a *applier) enter() {
	if a.gate == nil {
		return
	}
	if a.gateDepth == 0 {
		a.gate.RLock()
	}
	a.gateDepth++
}

func (a *applier) leave() {
	if a.gate == nil {
		return
	}
	if a.gateDepth--; a.gateDepth == 0 {
		a.gate.RUnlock()
	}
}

// retract removes everything the source put in the index.
func (a *applier) retract() {
	a.retracted = true
	a.dec.Retract()
}

// applyBatch decodes one payload and dispatches its events; the sequence is
// consumed whatever the outcome (docs/events.md#sequence-state-machine).
func (s *Subscriber) applyBatch(seq uint64, payload []byte) {
	s.apply.enter()
	defer s.apply.leave() // last: after the sequence is published
	s.seq.consume(seq, payload, s.rec.replay != nil)
	defer s.seq.publish()
	defer func() {
		// Payloads come from other processes. A decoder or index bug they
		// trigger must not take the whole service down: the source is
		// retracted instead (part of the batch may have been applied).
		if r := recover(); r != nil {
			s.log.Error().Interface("panic", r).Uint64("seq", seq).Bytes("stack", debug.Stack()).Msg("batch handling panicked")
			s.markStale(events.StaleInternal, seq)
		}
	}()
	if s.cfg.test.onApply != nil {
		s.cfg.test.onApply(seq)
	}
	a := &s.apply
	if rej := a.dec.Decode(payload); rej != events.ReasonNone {
		s.counters.add(MetricEnvelopeRejected, s.typ, rej, 1)
		s.sampled.Warn().Uint64("seq", seq).Str("reason", rej.String()).Int("payload_bytes", len(payload)).Msg("batch envelope rejected")
		return
	}
	// An engine batch belongs to one dp rank; a Mooncake master's events
	// carry theirs one by one.
	if dp, ok := a.dec.DPRank(); ok && s.typ.IsEngine() && dp != uint64(s.cfg.Source.DPRank) {
		s.counters.add(MetricBatchRejected, s.typ, events.BatchDPMismatch, 1)
		s.log.Warn().Uint64("seq", seq).Uint64("batch_dp_rank", dp).Int("registered_dp_rank", s.cfg.Source.DPRank).Msg("batch dp_rank does not match the registration")
		s.markStale(events.StaleBatchRejected, seq)
		return
	}
	a.seq = seq
	for i := range a.dec.Apply() {
		res, why := a.dec.Outcome(i)
		a.report(i, res, why)
	}
}

// report counts one event outcome and logs rejections (rate limited).
func (a *applier) report(i int, res events.Result, why events.Reason) {
	switch res {
	case events.Applied:
		a.counters.add(MetricApplied, a.typ, events.ReasonNone, 1)
	case events.Ignored, events.NoOp:
		a.counters.add(MetricIgnored, a.typ, why, 1)
		a.outcomes.add(false, why)
	case events.Rejected:
		a.counters.add(MetricRejected, a.typ, why, 1)
		a.outcomes.add(true, why)
		if e := a.sampled.Warn(); e.Enabled() {
			e.Uint64("seq", a.seq).Int("event", i).Str("reason", why.String())
			if a.detail != nil {
				a.detail.RejectDetail(i, e) // the values judged, against what was expected
			}
			e.Msg("event rejected")
		}
	}
	if a.onEvent != nil {
		a.onEvent(a.seq, events.Outcome{Index: i, Result: res, Reason: why})
	}
}
