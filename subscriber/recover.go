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
	reported     int     // the budget's bytes last added to Shared's figure
}

// report brings the process-wide figure of bytes held by recoveries
// (conductor_memory_used_bytes{part="receive"}) up to date with this one's.
func (r *recovery) report(sh *Shared) {
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
	deadline := time.Now().Add(s.tuning.ReplayTotalTimeout)
	for {
		before, wasStarted := s.seq.applied, s.seq.started
		recs, err := s.fetch(epoch, deadline)
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
		if done, err := s.applyRecovered(recs); done {
			return err
		}
		if len(s.rec.buffered) == 0 {
			s.recovered(inOrder)
			return nil
		}
		inOrder = false
		if s.seq.applied == before && s.seq.started == wasStarted {
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
func (s *Subscriber) fetch(epoch bool, deadline time.Time) ([]replay.Record, error) {
	if err := s.bufferQueued(); err != nil {
		return nil, err
	}
	req := replay.Request{
		From:           s.seq.applied + 1,
		Until:          s.rec.buffered[0].seq,
		HasUntil:       true,
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
	switch {
	case epoch:
		req.From, req.FromFirst = 0, true
	case s.seq.hasDigest && s.rec.anchor:
		req.Anchor = s.matchesDigest
	}
	return s.rec.replay.Fetch(req)
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
		// What was buffered came from the new process: keep it, and
		// fetch what it published before.
		s.countRestart(EvidenceReplayMismatch, s.rec.buffered[0].seq)
		s.apply.enter()
		s.resetStream()
		s.settleResume(streampos.Restarted)
		s.apply.leave()
		s.seq.high = s.rec.buffered[len(s.rec.buffered)-1].seq
		return true, false, nil
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
	if inOrder {
		s.log.Debug().Uint64("last_applied", s.seq.applied).Msg("the replay endpoint still holds the last applied batch: same publisher")
		outcome = streampos.InOrder
	} else {
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
	if seq <= q.high {
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
