package subscriber

import (
	"syscall"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
)

// A session libzmq ends over a protocol error is not reconnected: a
// message over ZMQ_MAXMSGSIZE (zmqx.MaxMessageBytes), or a peer that fails
// the ZMTP handshake, leaves the SUB socket without a connection for good
// (libzmq's session_base engine_error), and the source goes deaf. The
// connection monitor tells the two cases apart: libzmq reports
// EVENT_DISCONNECTED for both, followed by EVENT_CONNECT_RETRIED only when
// it reconnects by itself. A loss not followed by a retry within
// sessionLostGrace is healed here by disconnecting and reconnecting the
// endpoint; the messages lost meanwhile are a sequence gap, handled by the
// usual rules (docs/index-memory.md#other-limits, docs/events.md#restarts).
// Sources without a monitor (beyond MaxOptionalMonitors) cannot see the
// loss and are not healed.

// sessionLostGrace is how long a lost session waits for libzmq's own
// reconnection before the subscriber reconnects it. libzmq reports the
// retry as soon as it schedules it (microseconds after the disconnection,
// from the same I/O thread); the margin covers a loaded machine, and a
// reset made needlessly only replaces libzmq's pending reconnection.
const sessionLostGrace = time.Second

// maxSessionBackoff bounds the wait between resets of a publisher that
// loses every new session before sending anything acceptable (one that
// only sends oversize messages, or a non-ZMTP peer at the endpoint).
const maxSessionBackoff = 30 * time.Second

// sessionWatch is the run goroutine's view of the SUB socket's session.
type sessionWatch struct {
	lostAt          time.Time // a session ended and no retry was reported yet
	handshakeFailed bool      // the lost session never completed its handshake
	resets          int       // sessions reconnected by the subscriber
	inARow          int       // resets with no message received in between
	lastReset       time.Time
	selfReset       bool // the next connection is the subscriber's own reset
}

// monitorEvents are the connection events the monitor reports.
const monitorEvents = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED |
	zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH

// onSessionEvent follows the session through one monitor event other
// than EVENT_CONNECTED (which onMonitor handles and which also clears a loss).
func (s *Subscriber) onSessionEvent(ev zmq.Event) {
	switch ev {
	case zmq.EVENT_DISCONNECTED:
		s.session.lostAt = time.Now()
	case zmq.EVENT_CONNECT_RETRIED:
		s.session.lostAt = time.Time{} // libzmq reconnects by itself
		s.session.handshakeFailed = false
	case zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH:
		s.session.handshakeFailed = true
	}
}

// noteReceived records that the session delivers messages, which ends the
// backoff between resets.
func (s *Subscriber) noteReceived() { s.session.inARow = 0 }

// sessionDeadline is when a lost session is reconnected; zero when none is
// lost, or when the SUB socket is gone (a stale source that closed it),
// so the run loop never waits on a deadline nothing will clear.
func (s *Subscriber) sessionDeadline() time.Time {
	w := &s.session
	if w.lostAt.IsZero() || s.sub == nil {
		return time.Time{}
	}
	at := w.lostAt.Add(sessionLostGrace)
	if w.inARow > 0 {
		backoff := min(sessionLostGrace<<min(w.inARow, 5), maxSessionBackoff)
		at = later(at, w.lastReset.Add(backoff))
	}
	return at
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// healSession reconnects the SUB socket once a lost session's deadline has
// passed without libzmq reconnecting.
func (s *Subscriber) healSession(now time.Time) {
	at := s.sessionDeadline()
	if at.IsZero() || now.Before(at) {
		return
	}
	w := &s.session
	handshake := w.handshakeFailed
	w.lostAt, w.handshakeFailed = time.Time{}, false
	if err := s.sub.Disconnect(s.cfg.Endpoint); err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.ENOENT) {
		s.log.Error().Err(err).Msg("cannot disconnect the lost session; the source receives nothing until it is registered again")
		return
	}
	if err := s.sub.Connect(s.cfg.Endpoint); err != nil {
		s.log.Error().Err(err).Msg("cannot reconnect the lost session; the source receives nothing until it is registered again")
		return
	}
	w.resets++
	w.inARow++
	w.lastReset = now
	w.selfReset = true
	if !handshake {
		s.cfg.Counters.add(MetricDropped, s.typ, events.DropOversize, 1)
	}
	ev := s.log.Debug()
	if w.resets == 1 {
		ev = s.log.Warn()
	}
	if handshake {
		ev.Int("resets", w.resets).Msg("the publisher's endpoint failed the ZMTP handshake and libzmq does not retry; reconnected")
		return
	}
	ev.Int("max_message_bytes", zmqx.MaxMessageBytes).Int("resets", w.resets).
		Msg("libzmq dropped the session over a message larger than the limit and does not reconnect; reconnected, the lost messages are a sequence gap")
}

// connectWatch says when a source that never connected has been
// connecting for long enough to warn about it, once.
type connectWatch struct {
	since  time.Time
	after  time.Duration
	warned bool
}

// due reports, once, whether now is past the wait while still not
// connected.
func (w *connectWatch) due(now time.Time, connected bool) bool {
	if w.warned || connected || now.Sub(w.since) < w.after {
		return false
	}
	w.warned = true
	return true
}

// wakeAt is when the run loop must look again; zero once nothing is left
// to warn about.
func (w *connectWatch) wakeAt(connected bool) time.Time {
	if w.warned || connected {
		return time.Time{}
	}
	return w.since.Add(w.after)
}

// knowsConnecting reports whether the source can tell it has not connected:
// its monitor reports connections, and nothing was received.
func (s *Subscriber) knowsConnecting() bool {
	return s.mon != nil && !s.connected.Load() && !s.hasSeq.Load() && s.State() == Connecting
}

// warnIfStillConnecting logs one WARN when the source has been connecting
// for Tuning.ConnectWarnAfter.
func (s *Subscriber) warnIfStillConnecting(now time.Time) {
	if !s.connWatch.due(now, !s.knowsConnecting()) {
		return
	}
	s.log.Warn().Dur("after", s.tuning.ConnectWarnAfter).
		Msg("still not connected to the publisher's endpoint: check the host resolves, the port, and that the engine publishes there; said once, the subscriber keeps trying")
}
