package subscriber

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/replay"
	zmq "github.com/pebbe/zmq4"
	"github.com/rs/zerolog"
)

// DefaultLinkDefer is how many bytes of applied vLLM events one
// subscriber may hold for verification while messages keep arriving
// (VerifyConfig.LinkDefer). A burst of up to half that is made visible
// without waiting for its SHA-256; beyond, events are verified as they
// arrive (events.Verifier.CatchUp), and only an event too large for what is
// left goes unverified (conductor_link_verify_shed_total).
const DefaultLinkDefer = 16 << 20

// idleVerifyBlocks is how many waiting blocks are verified between two
// looks at the socket, so that a message arriving meanwhile waits little.
const idleVerifyBlocks = 128

// pollInterval is a safety net: the run loop wakes at least this often to
// check the stop flag even if the stop socket misbehaves.
const pollInterval = 2 * time.Second

// Subscriber consumes one registered publisher. Its state is split by
// concern, each part owned by one type: the session (sockets, connection
// monitor, reconnections), the receiver (batches taken from libzmq), the
// sequence (the stream's state machine and epochs), the recovery (replay
// and what is buffered meanwhile), the applier (decoder and index writes)
// and the resumption (a restore from a snapshot). All of it belongs to the
// run goroutine, so no locks guard it; the exported methods only read
// atomics.
type Subscriber struct {
	cfg      Config
	typ      sourcetype.Type
	tuning   Tuning
	shared   *Resources
	counters *Counters
	// outcomes counts this source's rejected and ignored events by
	// reason (EventCounts), beside the shared counters by source type.
	outcomes ServiceOutcomes
	log      zerolog.Logger
	sampled  zerolog.Logger // per-message warnings, rate limited

	state    atomic.Int32
	told     State // the last state told to ReportConfig.OnState
	stopping atomic.Bool
	stopOnce sync.Once
	done     chan struct{}

	conn   session    // session.go
	rx     receiver   // receive.go
	seq    sequence   // sequence.go, epoch.go
	rec    recovery   // recover.go
	apply  applier    // apply.go
	resume resumption // resume.go
}

// Start validates cfg, connects the SUB socket and starts the subscriber's
// goroutine. The caller must eventually call Stop, which retracts everything
// the source contributed (engine entries excepted under
// IndexConfig.OwnerRemovedAfterStop).
func Start(cfg Config) (*Subscriber, error) {
	if layoutErr != nil {
		return nil, fmt.Errorf("start subscriber %s: %w", cfg.Source.Key, CheckZMQBinding(nil))
	}
	s, err := newSubscriber(cfg)
	if err != nil {
		return nil, err
	}
	s.shared.receive.join()
	if err := s.conn.open(s); err != nil {
		s.conn.close(s)
		s.rec.close()
		s.shared.receive.leave()
		return nil, fmt.Errorf("start subscriber %s: %w", cfg.Source.Key, err)
	}
	s.state.Store(int32(Connecting))
	s.conn.connWatch = connectWatch{since: time.Now(), after: s.tuning.ConnectWarnAfter}
	s.startResume()
	go s.run()
	return s, nil
}

// newSubscriber validates cfg and builds the decoders, without sockets.
func newSubscriber(cfg Config) (*Subscriber, error) {
	src, ix := &cfg.Source, &cfg.Index
	typ := src.Type
	if typ >= sourcetype.NumTypes {
		return nil, fmt.Errorf("start subscriber %s: unknown publisher type %v", src.Key, typ)
	}
	if ix.Profile.Projection() == 0 {
		return nil, fmt.Errorf("start subscriber %s: hash profile is not resolved", src.Key)
	}
	switch {
	case typ == sourcetype.Mooncake && ix.Lookup == nil:
		return nil, fmt.Errorf("start subscriber %s: Mooncake source needs a context lookup", src.Key)
	case typ != sourcetype.Mooncake && isNilSink(ix.Engine):
		return nil, fmt.Errorf("start subscriber %s: engine source needs an index table", src.Key)
	}
	if cfg.Resources == nil {
		cfg.Resources = NewResources(ResourcesOptions{})
	}
	s := &Subscriber{
		cfg:      cfg,
		typ:      typ,
		tuning:   cfg.Tuning.withDefaults(),
		shared:   cfg.Resources,
		counters: cfg.Resources.counters,
		done:     make(chan struct{}),
	}
	s.log = cfg.Report.Logger.With().Str("service", src.Key).Str("type", typ.String()).Str("endpoint", src.Endpoint).Logger()
	s.sampled = s.log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Minute})
	s.rx.batch.shared = cfg.Resources
	dec, err := events.New(events.Config{
		Type: typ, Profile: ix.Profile, Context: ix.Context,
		Engine: ix.Engine, Owner: ix.Owner, Lookup: ix.Lookup, Logger: s.log,
		Check: cfg.Verify.HashCheck, Links: cfg.Verify.Links, LinkDefer: linkDefer(cfg.Verify),
		Stats: cfg.Resources.events,
	})
	if err != nil {
		return nil, fmt.Errorf("start subscriber %s: %w", src.Key, err)
	}
	s.apply.init(s, dec, linkDefer(cfg.Verify) > 0)
	if typ == sourcetype.Mooncake {
		if src.ReplayEndpoint != "" {
			s.log.Warn().Str("replay_endpoint", src.ReplayEndpoint).Msg("the Mooncake master has no replay; replay_endpoint ignored")
		}
	} else if src.ReplayEndpoint != "" {
		s.rec.replay = replay.NewClient(src.ReplayEndpoint, s.receiveLimits().MaxMessageBytes)
	}
	return s, nil
}

// linkDefer is the decoder's Config.LinkDefer for v.
func linkDefer(v VerifyConfig) int {
	switch {
	case v.Links == nil || v.LinkDefer < 0:
		return 0
	case v.LinkDefer == 0:
		return DefaultLinkDefer
	}
	return v.LinkDefer
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

// Stop ends the subscription: it wakes the goroutine (even mid-replay),
// waits for it, closes every socket and retracts everything the source
// contributed (engine entries excepted under
// IndexConfig.OwnerRemovedAfterStop). It is idempotent and safe to call
// concurrently.
func (s *Subscriber) Stop() {
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		s.conn.signalStop(s)
		<-s.done
	})
	<-s.done
}

// State reports the subscriber's condition. A source whose connection is up
// but that has not delivered a batch yet is Connected, so the state agrees
// with Connected and with readiness.
//
// A source that would be connecting, connected, live or recovering is
// Disconnected while its monitor knows the publisher connection gone, or
// the peer at the endpoint not a ZMQ publisher (link.go; StateDetail says
// which); its entries stay until the usual rules drop them.
func (s *Subscriber) State() State {
	st := State(s.state.Load())
	switch st {
	case Connecting, Connected, Live, Recovering:
		if l := s.conn.link.load(); l == linkDown || l == linkNotZMQ {
			return Disconnected
		}
	}
	if st == Connecting && s.conn.connected.Load() {
		return Connected
	}
	return st
}

// Connected reports whether the SUB socket has connected to the publisher
// at least once (known through its connection monitor) or received
// anything, which is what readiness waits for.
func (s *Subscriber) Connected() bool { return s.conn.connected.Load() || s.seq.hasSeq.Load() }

// Stale reports whether the source is stale (its entries retracted, later
// messages ignored until it recovers by itself or is registered again).
func (s *Subscriber) Stale() bool { return s.State() == Stale }

// LastSeq returns the last applied sequence number; ok is false before the
// first batch.
func (s *Subscriber) LastSeq() (seq uint64, ok bool) { return s.seq.published() }

func (s *Subscriber) setState(st State) {
	s.state.Store(int32(st))
	s.tellState()
}

// tellState tells ReportConfig.OnState the state when it is not the last
// one told. Every state change happens on the run goroutine (or in Start,
// before it runs), so told needs no lock.
func (s *Subscriber) tellState() {
	if s.cfg.Report.OnState == nil {
		return
	}
	if st := s.State(); st != s.told {
		s.told = st
		s.cfg.Report.OnState(st)
	}
}

// run is the subscriber's goroutine: it polls the SUB socket, the stop
// socket and the connection monitor, and between messages does the
// source's timed work (waiting verification, the catch-up deadline, a lost
// session, a connection that does not come).
func (s *Subscriber) run() {
	defer s.exit()
	s.log.Info().Bool("replay", s.rec.replay != nil).Msg("subscriber started")
	c := &s.conn
	c.poller = zmq.NewPoller()
	c.poller.Add(c.sub, zmq.POLLIN)
	c.poller.Add(c.stopRx, zmq.POLLIN)
	if c.mon != nil {
		c.poller.Add(c.mon, zmq.POLLIN)
	}
	for !s.stopping.Load() {
		// Once the SUB is connected (its subscription on its way to the
		// publisher), so that what the publisher sends after the replay
		// endpoint answered arrives live.
		if s.resume.confirm && (c.mon == nil || c.connected.Load()) {
			if err := s.confirmResume(); errors.Is(err, errStopped) {
				return
			}
			continue
		}
		timeout, verify := s.pollTimeout()
		polled, err := c.poller.Poll(timeout)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			s.log.Error().Err(err).Msg("poll failed; subscriber exits")
			return
		}
		readable := s.rx.batch.queued()
		for _, p := range polled {
			switch {
			case p.Socket == c.stopRx:
				return
			case p.Socket == c.sub:
				readable = true
			}
		}
		for _, p := range polled {
			if p.Socket == c.mon && c.mon != nil {
				s.onMonitor()
			}
		}
		if readable && c.sub != nil {
			c.followShare(s)
			if err := s.drain(s.onLive); errors.Is(err, errStopped) {
				return
			}
		} else if verify && len(polled) == 0 {
			s.apply.verifier.VerifyPending(idleVerifyBlocks)
		}
		s.expireResume()
		s.closeIfStale()
		now := time.Now()
		s.healSession(now)
		s.warnIfStillConnecting(now)
		s.checkHandshake(now)
	}
}

// pollTimeout is how long the run loop may wait for a socket, and whether
// waiting verification is due when nothing arrives.
func (s *Subscriber) pollTimeout() (time.Duration, bool) {
	timeout := pollInterval
	if at := s.conn.sessionDeadline(); !at.IsZero() {
		timeout = max(min(timeout, time.Until(at)), time.Millisecond)
	}
	if at := s.conn.connWatch.wakeAt(!s.knowsConnecting()); !at.IsZero() {
		timeout = max(min(timeout, time.Until(at)), time.Millisecond)
	}
	if at := s.conn.link.handshakeDeadline(s.tuning.HandshakeWarnAfter); !at.IsZero() {
		timeout = max(min(timeout, time.Until(at)), time.Millisecond)
	}
	switch {
	case s.rx.batch.queued():
		return 0, false // received messages wait in the receiver, not in the socket
	case s.apply.verifier != nil && s.apply.verifier.PendingLinks() > 0:
		// Verification waits for a moment with nothing to read.
		return 0, true
	}
	return timeout, false
}

// exit retracts what the source contributed (unless the owner's removal
// will), closes everything and publishes Stopped.
func (s *Subscriber) exit() {
	if !s.apply.retracted && (!s.typ.IsEngine() || !s.cfg.Index.OwnerRemovedAfterStop) {
		s.apply.enter()
		s.apply.retract()
		s.apply.leave()
	}
	if s.apply.verifier != nil {
		s.apply.verifier.DropPending()
	}
	s.rx.batch.discard()
	s.conn.close(s)
	s.rec.close()
	s.rec.drop()
	s.rec.buffered = nil
	s.rec.report(s.shared)
	s.shared.receive.leave()
	s.setState(Stopped)
	s.log.Info().Msg("subscriber stopped")
	close(s.done)
}
