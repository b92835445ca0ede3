package subscriber

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/source"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	"github.com/mooncake-conductor-go/conductor/replay"
	zmq "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"
)

// Internal sentinels that end a replay early; neither is a replay failure.
var (
	errStopped      = errors.New("subscriber stopping")
	errStaleInFetch = errors.New("source became stale during replay")
	// errNewEpoch: a live message received during a replay went backwards;
	// it waits in Subscriber.pendingEpoch.
	errNewEpoch = errors.New("publisher restarted during replay")
)

// drainBurst bounds how many queued messages are handled between two polls,
// so a stop request is noticed promptly even under full-speed traffic.
const drainBurst = 1024

// DefaultLinkDefer is how many bytes of applied vLLM events one
// subscriber may hold for verification while messages keep arriving
// (Config.LinkDefer): 16 MiB is about 200 K blocks of 16 tokens. A burst
// of up to half that is made visible without waiting for its SHA-256;
// beyond, events are verified as they arrive (events.Verifier.CatchUp),
// and only an event too large for what is left goes unverified
// (conductor_link_verify_shed_total).
const DefaultLinkDefer = 16 << 20

// idleVerifyBlocks is how many waiting blocks are verified between two
// looks at the socket: about 50 µs of SHA-256, so a message arriving meanwhile
// waits little.
const idleVerifyBlocks = 128

// pollInterval is a safety net: the run loop wakes at least this often to
// check the stop flag even if the stop socket misbehaves.
const pollInterval = 2 * time.Second

var stopEndpointSeq atomic.Uint64

// SocketsPerSource is the most ZMQ sockets one subscription holds at once:
// the SUB, the stop pair's receiving end (its sending end exists only
// while Stop runs), the replay DEALER (during recovery), and the connection
// monitor and libzmq's end of it. An idle, connected source holds two
// sockets, four with a monitor, i.e. that many descriptors plus its TCP
// connection.
const SocketsPerSource = 6

// MaxOptionalMonitors bounds the connection monitors held at once by
// sources that watch their connection only to report it (the registry's
// state, sources registered at run time) rather than for readiness
// (Config.WatchConnection, the config file's). A monitor lives as long as
// its source, because reconnections are evidence of publisher restarts
// (docs/events.md#restarts): without the bound, 4,096 sources would hold
// five descriptors each instead of three, beyond the budget the README's
// limits give. 1,024 monitors are 2,048 descriptors, within that budget's
// headroom; a source started beyond the bound reports connected with its
// first batch instead, sees no reconnections, and so checks every gap
// against its replay endpoint; nor does it see a session libzmq ended for
// good (an oversize message, session.go), so it stays deaf until
// registered again. A slot that frees is not handed to such a source: a
// monitor attached late would miss the connection under way, and count
// its connections from a point it cannot know.
const MaxOptionalMonitors = 1024

// optionalMonitors counts the monitors held under MaxOptionalMonitors.
// Process-wide because what it rations is: libzmq's socket limit
// (zmqx.ReserveSockets) counts every socket of the process.
var optionalMonitors atomic.Int32

// Subscriber consumes one registered publisher. All sequence state and all
// index writes belong to its goroutine, so no locks guard them; the exported
// methods only read atomics.
type Subscriber struct {
	cfg     Config
	typ     source.Type
	tuning  Tuning
	log     zerolog.Logger
	sampled zerolog.Logger // per-message warnings, rate limited

	state     atomic.Int32
	connected atomic.Bool
	lastSeq   atomic.Uint64
	hasSeq    atomic.Bool
	stopping  atomic.Bool

	stopOnce sync.Once
	stopName string // inproc endpoint of stopRx; Stop connects to it
	done     chan struct{}

	// Owned by the run goroutine.
	sub       *zmq.Socket
	mon       *zmq.Socket // connection monitor, closed once connected
	monSlot   bool        // mon holds one of the optional monitors' slots
	stopRx    *zmq.Socket
	poller    *zmq.Poller
	replay    *replay.Client
	dec       events.Decoder
	verifier  events.Verifier // dec's waiting link verification, if any
	rep       reporter        // the outcome of each event of the batch being applied
	frames    [][]byte
	rx        batchReceiver
	depth     int    // nested drains (a replay drains the SUB from inside one)
	applied   uint64 // A: last applied sequence
	high      uint64 // L: highest live sequence received
	started   bool   // A and L are set
	retracted bool
	buffered  []liveMsg
	budget    replay.Budget
	gateDepth int   // nesting of gate sections (resume.go)
	told      State // the last state told to Config.OnState (Connecting at start)
	resuming  bool  // restored, catch-up not settled yet
	// digest fingerprints the batch applied at A (sources with replay),
	// checked against the replay endpoint's record at A before a gap is
	// filled or after a reconnection (epoch.go).
	digest    uint64
	hasDigest bool
	// connects counts the connections the monitor reported; reconnected
	// says one came after the first and the next message has not been
	// checked against it yet.
	connects    int
	reconnected bool
	session     sessionWatch // sessions libzmq lost for good (session.go)
	connWatch   connectWatch // a first connection that does not come (session.go)
	anchor      bool         // the recovery under way checks the batch at A first
	// staleAt and staleWhy are when and why the source went stale, for
	// StaleRecoveryAuto.
	staleAt      time.Time
	staleWhy     events.Reason
	pendingEpoch liveMsg // the message errNewEpoch stands for

	restarts   atomic.Uint64 // publisher restarts detected
	recoveries atomic.Uint64 // stale states left by themselves

	resumePending atomic.Bool // resuming, for other goroutines
	resumeExpired atomic.Bool // ExpireResume was called
}

// liveMsg is a live batch held while a gap is being recovered.
type liveMsg struct {
	seq     uint64
	payload []byte
}

// Start validates cfg, connects the SUB socket and starts the subscriber's
// goroutine. The caller must eventually call Stop, which retracts everything
// the source contributed (engine entries excepted under
// Config.OwnerRemovedAfterStop).
func Start(cfg Config) (*Subscriber, error) {
	if layoutErr != nil {
		return nil, fmt.Errorf("start subscriber %s: %w", cfg.Key, CheckZMQBinding(nil))
	}
	s, err := newSubscriber(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.open(); err != nil {
		s.closeSockets()
		return nil, fmt.Errorf("start subscriber %s: %w", cfg.Key, err)
	}
	s.state.Store(int32(Connecting))
	s.connWatch = connectWatch{since: time.Now(), after: s.tuning.ConnectWarnAfter}
	s.startResume()
	go s.run()
	return s, nil
}

// newSubscriber validates cfg and builds the decoders, without sockets.
func newSubscriber(cfg Config) (*Subscriber, error) {
	typ := cfg.Type
	if typ >= source.NumTypes {
		return nil, fmt.Errorf("start subscriber %s: unknown publisher type %v", cfg.Key, typ)
	}
	if cfg.Profile.Projection() == 0 {
		return nil, fmt.Errorf("start subscriber %s: hash profile is not resolved", cfg.Key)
	}
	switch {
	case typ == source.Mooncake && cfg.Lookup == nil:
		return nil, fmt.Errorf("start subscriber %s: Mooncake source needs a context lookup", cfg.Key)
	case typ != source.Mooncake && isNilSink(cfg.Engine):
		return nil, fmt.Errorf("start subscriber %s: engine source needs an index table", cfg.Key)
	}
	s := &Subscriber{
		cfg:    cfg,
		typ:    typ,
		tuning: cfg.Tuning.withDefaults(),
		done:   make(chan struct{}),
	}
	s.rep.s = s
	s.log = cfg.Logger.With().Str("service", cfg.Key).Str("type", typ.String()).Str("endpoint", cfg.Endpoint).Logger()
	s.sampled = s.log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Minute})
	var err error
	s.dec, err = events.New(events.Config{
		Type: typ, Profile: cfg.Profile, Context: cfg.Context,
		Engine: cfg.Engine, Owner: cfg.Owner, Lookup: cfg.Lookup, Logger: s.log,
		Check: cfg.HashCheck, Links: cfg.Links, LinkDefer: linkDefer(cfg),
	})
	if err != nil {
		return nil, fmt.Errorf("start subscriber %s: %w", cfg.Key, err)
	}
	if v, ok := s.dec.(events.Verifier); ok && linkDefer(cfg) > 0 {
		s.verifier = v
	}
	if typ == source.Mooncake {
		if cfg.ReplayEndpoint != "" {
			s.log.Warn().Str("replay_endpoint", cfg.ReplayEndpoint).Msg("the Mooncake master has no replay; replay_endpoint ignored")
		}
	} else {
		if cfg.ReplayEndpoint != "" {
			s.replay = replay.NewClient(cfg.ReplayEndpoint)
		}
	}
	return s, nil
}

// linkDefer is the decoder's Config.LinkDefer for cfg.
func linkDefer(cfg Config) int {
	switch {
	case cfg.Links == nil || cfg.LinkDefer < 0:
		return 0
	case cfg.LinkDefer == 0:
		return DefaultLinkDefer
	}
	return cfg.LinkDefer
}

// isNilSink reports a missing sink, including a nil *index.Table wrapped in
// the interface (which would only fail later, inside the goroutine).
func isNilSink(e events.EngineSink) bool {
	if e == nil {
		return true
	}
	t, ok := e.(*index.Table)
	return ok && t == nil
}

// open creates the SUB socket and the inproc pair Stop uses to wake the
// goroutine out of a blocking poll.
func (s *Subscriber) open() error {
	sub, err := zmqx.NewSocket(zmq.SUB, s.tuning.RcvHWM)
	if err != nil {
		return err
	}
	s.sub = sub
	if err := sub.SetSubscribe(""); err != nil {
		return fmt.Errorf("subscribe to all topics: %w", err)
	}
	seq := stopEndpointSeq.Add(1)
	// Readiness and the reported state need to know when the TCP/IPC
	// connection is up, which ZMQ only tells a socket monitor, and only
	// of connections made after it is attached: so it is attached before
	// Connect, and retired at the first connection. It costs two sockets
	// (two descriptors) meanwhile; see optionalMonitors for the bound.
	switch {
	case s.cfg.WatchConnection:
		if err := s.openMonitor(seq); err != nil {
			return err
		}
	case optionalMonitors.Add(1) <= MaxOptionalMonitors:
		s.monSlot = true
		if err := s.openMonitor(seq); err != nil {
			// The state then turns connected with the first batch,
			// as it would beyond the bound.
			s.log.Debug().Err(err).Msg("no connection monitor")
			s.closeMonitor()
		}
	default:
		optionalMonitors.Add(-1)
	}
	if err := sub.Connect(s.cfg.Endpoint); err != nil {
		return fmt.Errorf("connect SUB socket to %s: %w", s.cfg.Endpoint, err)
	}
	// The sending end of the stop pair is created by Stop itself, so a
	// running source holds two sockets, not three.
	s.stopName = fmt.Sprintf("inproc://conductor-subscriber-stop-%d", seq)
	if s.stopRx, err = zmq.NewSocket(zmq.PAIR); err != nil {
		return fmt.Errorf("create stop socket: %w", err)
	}
	_ = s.stopRx.SetLinger(0)
	if err := s.stopRx.Bind(s.stopName); err != nil {
		return fmt.Errorf("bind stop socket: %w", err)
	}
	return nil
}

// openMonitor attaches a connection monitor to the SUB socket.
func (s *Subscriber) openMonitor(seq uint64) error {
	monName := fmt.Sprintf("inproc://conductor-subscriber-monitor-%d", seq)
	if err := s.sub.Monitor(monName, monitorEvents); err != nil {
		return fmt.Errorf("monitor SUB socket: %w", err)
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		_ = s.sub.Monitor("", 0)
		return fmt.Errorf("create monitor socket: %w", err)
	}
	s.mon = mon
	_ = s.mon.SetLinger(0)
	if err := s.mon.Connect(monName); err != nil {
		return fmt.Errorf("connect monitor socket: %w", err)
	}
	return nil
}

// signalStop wakes the run goroutine through the stop pair. If that fails
// (out of sockets), the goroutine still sees the stop flag at its next poll
// timeout.
//
// The send does not wait: connecting to a bound inproc endpoint attaches
// the pipe at once, so it only fails when the goroutine has already seen
// the stop flag (between messages) and closed its end, unbinding the
// endpoint. A blocking send then waited out its whole timeout, making Stop
// take a second.
func (s *Subscriber) signalStop() {
	tx, err := zmq.NewSocket(zmq.PAIR)
	if err == nil {
		defer tx.Close()
		_ = tx.SetLinger(0)
		if err = tx.Connect(s.stopName); err == nil {
			_, err = tx.SendBytes([]byte{1}, zmq.DONTWAIT)
		}
	}
	if err != nil {
		select {
		case <-s.done: // it stopped by itself
		default:
			s.log.Warn().Err(err).Msg("stop signal not delivered; waiting for the poll interval")
		}
	}
}

func (s *Subscriber) closeSockets() {
	s.closeMonitor()
	for _, p := range []**zmq.Socket{&s.sub, &s.stopRx} {
		if *p != nil {
			_ = (*p).Close()
			*p = nil
		}
	}
	if s.replay != nil {
		s.replay.Close()
	}
}

// Stop ends the subscription: it wakes the goroutine (even mid-replay),
// waits for it, closes every socket and retracts everything the source
// contributed (engine entries excepted under Config.OwnerRemovedAfterStop).
// It is idempotent and safe to call concurrently.
func (s *Subscriber) Stop() {
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		s.signalStop()
		<-s.done
	})
	<-s.done
}

// State reports the subscriber's condition. A source whose connection is up
// but that has not delivered a batch yet is Connected, so the state agrees
// with Connected and with readiness.
func (s *Subscriber) State() State {
	st := State(s.state.Load())
	if st == Connecting && s.connected.Load() {
		return Connected
	}
	return st
}

// Connected reports whether the SUB socket has connected to the publisher
// at least once (known through its connection monitor) or received
// anything, which is what readiness waits for.
func (s *Subscriber) Connected() bool { return s.connected.Load() || s.hasSeq.Load() }

// Stale reports whether the source is stale (its entries retracted, later
// messages ignored until it recovers by itself or is registered again).
func (s *Subscriber) Stale() bool { return s.State() == Stale }

// LastSeq returns the last applied sequence number; ok is false before the
// first batch.
func (s *Subscriber) LastSeq() (seq uint64, ok bool) {
	if !s.hasSeq.Load() {
		return 0, false
	}
	return s.lastSeq.Load(), true
}

func (s *Subscriber) setState(st State) {
	s.state.Store(int32(st))
	s.tellState()
}

// tellState tells Config.OnState the state when it is not the last one
// told. Every state change happens on the run goroutine (or in Start,
// before it runs), so told needs no lock.
func (s *Subscriber) tellState() {
	if s.cfg.OnState == nil {
		return
	}
	if st := s.State(); st != s.told {
		s.told = st
		s.cfg.OnState(st)
	}
}

func (s *Subscriber) run() {
	defer func() {
		if !s.retracted && (!s.typ.IsEngine() || !s.cfg.OwnerRemovedAfterStop) {
			s.gate()
			s.retract()
			s.ungate()
		}
		if s.verifier != nil {
			s.verifier.DropPending()
		}
		s.closeMonitor()
		s.rx.discard()
		if s.sub != nil {
			_ = s.sub.Close()
			s.sub = nil
		}
		_ = s.stopRx.Close()
		if s.replay != nil {
			s.replay.Close()
		}
		s.buffered = nil
		s.setState(Stopped)
		s.log.Info().Msg("subscriber stopped")
		close(s.done)
	}()
	s.log.Info().Bool("replay", s.replay != nil).Msg("subscriber started")
	s.poller = zmq.NewPoller()
	s.poller.Add(s.sub, zmq.POLLIN)
	s.poller.Add(s.stopRx, zmq.POLLIN)
	if s.mon != nil {
		s.poller.Add(s.mon, zmq.POLLIN)
	}
	for {
		if s.stopping.Load() {
			return
		}
		timeout := pollInterval
		if at := s.sessionDeadline(); !at.IsZero() {
			timeout = max(min(timeout, time.Until(at)), time.Millisecond)
		}
		if at := s.connWatch.wakeAt(!s.knowsConnecting()); !at.IsZero() {
			timeout = max(min(timeout, time.Until(at)), time.Millisecond)
		}
		verify := false
		switch {
		case s.rx.queued():
			timeout = 0 // received messages wait in s.rx, not in the socket
		case s.verifier != nil && s.verifier.PendingLinks() > 0:
			// Verification waits for a moment with nothing to read.
			timeout, verify = 0, true
		}
		polled, err := s.poller.Poll(timeout)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			s.log.Error().Err(err).Msg("poll failed; subscriber exits")
			return
		}
		for _, p := range polled {
			if p.Socket == s.stopRx {
				return
			}
		}
		for _, p := range polled {
			if p.Socket == s.mon && s.mon != nil {
				s.onMonitor()
			}
		}
		readable := s.rx.queued()
		for _, p := range polled {
			if p.Socket == s.sub {
				readable = true
			}
		}
		if readable && s.sub != nil {
			if err := s.drain(s.onLive); errors.Is(err, errStopped) {
				return
			}
		} else if verify && len(polled) == 0 {
			s.verifier.VerifyPending(idleVerifyBlocks)
		}
		s.expireResume()
		s.closeIfStale()
		now := time.Now()
		s.healSession(now)
		s.warnIfStillConnecting(now)
	}
}

// onMonitor reads connection events: the first connection marks the
// source connected, a later one is a reconnection.
func (s *Subscriber) onMonitor() {
	for {
		ev, _, _, err := s.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		if ev != zmq.EVENT_CONNECTED {
			s.onSessionEvent(ev)
			continue
		}
		s.session.lostAt, s.session.handshakeFailed = time.Time{}, false
		selfReset := s.session.selfReset
		s.session.selfReset = false
		// The monitor stays: a later connection is a reconnection, after
		// which the next message is checked against what was applied
		// (docs/events.md#restarts).
		s.connects++
		if s.connects == 1 {
			s.connected.Store(true)
			s.tellState()
			if s.connWatch.warned {
				s.log.Info().Dur("after", time.Since(s.connWatch.since)).Msg("connected to publisher")
			} else {
				s.log.Debug().Msg("connected to publisher")
			}
			continue
		}
		// After the subscriber's own reset of a lost session, a source
		// with replay checks the batch at A as after any reconnection;
		// one without replay takes a jump as the gap it is (the stale
		// rules), not as a restart, since the publisher kept running.
		if s.started && (!selfReset || s.replay != nil) {
			s.reconnected = true
		}
		s.log.Debug().Int("connections", s.connects).Msg("reconnected to publisher")
	}
}

// closeMonitor stops monitoring the SUB socket, closes the monitor's
// socket and gives back its slot among the optional monitors; idempotent.
func (s *Subscriber) closeMonitor() {
	if s.monSlot {
		s.monSlot = false
		optionalMonitors.Add(-1)
	}
	if s.mon == nil {
		return
	}
	if s.poller != nil {
		_ = s.poller.RemoveBySocket(s.mon)
	}
	if s.sub != nil {
		_ = s.sub.Monitor("", 0)
	}
	_ = s.mon.Close()
	s.mon = nil
}

// closeIfStale drops the SUB and DEALER sockets of a stale source that will
// not recover by itself: its messages are ignored anyway, and the publisher
// then stops queueing them. One that will recover keeps its SUB.
func (s *Subscriber) closeIfStale() {
	if s.State() != Stale || s.sub == nil {
		return
	}
	if s.willRecover() {
		if s.replay != nil {
			s.replay.Close()
		}
		return
	}
	s.closeMonitor()
	s.rx.discard()
	_ = s.poller.RemoveBySocket(s.sub)
	_ = s.sub.Close()
	s.sub = nil
	if s.replay != nil {
		s.replay.Close()
	}
}

// drain handles up to drainBurst queued live messages with handle. The
// frames handed to handle are valid only until it returns.
//
// Messages are received in batches (batchReceiver) and queued in s.rx until
// handled. A drain nested inside a handler (a replay watching the SUB)
// takes the outer drain's queued messages first, so the order of the live
// stream is kept; the C batch is given back when the outermost drain ends
// with nothing queued.
func (s *Subscriber) drain(handle func(frames [][]byte) error) error {
	s.depth++
	defer func() {
		if s.depth--; s.depth == 0 {
			s.forgetPayloads()
			s.rx.idle()
		}
	}()
	for i := range drainBurst {
		if s.sub == nil {
			return nil
		}
		if s.stopping.Load() {
			return errStopped
		}
		var frames [][]byte
		var err error
		frames, err = s.rx.recv(s.sub, s.frames[:0], drainBurst-i)
		s.frames = frames
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				return nil
			}
			s.cfg.Counters.add(MetricDropped, s.typ, events.DropReceiveError, 1)
			s.sampled.Warn().Err(err).Msg("receive failed")
			return nil
		}
		s.noteReceived()
		if err := handle(frames); err != nil {
			return err
		}
		if s.verifier != nil {
			s.verifier.CatchUp()
		}
	}
	return nil
}

// forgetPayloads drops every view into received messages before their
// batch is released: the frames, the reader and the decoders' per-batch
// fields. Nothing reads them after the batch, but a Go pointer left aimed
// at freed C memory is a hazard should the Go heap ever map that range.
func (s *Subscriber) forgetPayloads() {
	clear(s.frames[:cap(s.frames)])
	s.dec.Forget()
}

// keepFrames is how many frames of a live message are kept: a well-formed
// one has three (docs/events.md#framing), and a fourth or more only needs to be seen to be
// counted as malformed.
const keepFrames = 4

// frameSeq checks the framing rules of docs/events.md#framing and returns the
// sequence; ok=false means the message was dropped (and counted).
func (s *Subscriber) frameSeq(frames [][]byte) (uint64, bool) {
	s.cfg.Counters.add(MetricReceived, s.typ, events.ReasonNone, 1)
	var why events.Reason
	switch {
	case len(frames) != 3:
		why = events.DropFrameCount
	case len(frames[1]) != 8:
		why = events.DropSeqLength
	}
	if why == events.ReasonNone {
		seq := binary.BigEndian.Uint64(frames[1])
		if seq <= math.MaxInt64 {
			return seq, true
		}
		why = events.DropSeqReserved
	}
	s.cfg.Counters.add(MetricDropped, s.typ, why, 1)
	s.sampled.Warn().Str("reason", why.String()).Int("frames", len(frames)).Msg("malformed message dropped")
	return 0, false
}

// onLive runs the sequence state machine
// (docs/events.md#sequence-state-machine) for one live message.
func (s *Subscriber) onLive(frames [][]byte) error {
	seq, ok := s.frameSeq(frames)
	if !ok {
		return nil
	}
	payload := frames[2]
	// After a reconnection (or, for a restored source, the conductor's own
	// downtime) the next message is checked against what was applied
	// before it is taken as a continuation (docs/events.md#restarts).
	check := s.reconnected || (s.resuming && s.hasDigest)
	// Only a publisher that restarted can hold another batch at A, and a
	// restart breaks the connection: a source whose monitor reports
	// reconnections anchors its gaps only after one, as the spec's replay
	// request (from A+1) otherwise stands; one without a monitor anchors
	// every gap.
	s.anchor = check || s.mon == nil
	switch {
	case s.State() == Stale:
		if !s.tryStaleRecovery(seq, payload) {
			s.cfg.Counters.add(MetricDropped, s.typ, events.DropStale, 1)
		}
	case !s.started:
		s.baseline(seq, payload)
	case seq <= s.high:
		// The live stream went backwards: a new publisher process
		// (docs/events.md#regression).
		return s.newEpoch(EvidenceRegression, seq, payload)
	case seq <= s.applied:
		// already applied through replay
		s.cfg.Counters.add(MetricDropped, s.typ, events.DropDuplicate, 1)
		s.high = seq
	case seq == s.applied+1 && (!check || s.replay == nil):
		// In order. Without replay, a reconnection followed by the next
		// number cannot be told from a continuation.
		s.reconnected = false
		s.high = seq
		s.setState(Live)
		s.settleResume(ResumedInOrder)
		s.applyBatch(seq, payload)
	case s.replay == nil:
		s.cfg.Counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
		switch {
		case s.resuming:
			// The conductor's own downtime lost these; nothing says
			// the publisher restarted.
			s.resumeCold(events.StaleGap)
			s.baseline(seq, payload)
		case s.reconnected:
			return s.newEpoch(EvidenceReconnectJump, seq, payload)
		default:
			s.markStale(events.StaleGap, seq)
		}
	default:
		gap := seq > s.applied+1
		if gap {
			s.cfg.Counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
			s.log.Info().Uint64("last_applied", s.applied).Uint64("received", seq).Msg("sequence gap; recovering through replay")
		} else {
			s.log.Debug().Uint64("last_applied", s.applied).Msg("reconnected; checking the last applied batch against the replay endpoint")
		}
		s.high = seq
		return s.recover(liveMsg{seq: seq, payload: payload}, false)
	}
	return nil
}

// baseline applies the first message of a stream; nothing before it is
// requested (slow-joiner loss is accepted, as upstream does).
func (s *Subscriber) baseline(seq uint64, payload []byte) {
	s.started = true
	s.high = seq
	s.setState(Live)
	s.applyBatch(seq, payload)
}

// recover fills the gap before first from the replay endpoint
// (docs/events.md#recovery), buffering live messages meanwhile, then applies
// replayed and buffered batches in order. The first request is anchored on
// the last applied batch: another process's record there is a publisher
// restart, after which (and when called with epoch set, for a stream just
// reset) the new stream is fetched from its oldest buffered record
// (docs/events.md#restarts). It returns errStopped if Stop interrupted it.
func (s *Subscriber) recover(first liveMsg, epoch bool) error {
	s.reconnected = false
	inOrder := !epoch && first.seq == s.applied+1 // a check after a reconnection, not a gap
	s.setState(Recovering)
	s.budget = replay.Budget{MaxMessages: s.tuning.MaxBufferedMessages, MaxBytes: s.tuning.MaxBufferedBytes}
	s.buffered = s.buffered[:0]
	if !s.budget.Take(len(first.payload)) {
		s.markStale(events.StaleBufferOverflow, first.seq)
		return nil
	}
	// Live payloads are views into the receive batch, valid only until the
	// next receive; buffered ones outlive it.
	first.payload = bytes.Clone(first.payload)
	s.buffered = append(s.buffered, first)
	deadline := time.Now().Add(s.tuning.ReplayTotalTimeout)
	for {
		before, wasStarted := s.applied, s.started
		var recs []replay.Record
		err := s.bufferQueued()
		if err == nil {
			req := replay.Request{
				From:           s.applied + 1,
				Until:          s.buffered[0].seq,
				HasUntil:       true,
				Deadline:       deadline,
				ReceiveTimeout: s.tuning.ReplayReceiveTimeout,
				Budget:         &s.budget,
				Beyond:         s.checkBuffered,
				Watch:          []*zmq.Socket{s.sub, s.stopRx},
				OnWatch:        s.onWatchDuringReplay,
				OnRetry: func(err error) {
					s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayRetried, 1)
					s.sampled.Warn().Err(err).Msg("replay attempt failed; retrying")
				},
			}
			switch {
			case epoch:
				req.From, req.FromFirst = 0, true
			case s.hasDigest && s.anchor:
				req.Anchor = s.matchesDigest
			}
			recs, err = s.replay.Fetch(req)
		}
		switch {
		case err == nil:
		case errors.Is(err, errStopped):
			s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayStopped, 1)
			return errStopped
		case errors.Is(err, errStaleInFetch):
			return nil
		case errors.Is(err, errNewEpoch):
			m := s.pendingEpoch
			s.pendingEpoch = liveMsg{}
			s.dropBuffered()
			return s.newEpoch(EvidenceRegression, m.seq, m.payload)
		case errors.Is(err, replay.ErrAnotherProcess):
			// What was buffered came from the new process: keep it,
			// and fetch what it published before.
			s.countRestart(EvidenceReplayMismatch, s.buffered[0].seq)
			s.gate()
			s.resetStream()
			s.settleResume(ResumedRestarted)
			s.ungate()
			s.high = s.buffered[len(s.buffered)-1].seq
			epoch, inOrder = true, false
			continue
		case epoch:
			// The new process's earlier batches cannot be had; its
			// stream is indexed from the first one received.
			s.log.Warn().Err(err).Msg("the restarted publisher's earlier batches could not be replayed; indexing from the first one received")
		case errors.Is(err, replay.ErrBudget):
			s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
			s.log.Warn().Err(err).Msg("replay exceeds recovery buffer")
			s.markStale(events.StaleBufferOverflow, 0)
			return nil
		case errors.Is(err, replay.ErrDeadline):
			s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayDeadline, 1)
			s.log.Warn().Err(err).Msg("replay did not complete in time")
			s.markStale(events.StaleDeadline, 0)
			return nil
		default:
			s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
			s.log.Warn().Err(err).Msg("replay cannot fill the gap")
			s.markStale(events.StaleReplay, 0)
			return nil
		}
		// The batch at A was checked (or the stream started over): a
		// further round of this recovery continues the same stream.
		epoch, s.anchor = false, false
		for _, rec := range recs {
			s.budget.Give(len(rec.Payload))
			if s.State() == Stale {
				return nil
			}
			if s.stopping.Load() {
				return errStopped // up to 10000 records: do not make Stop wait
			}
			s.started = true // a stream started over begins at its first record
			s.applyBatch(rec.Seq, rec.Payload)
		}
		i := 0
		for ; i < len(s.buffered) && s.State() != Stale; i++ {
			m := s.buffered[i]
			if s.started && m.seq > s.applied+1 {
				break
			}
			s.budget.Give(len(m.payload))
			if !s.started || m.seq == s.applied+1 {
				s.started = true
				s.applyBatch(m.seq, m.payload)
			}
		}
		if s.State() == Stale {
			return nil
		}
		n := copy(s.buffered, s.buffered[i:])
		clear(s.buffered[n:])
		s.buffered = s.buffered[:n]
		if len(s.buffered) == 0 {
			outcome := ResumedReplay
			if inOrder {
				s.log.Debug().Uint64("last_applied", s.applied).Msg("the replay endpoint still holds the last applied batch: same publisher")
				outcome = ResumedInOrder
			} else {
				s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayRecovered, 1)
				s.log.Info().Uint64("last_applied", s.applied).Msg("gap recovered")
			}
			s.setState(Live)
			s.settleResume(outcome)
			return nil
		}
		inOrder = false
		if s.applied == before && s.started == wasStarted {
			s.cfg.Counters.add(MetricReplays, s.typ, events.ReplayUnrecoverable, 1)
			s.log.Warn().Uint64("last_applied", s.applied).Uint64("next_buffered", s.buffered[0].seq).Msg("replay advanced nothing; gap remains")
			s.markStale(events.StaleReplay, 0)
			return nil
		}
		// A further hole among the buffered messages: recover from A+1 again.
	}
}

// dropBuffered forgets the messages held for a recovery.
func (s *Subscriber) dropBuffered() {
	clear(s.buffered)
	s.buffered = s.buffered[:0]
	s.budget.Reset()
}

// checkBuffered compares a replayed batch at or after the first buffered
// sequence with the live copy: different bytes for one sequence mean the two
// streams disagree and nothing can be trusted (docs/events.md#recovery).
func (s *Subscriber) checkBuffered(seq uint64, payload []byte) error {
	i := sort.Search(len(s.buffered), func(i int) bool { return s.buffered[i].seq >= seq })
	if i < len(s.buffered) && s.buffered[i].seq == seq && !bytes.Equal(s.buffered[i].payload, payload) {
		return fmt.Errorf("replayed seq %d differs from the live message", seq)
	}
	return nil
}

// onWatchDuringReplay keeps consuming the live stream while a replay runs,
// so the SUB queue cannot overflow and Stop stays prompt.
func (s *Subscriber) onWatchDuringReplay(sock *zmq.Socket) error {
	if sock == s.stopRx || s.stopping.Load() {
		return errStopped
	}
	if sock != s.sub {
		return nil
	}
	return s.drain(s.bufferLive)
}

// bufferQueued hands live messages that were received before the replay
// started but not yet handled (they wait in s.rx, so the SUB socket will
// not report them) to bufferLive, as the replay's watch would have.
func (s *Subscriber) bufferQueued() error {
	for s.rx.queued() && s.sub != nil {
		if s.stopping.Load() {
			return errStopped
		}
		frames, err := s.rx.recv(s.sub, s.frames[:0], 0) // queued: no receive
		s.frames = frames
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
	if seq <= s.high {
		// A new publisher process; handled once the replay is
		// abandoned.
		s.pendingEpoch = liveMsg{seq: seq, payload: bytes.Clone(frames[2])}
		return errNewEpoch
	}
	if seq > s.high+1 {
		s.cfg.Counters.add(MetricGaps, s.typ, events.ReasonNone, 1)
	}
	s.high = seq
	if !s.budget.Take(len(frames[2])) {
		s.markStale(events.StaleBufferOverflow, seq)
		return errStaleInFetch
	}
	// The frames are views into the receive batch; the buffer outlives it.
	s.buffered = append(s.buffered, liveMsg{seq: seq, payload: bytes.Clone(frames[2])})
	return nil
}

// markStale retracts everything the source contributed and ignores it from now
// on (docs/events.md#retraction). seq is the message that triggered it, if any.
func (s *Subscriber) markStale(why events.Reason, seq uint64) {
	if s.State() == Stale {
		return
	}
	if s.resuming && resumable(why) {
		s.coldFromBuffered(why)
		return
	}
	s.cfg.Counters.add(MetricStale, s.typ, why, 1)
	s.staleAt, s.staleWhy = time.Now(), why
	ev := s.log.Warn().Str("reason", why.String())
	if s.started {
		ev = ev.Uint64("last_applied", s.applied)
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
	s.gate()
	s.retract()
	s.setState(Stale)
	s.ungate()
	s.dropBuffered()
}

// retract removes everything the source put in the index.
func (s *Subscriber) retract() {
	s.retracted = true
	s.dec.Retract()
}

// publishApplied makes the last applied sequence visible to LastSeq; it runs
// after the batch's effects, so a caller that sees seq also sees its effects.
func (s *Subscriber) publishApplied() {
	s.lastSeq.Store(s.applied)
	s.hasSeq.Store(true)
}

// applyBatch decodes one payload and dispatches its events; the sequence is
// consumed whatever the outcome (docs/events.md#sequence-state-machine).
func (s *Subscriber) applyBatch(seq uint64, payload []byte) {
	s.gate()
	defer s.ungate() // last: after the sequence is published
	s.applied = seq
	if s.replay != nil {
		// Only a replay endpoint can be asked about it later.
		s.digest, s.hasDigest = digestOf(payload), true
	}
	defer s.publishApplied()
	defer func() {
		// Payloads come from other processes. A decoder or index bug they
		// trigger must not take the whole service down: the source is
		// retracted instead (part of the batch may have been applied).
		if r := recover(); r != nil {
			s.log.Error().Interface("panic", r).Uint64("seq", seq).Bytes("stack", debug.Stack()).Msg("batch handling panicked")
			s.markStale(events.StaleInternal, seq)
		}
	}()
	if s.cfg.onApply != nil {
		s.cfg.onApply(seq)
	}
	if rej := s.dec.Decode(payload); rej != events.ReasonNone {
		s.cfg.Counters.add(MetricEnvelopeRejected, s.typ, rej, 1)
		s.sampled.Warn().Uint64("seq", seq).Str("reason", rej.String()).Int("payload_bytes", len(payload)).Msg("batch envelope rejected")
		return
	}
	// An engine batch belongs to one dp rank; a Mooncake master's events
	// carry theirs one by one.
	if dp, ok := s.dec.DPRank(); ok && s.typ.IsEngine() && dp != uint64(s.cfg.DPRank) {
		s.cfg.Counters.add(MetricBatchRejected, s.typ, events.BatchDPMismatch, 1)
		s.log.Warn().Uint64("seq", seq).Uint64("batch_dp_rank", dp).Int("registered_dp_rank", s.cfg.DPRank).Msg("batch dp_rank does not match the registration")
		s.markStale(events.StaleBatchRejected, seq)
		return
	}
	s.rep.seq = seq
	s.dec.Apply(&s.rep)
}

// reporter passes the outcomes of a batch's events to report, with the
// batch's sequence; it lives in the Subscriber so that handing it to the
// decoder allocates nothing.
type reporter struct {
	s   *Subscriber
	seq uint64
}

func (r *reporter) Report(i int, res events.Result, why events.Reason) {
	r.s.report(r.seq, i, res, why)
}

// report counts one event outcome and logs rejections (rate limited).
func (s *Subscriber) report(seq uint64, i int, res events.Result, why events.Reason) {
	switch res {
	case events.Applied:
		s.cfg.Counters.add(MetricApplied, s.typ, events.ReasonNone, 1)
	case events.Ignored, events.NoOp:
		s.cfg.Counters.add(MetricIgnored, s.typ, why, 1)
	case events.Rejected:
		s.cfg.Counters.add(MetricRejected, s.typ, why, 1)
		if why == events.EvArrayEncoded {
			s.sampled.Warn().Uint64("seq", seq).Int("event", i).Msg("array-encoded event rejected: this engine release predates map-encoded KV events and is not supported")
		} else if e := s.sampled.Warn(); e.Enabled() {
			e.Uint64("seq", seq).Int("event", i).Str("reason", why.String())
			if rd, ok := s.dec.(events.RejectDetailer); ok {
				rd.RejectDetail(i, e) // the values judged, against what was expected
			}
			e.Msg("event rejected")
		}
	}
	if s.cfg.onEvent != nil {
		s.cfg.onEvent(seq, events.Outcome{Index: i, Result: res, Reason: why})
	}
}
