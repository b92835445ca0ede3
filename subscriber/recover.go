package subscriber

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/replay"
	zmq "github.com/pebbe/zmq4"
)

// Internal sentinels that end a replay early; neither is a replay failure.
var (
	errStopped      = errors.New("subscriber stopping")
	errStaleInFetch = errors.New("source became stale during replay")
	// errNewEpoch: a live message received during a replay went backwards;
	// it waits in recovery.pendingEpoch.
	errNewEpoch = errors.New("publisher restarted during replay")
)

// recovery owns what filling a gap needs (docs/events.md#recovery): the
// replay client, the live messages buffered meanwhile and their budget,
// whether the batch at A is checked first, and a live message that showed
// a restart during the replay.
type recovery struct {
	replay       *replay.Client // nil: the publisher has no replay endpoint
	buffered     []liveMsg
	budget       replay.Budget
	anchor       bool    // the recovery under way checks the batch at A first
	pendingEpoch liveMsg // the message errNewEpoch stands for
	reported     int     // the budget's bytes last added to Resources' figure
}

// report brings the process-wide figure of bytes held by recoveries
// (conductor_memory_used_bytes{part="receive"}) up to date with this one's.
func (r *recovery) report(sh *Resources) {
	_, n := r.budget.Used()
	sh.receive.held.Add(int64(n - r.reported))
	r.reported = n
}

// liveMsg is a live batch held while a gap is being recovered.
type liveMsg struct {
	seq     uint64
	payload []byte
}

// begin starts buffering with first, copied: live payloads are views into
// the receive batch, valid only until the next receive. It reports false
// when first alone exceeds the budget.
func (r *recovery) begin(first liveMsg, t Tuning, lim ReceiveLimits) bool {
	r.budget = replay.Budget{MaxMessages: t.MaxBufferedMessages, MaxBytes: lim.BufferedBytes}
	r.buffered = r.buffered[:0]
	if !r.budget.Take(len(first.payload)) {
		return false
	}
	first.payload = bytes.Clone(first.payload)
	r.buffered = append(r.buffered, first)
	return true
}

// beginEmpty starts a recovery that holds no live message yet (a restored
// source confirming its position), bounded as any recovery is: by the
// source's share of the receive part under a bounded budget.
func (r *recovery) beginEmpty(t Tuning, lim ReceiveLimits) {
	r.budget = replay.Budget{MaxMessages: t.MaxBufferedMessages, MaxBytes: lim.BufferedBytes}
	r.buffered = r.buffered[:0]
}

// drop forgets the messages held for a recovery.
func (r *recovery) drop() {
	clear(r.buffered)
	r.buffered = r.buffered[:0]
	r.budget.Reset()
}

// take hands over the buffered messages and forgets them.
func (r *recovery) take() []liveMsg {
	msgs := append([]liveMsg(nil), r.buffered...)
	r.drop()
	return msgs
}

// close closes the replay client's socket (it reopens on the next fetch).
func (r *recovery) close() {
	if r.replay != nil {
		r.replay.Close()
	}
}

// recover fills the gap before first from the replay endpoint
// (docs/events.md#recovery), buffering live messages meanwhile, then applies
// replayed and buffered batches in order. The first request is anchored on
// the last applied batch: another process's record there is a publisher
// restart, after which (and when called with epoch set, for a stream just
// reset) the new stream is fetched from its oldest buffered record
// (docs/events.md#restarts). It returns errStopped if Stop interrupted it.
func (s *Subscriber) recover(first liveMsg, epoch bool) error {
	s.conn.reconnected = false
	inOrder := !epoch && first.seq == s.seq.applied+1 // a check after a reconnection, not a gap
	defer s.rec.report(s.shared)
	s.setState(Recovering)
	if !s.rec.begin(first, s.tuning, s.receiveLimits()) {
		s.markStale(events.StaleBufferOverflow, first.seq)
		return nil
	}
	return s.replayRounds(epoch, inOrder, time.Now().Add(s.tuning.ReplayTotalTimeout))
}

// replayRounds fetches and applies until nothing buffered is left behind
// a hole, the recovery fails, or deadline passes. inOrder says nothing is
// known to be missing (a check of the batch at A): the source then settles
// as in order unless a replayed record had to be applied.
func (s *Subscriber) replayRounds(epoch, inOrder bool, deadline time.Time) error {
	defer s.rec.report(s.shared)
	for {
		before, wasStarted := s.seq.applied, s.seq.started
		recs, bounded, err := s.fetch(epoch, deadline)
		s.rec.report(s.shared)
		if err != nil {
			restarted, done, err := s.replayFailed(err, epoch)
			if done {
				return err
			}
			if restarted {
				epoch, inOrder = true, false
				continue
			}
		}
		// The batch at A was checked (or the stream started over): a
		// further round of this recovery continues the same stream.
		epoch, s.rec.anchor = false, false
		if len(recs) > 0 {
			inOrder = false
		}
		if done, err := s.applyRecovered(recs); done {
			return err
		}
		if len(s.rec.buffered) == 0 {
			s.recovered(inOrder)
			return nil
		}
		inOrder = false
		// A round asked without an upper bound (no live message was
		// held yet) could not have filled a hole behind one received
		// since; only a bounded round that advanced nothing is final.
		if bounded && s.seq.applied == before && s.seq.started == wasStarted {
			s.counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
			s.log.Warn().Uint64("last_applied", s.seq.applied).Uint64("next_buffered", s.rec.buffered[0].seq).Msg("replay advanced nothing; gap remains")
			s.markStale(events.StaleReplay, 0)
			return nil
		}
		// A further hole among the buffered messages: recover from A+1 again.
	}
}

// fetch asks the replay endpoint for what lies between A and the first
// buffered message (or, for a new epoch, for the new stream from its
// start), consuming the live stream meanwhile.
func (s *Subscriber) fetch(epoch bool, deadline time.Time) ([]replay.Record, bool, error) {
	if err := s.bufferQueued(); err != nil {
		return nil, false, err
	}
	req := replay.Request{
		From:           s.seq.applied + 1,
		Deadline:       deadline,
		ReceiveTimeout: s.tuning.ReplayReceiveTimeout,
		Budget:         &s.rec.budget,
		Beyond:         s.checkBuffered,
		Watch:          []*zmq.Socket{s.conn.sub, s.conn.stopRx},
		OnWatch:        s.onWatchDuringReplay,
		OnRetry: func(err error) {
			s.counters.add(MetricReplays, s.typ, events.ReplayRetried, 1)
			s.sampled.Warn().Err(err).Msg("replay attempt failed; retrying")
		},
	}
	if len(s.rec.buffered) > 0 {
		req.Until, req.HasUntil = s.rec.buffered[0].seq, true
	}
	switch {
	case epoch:
		req.From, req.FromFirst = 0, true
	case s.seq.hasDigest && s.rec.anchor:
		req.Anchor = s.matchesDigest
	}
	recs, err := s.rec.replay.Fetch(req)
	return recs, req.HasUntil, err
}

// replayFailed handles a fetch that ended with err. done says the recovery
// is over (returning rerr); restarted says the replay endpoint showed a
// new publisher process, whose stream is to be fetched from its start.
// Otherwise the records fetched are applied.
func (s *Subscriber) replayFailed(err error, epoch bool) (restarted, done bool, rerr error) {
	switch {
	case errors.Is(err, errStopped):
		s.counters.add(MetricReplays, s.typ, events.ReplayStopped, 1)
		return false, true, errStopped
	case errors.Is(err, errStaleInFetch):
		return false, true, nil
	case errors.Is(err, errNewEpoch):
		m := s.rec.pendingEpoch
		s.rec.pendingEpoch = liveMsg{}
		s.rec.drop()
		return false, true, s.newEpoch(EvidenceRegression, m.seq, m.payload)
	case errors.Is(err, replay.ErrAnotherProcess):
		s.restartFromReplay(EvidenceReplayMismatch)
		return true, false, nil
	case errors.Is(err, replay.ErrBehind) && s.resume.confirming:
		// The process that published A would hold A or later records:
		// this one has not got that far.
		s.restartFromReplay(EvidenceReplayBehind)
		return true, false, nil
	case errors.Is(err, replay.ErrDeadline) && s.resume.catchingUp && s.catchUpOver():
		s.counters.add(MetricReplays, s.typ, events.ReplayDeadline, 1)
		s.lagFromBuffered(err)
		return false, true, nil
	case errors.Is(err, replay.ErrDeadline) && s.resume.confirming && !s.resume.catchingUp && s.seq.started:
		// A peer's position, already confirmed: a replay endpoint that
		// does not answer disproves nothing. What arrived live meanwhile
		// applies if it follows on; a hole in it cannot be filled.
		s.counters.add(MetricReplays, s.typ, events.ReplayDeadline, 1)
		s.log.Warn().Err(err).Uint64("last_applied", s.seq.applied).Msg("the replay endpoint did not answer; the position taken from the peer stands")
		if done, err := s.applyRecovered(nil); done {
			return false, true, err
		}
		if len(s.rec.buffered) > 0 {
			s.coldFromBuffered(events.StaleDeadline)
			return false, true, nil
		}
		s.setState(Live)
		return false, true, nil
	case epoch:
		// The new process's earlier batches cannot be had; its stream
		// is indexed from the first one received.
		s.log.Warn().Err(err).Msg("the restarted publisher's earlier batches could not be replayed; indexing from the first one received")
		return false, false, nil
	case errors.Is(err, replay.ErrBudget):
		s.counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
		s.log.Warn().Err(err).Msg("replay exceeds recovery buffer")
		s.markStale(events.StaleBufferOverflow, 0)
	case errors.Is(err, replay.ErrDeadline):
		s.counters.add(MetricReplays, s.typ, events.ReplayDeadline, 1)
		s.log.Warn().Err(err).Msg("replay did not complete in time")
		s.markStale(events.StaleDeadline, 0)
	default:
		s.counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
		s.log.Warn().Err(err).Msg("replay cannot fill the gap")
		s.markStale(events.StaleReplay, 0)
	}
	return false, true, nil
}

// restartFromReplay starts the stream over after the replay endpoint
// showed another process (ev): what was buffered came from the new process
// and is kept, and the caller fetches what it published before.
func (s *Subscriber) restartFromReplay(ev Evidence) {
	at := s.seq.applied
	if len(s.rec.buffered) > 0 {
		at = s.rec.buffered[0].seq
	}
	s.countRestart(ev, at)
	s.apply.enter()
	s.resetStream()
	s.settleResume(streampos.Restarted)
	s.apply.leave()
	if n := len(s.rec.buffered); n > 0 {
		s.seq.high = s.rec.buffered[n-1].seq
	} else {
		s.seq.liveNone = true
	}
}

// applyRecovered applies the replayed records, then the buffered messages
// that follow on without a hole. done says the recovery is over (the
// source went stale, or Stop interrupted it: err is errStopped).
func (s *Subscriber) applyRecovered(recs []replay.Record) (done bool, err error) {
	q, r := &s.seq, &s.rec
	for _, rec := range recs {
		r.budget.Give(len(rec.Payload))
		if s.State() == Stale {
			return true, nil
		}
		if s.stopping.Load() {
			return true, errStopped // possibly many records: do not make Stop wait
		}
		q.started = true // a stream started over begins at its first record
		s.applyBatch(rec.Seq, rec.Payload)
	}
	i := 0
	for ; i < len(r.buffered) && s.State() != Stale; i++ {
		m := r.buffered[i]
		if q.started && m.seq > q.applied+1 {
			break
		}
		r.budget.Give(len(m.payload))
		if !q.started || m.seq == q.applied+1 {
			q.started = true
			s.applyBatch(m.seq, m.payload)
			continue
		}
		// A live message a replay without an upper bound also
		// returned: the two copies must agree (docs/events.md#recovery).
		if len(recs) > 0 && m.seq >= recs[0].Seq && m.seq-recs[0].Seq < uint64(len(recs)) &&
			!bytes.Equal(recs[m.seq-recs[0].Seq].Payload, m.payload) {
			s.counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
			s.log.Warn().Uint64("seq", m.seq).Msg("replayed batch differs from the live message")
			s.markStale(events.StaleReplay, m.seq)
			return true, nil
		}
	}
	if s.State() == Stale {
		return true, nil
	}
	n := copy(r.buffered, r.buffered[i:])
	clear(r.buffered[n:])
	r.buffered = r.buffered[:n]
	return false, nil
}

// recovered ends a recovery that applied everything buffered.
func (s *Subscriber) recovered(inOrder bool) {
	outcome := streampos.Replay
	switch {
	case s.resume.confirming && s.resume.catchingUp:
		s.log.Info().Uint64("last_applied", s.seq.applied).Bool("caught_up_through_replay", !inOrder).
			Msg("restored position confirmed by the publisher's replay endpoint: same process")
		if !inOrder {
			s.counters.add(MetricReplays, s.typ, events.ReplayRecovered, 1)
			outcome = streampos.Replay
		} else {
			outcome = streampos.InOrder
		}
	case inOrder:
		s.log.Debug().Uint64("last_applied", s.seq.applied).Msg("the replay endpoint still holds the last applied batch: same publisher")
		outcome = streampos.InOrder
	default:
		s.counters.add(MetricReplays, s.typ, events.ReplayRecovered, 1)
		s.log.Info().Uint64("last_applied", s.seq.applied).Msg("gap recovered")
	}
	s.setState(Live)
	s.settleResume(outcome)
}

// checkBuffered compares a replayed batch at or after the first buffered
// sequence with the live copy: different bytes for one sequence mean the two
// streams disagree and nothing can be trusted (docs/events.md#recovery).
func (s *Subscriber) checkBuffered(seq uint64, payload []byte) error {
	b := s.rec.buffered
	i := sort.Search(len(b), func(i int) bool { return b[i].seq >= seq })
	if i < len(b) && b[i].seq == seq && !bytes.Equal(b[i].payload, payload) {
		return fmt.Errorf("replayed seq %d differs from the live message", seq)
	}
	return nil
}

// onWatchDuringReplay keeps consuming the live stream while a replay runs,
// so the SUB queue cannot overflow and Stop stays prompt.
func (s *Subscriber) onWatchDuringReplay(sock *zmq.Socket) error {
	if sock == s.conn.stopRx || s.stopping.Load() {
		return errStopped
	}
	if sock != s.conn.sub {
		return nil
	}
	return s.drain(s.bufferLive)
}

// bufferQueued hands live messages that were received before the replay
// started but not yet handled (they wait in the receiver, so the SUB
// socket will not report them) to bufferLive, as the replay's watch would
// have.
func (s *Subscriber) bufferQueued() error {
	for s.rx.batch.queued() && s.conn.sub != nil {
		if s.stopping.Load() {
			return errStopped
		}
		frames, err := s.rx.next(s.conn.sub, 0) // queued: no receive
		if err != nil {
			return nil
		}
		if err := s.bufferLive(frames); err != nil {
			return err
		}
	}
	return nil
}

// bufferLive holds one live message received during a replay.
func (s *Subscriber) bufferLive(frames [][]byte) error {
	seq, ok := s.frameSeq(frames)
	if !ok {
		return nil
	}
	q, r := &s.seq, &s.rec
	noLive := q.liveNone
	q.liveNone = false
	if seq <= q.high && !noLive {
		// A new publisher process; handled once the replay is
		// abandoned.
		r.pendingEpoch = liveMsg{seq: seq, payload: bytes.Clone(frames[2])}
		return errNewEpoch
	}
	if seq > q.high+1 {
		s.counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
	}
	q.high = seq
	if !r.budget.Take(len(frames[2])) {
		s.markStale(events.StaleBufferOverflow, seq)
		return errStaleInFetch
	}
	// The frames are views into the receive batch; the buffer outlives it.
	r.buffered = append(r.buffered, liveMsg{seq: seq, payload: bytes.Clone(frames[2])})
	return nil
}
