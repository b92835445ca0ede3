package subscriber

import (
	"fmt"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// The publisher connection, as the SUB socket's monitor reports it, so
// that the state says when a source has lost its publisher rather than
// staying live after the engine exited (docs/troubleshooting.md#2-is-the-source-live).
//
// A connection counts as up once its ZMTP handshake succeeded
// (EVENT_HANDSHAKE_SUCCEEDED), not when TCP connects (EVENT_CONNECTED): a
// peer that is not ZMQ at all (an HTTP server, any TCP service on the
// port) accepts the TCP connection and then never completes the
// handshake. libzmq says so only sometimes (EVENT_HANDSHAKE_FAILED_* on a
// protocol error or after ZMQ_HANDSHAKE_IVL); a peer whose first byte is
// not ZMTP's 0xff is taken for a ZMTP 1.0 peer and waited on forever,
// without an event. So a TCP connection without a handshake after
// Tuning.HandshakeWarnAfter is named as not a ZMQ publisher too.
//
// Every transition logs once: a WARN when the connection is lost or the
// peer is not a ZMQ publisher, an INFO when a publisher is connected
// again. Sources without a monitor (beyond MaxOptionalMonitors) see none
// of this and keep the stream's state.

// linkState is what the monitor knows of the publisher connection.
type linkState int32

const (
	linkUnknown linkState = iota // no handshake seen yet (or no monitor)
	linkUp                       // a ZMTP handshake with the publisher succeeded; the session holds
	linkDown                     // the session ended and no new one has replaced it yet
	linkNotZMQ                   // the peer at the endpoint does not speak ZMTP
)

// DefaultHandshakeWarnAfter is how long a TCP connection may go without
// completing the ZMTP handshake before its peer is named as not a ZMQ
// publisher. A publisher answers the greeting in one round trip; this is
// far beyond any network's, and below libzmq's own 30 s handshake timeout,
// which some non-ZMQ peers never reach.
const DefaultHandshakeWarnAfter = 10 * time.Second

// link is the run goroutine's view of the publisher connection; state and
// detail are atomics because State and StateDetail are read by other
// goroutines.
type link struct {
	state  atomic.Int32           // linkState
	detail atomic.Pointer[string] // what StateDetail says; nil: nothing
	// tcpAt is when a TCP connection came up whose handshake has not
	// completed yet; zero when none waits.
	tcpAt time.Time
	// since is when the state last changed, for the INFO that ends a
	// loss.
	since time.Time
}

func (l *link) load() linkState { return linkState(l.state.Load()) }

// onLinkEvent follows the connection through one monitor event and logs
// and tells the transitions it makes.
func (s *Subscriber) onLinkEvent(ev zmq.Event, now time.Time) {
	l := &s.conn.link
	switch ev {
	case zmq.EVENT_CONNECTED:
		if l.tcpAt.IsZero() {
			l.tcpAt = now
		}
	case zmq.EVENT_HANDSHAKE_SUCCEEDED:
		l.tcpAt = time.Time{}
		s.setLink(linkUp, "", now)
	case zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
		l.tcpAt = time.Time{}
		s.setLink(linkNotZMQ, "not a ZMQ publisher: the peer at the endpoint broke the ZMTP handshake (protocol error)", now)
	case zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
		l.tcpAt = time.Time{}
		s.setLink(linkNotZMQ, "not a ZMQ publisher: the peer at the endpoint did not complete the ZMTP handshake", now)
	case zmq.EVENT_HANDSHAKE_FAILED_AUTH:
		l.tcpAt = time.Time{}
		s.setLink(linkNotZMQ, "the publisher at the endpoint refused the ZMTP security handshake (it requires authentication)", now)
	case zmq.EVENT_DISCONNECTED:
		l.tcpAt = time.Time{}
		if l.load() == linkUp {
			s.setLink(linkDown, "the publisher connection is lost; libzmq reconnects when the endpoint accepts again", now)
		}
	}
}

// checkHandshake names the peer as not a ZMQ publisher once a TCP
// connection has waited Tuning.HandshakeWarnAfter for its handshake.
func (s *Subscriber) checkHandshake(now time.Time) {
	l := &s.conn.link
	if l.tcpAt.IsZero() || now.Sub(l.tcpAt) < s.tuning.HandshakeWarnAfter {
		return
	}
	// The monitor is read between drains only: a handshake it reported
	// while a long drain (a replay) ran is read now, before the
	// connection is judged.
	if s.conn.mon != nil {
		s.onMonitor()
		if l.tcpAt.IsZero() {
			return
		}
	}
	l.tcpAt = time.Time{}
	s.setLink(linkNotZMQ, fmt.Sprintf("not a ZMQ publisher: the peer at the endpoint accepted the connection but sent no ZMTP handshake in %v", s.tuning.HandshakeWarnAfter), now)
}

// handshakeDeadline is when checkHandshake has something to do; zero
// when no connection waits for its handshake.
func (l *link) handshakeDeadline(after time.Duration) time.Time {
	if l.tcpAt.IsZero() {
		return time.Time{}
	}
	return l.tcpAt.Add(after)
}

// setLink moves the connection to st. A change of state logs once (WARN
// into down or not-ZMQ, INFO back up from either) and tells the state.
func (s *Subscriber) setLink(st linkState, detail string, now time.Time) {
	l := &s.conn.link
	was := l.load()
	if was == st {
		return
	}
	if detail == "" {
		l.detail.Store(nil)
	} else {
		l.detail.Store(&detail)
	}
	l.state.Store(int32(st))
	since := l.since
	l.since = now
	switch {
	case st == linkDown:
		s.log.Warn().Msg("the publisher connection is lost (the publisher exited or the network dropped it); the source is disconnected until libzmq reconnects, its entries are kept")
	case st == linkNotZMQ:
		s.log.Warn().Str("detail", detail).Msg("the endpoint is not a ZMQ publisher: check the registered endpoint is the engine's KV-event publisher port, not its HTTP or another service's port")
	case st == linkUp && (was == linkDown || was == linkNotZMQ):
		s.log.Info().Dur("after", now.Sub(since)).Msg("connected to the publisher again")
	}
	s.tellState()
}

// StateDetail says why the source is in its state, when its state alone
// does not: why it is disconnected (the connection lost, or the peer at
// the endpoint not a ZMQ publisher). Empty otherwise.
func (s *Subscriber) StateDetail() string {
	if s.State() != Disconnected {
		return ""
	}
	if d := s.conn.link.detail.Load(); d != nil {
		return *d
	}
	return ""
}
