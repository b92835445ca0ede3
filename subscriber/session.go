package subscriber

import (
	"fmt"
	"sync/atomic"
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

// sessionWatch is the run goroutine's view of the SUB socket's session
// as libzmq keeps it.
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
	zmq.EVENT_HANDSHAKE_SUCCEEDED |
	zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH

// stopEndpointSeq numbers the inproc endpoints of the stop pairs and
// monitors. Process-wide because the names must be unique in pebbe's
// default ZMQ context, which is the process's.
var stopEndpointSeq atomic.Uint64

// SocketsPerSource is the most ZMQ sockets one subscription holds at once:
// the SUB, the stop pair's receiving end (its sending end exists only
// while Stop runs), the replay DEALER (during recovery), and the connection
// monitor and libzmq's end of it. An idle, connected source holds two
// sockets, four with a monitor, i.e. that many descriptors plus its TCP
// connection.
const SocketsPerSource = 6

// session owns the subscription's sockets and what is known of its
// connection: the SUB, the stop pair's receiving end, the connection
// monitor (with its slot among the optional ones), how many connections
// it reported and whether a lost session waits to be healed.
type session struct {
	sub      *zmq.Socket
	mon      *zmq.Socket // connection monitor
	monSlot  bool        // mon holds one of the optional monitors' slots
	stopRx   *zmq.Socket
	stopName string // inproc endpoint of stopRx; Stop connects to it
	poller   *zmq.Poller

	hwm     int // the SUB's receive high-water mark now (receiveLimits)
	maxMsg  int // its ZMQ_MAXMSGSIZE
	largest int // the largest message received, in payload bytes (followShare)

	connected atomic.Bool // a connection was reported (for other goroutines)
	// connects counts the connections the monitor reported; reconnected
	// says one came after the first and the next message has not been
	// checked against it yet.
	connects    int
	reconnected bool
	watch       sessionWatch // sessions libzmq lost for good
	connWatch   connectWatch // a first connection that does not come
	link        link         // the publisher connection as the state shows it (link.go)
}

// open creates the SUB socket and the inproc pair Stop uses to wake the
// goroutine out of a blocking poll.
func (c *session) open(s *Subscriber) error {
	lim := s.receiveLimits()
	sub, err := zmqx.NewSocket(zmq.SUB, lim.HWM, lim.MaxMessageBytes)
	if err != nil {
		return err
	}
	c.sub, c.hwm, c.maxMsg = sub, lim.HWM, lim.MaxMessageBytes
	if err := sub.SetSubscribe(""); err != nil {
		return fmt.Errorf("subscribe to all topics: %w", err)
	}
	seq := stopEndpointSeq.Add(1)
	// Readiness and the reported state need to know when the TCP/IPC
	// connection is up, which ZMQ only tells a socket monitor, and only
	// of connections made after it is attached: so it is attached before
	// Connect. It costs two sockets (two descriptors); see
	// MaxOptionalMonitors for the bound.
	switch {
	case s.cfg.Session.WatchConnection:
		if err := c.openMonitor(seq); err != nil {
			return err
		}
	case s.shared.takeMonitor():
		c.monSlot = true
		if err := c.openMonitor(seq); err != nil {
			// The state then turns connected with the first batch,
			// as it would beyond the bound.
			s.log.Debug().Err(err).Msg("no connection monitor")
			c.closeMonitor(s.shared)
		}
	}
	if err := sub.Connect(s.cfg.Source.Endpoint); err != nil {
		return fmt.Errorf("connect SUB socket to %s: %w", s.cfg.Source.Endpoint, err)
	}
	// The sending end of the stop pair is created by Stop itself, so a
	// running source holds two sockets, not three.
	c.stopName = fmt.Sprintf("inproc://conductor-subscriber-stop-%d", seq)
	if c.stopRx, err = zmq.NewSocket(zmq.PAIR); err != nil {
		return fmt.Errorf("create stop socket: %w", err)
	}
	_ = c.stopRx.SetLinger(0)
	if err := c.stopRx.Bind(c.stopName); err != nil {
		return fmt.Errorf("bind stop socket: %w", err)
	}
	return nil
}

// openMonitor attaches a connection monitor to the SUB socket.
func (c *session) openMonitor(seq uint64) error {
	monName := fmt.Sprintf("inproc://conductor-subscriber-monitor-%d", seq)
	if err := c.sub.Monitor(monName, monitorEvents); err != nil {
		return fmt.Errorf("monitor SUB socket: %w", err)
	}
	mon, err := zmq.NewSocket(zmq.PAIR)
	if err != nil {
		_ = c.sub.Monitor("", 0)
		return fmt.Errorf("create monitor socket: %w", err)
	}
	c.mon = mon
	_ = c.mon.SetLinger(0)
	if err := c.mon.Connect(monName); err != nil {
		return fmt.Errorf("connect monitor socket: %w", err)
	}
	return nil
}

// closeMonitor stops monitoring the SUB socket, closes the monitor's
// socket and gives back its slot among the optional monitors; idempotent.
func (c *session) closeMonitor(sh *Resources) {
	if c.monSlot {
		c.monSlot = false
		sh.giveMonitor()
	}
	if c.mon == nil {
		return
	}
	if c.poller != nil {
		_ = c.poller.RemoveBySocket(c.mon)
	}
	if c.sub != nil {
		_ = c.sub.Monitor("", 0)
	}
	_ = c.mon.Close()
	c.mon = nil
}

// followShare applies the source's receive high-water mark as the budget's
// receive part is shared now (receiveshare.go): libzmq applies a changed
// mark to the connection already made, so the sum of the queues follows
// the number of sources.
func (c *session) followShare(s *Subscriber) {
	if c.sub == nil {
		return
	}
	lim, bounded := s.shared.ReceiveLimits(c.largest)
	if !bounded || lim.HWM == c.hwm {
		return
	}
	if err := c.sub.SetRcvhwm(lim.HWM); err != nil {
		s.log.Debug().Err(err).Int("hwm", lim.HWM).Msg("cannot change the receive high-water mark; the previous one stays")
		return
	}
	c.hwm = lim.HWM
}

// closeSub closes the SUB socket (its queued messages are the receiver's
// to drop first).
func (c *session) closeSub(sh *Resources) {
	c.closeMonitor(sh)
	if c.sub == nil {
		return
	}
	if c.poller != nil {
		_ = c.poller.RemoveBySocket(c.sub)
	}
	_ = c.sub.Close()
	c.sub = nil
	c.link.tcpAt = time.Time{} // no handshake can complete any more
}

// close closes every socket of the session; idempotent.
func (c *session) close(s *Subscriber) {
	c.closeSub(s.shared)
	if c.stopRx != nil {
		_ = c.stopRx.Close()
		c.stopRx = nil
	}
}

// signalStop wakes the run goroutine through the stop pair. If that fails
// (out of sockets), the goroutine still sees the stop flag at its next poll
// timeout.
//
// The send does not wait: connecting to a bound inproc endpoint attaches
// the pipe at once, so it only fails when the goroutine has already seen
// the stop flag (between messages) and closed its end, unbinding the
// endpoint. A blocking send would then wait out its whole timeout.
func (c *session) signalStop(s *Subscriber) {
	tx, err := zmq.NewSocket(zmq.PAIR)
	if err == nil {
		defer tx.Close()
		_ = tx.SetLinger(0)
		if err = tx.Connect(c.stopName); err == nil {
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

// onMonitor reads connection events: the first connection (its ZMTP
// handshake done: a TCP peer that is not ZMQ is no connection) marks the
// source connected, a later one is a reconnection; the link follows every
// event for the state (link.go).
func (s *Subscriber) onMonitor() {
	c := &s.conn
	for {
		ev, _, _, err := c.mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			return
		}
		s.onLinkEvent(ev, time.Now())
		if ev != zmq.EVENT_HANDSHAKE_SUCCEEDED {
			c.watch.onEvent(ev)
			continue
		}
		c.watch.lostAt, c.watch.handshakeFailed = time.Time{}, false
		selfReset := c.watch.selfReset
		c.watch.selfReset = false
		// The monitor stays: a later connection is a reconnection, after
		// which the next message is checked against what was applied
		// (docs/events.md#restarts).
		c.connects++
		if c.connects == 1 {
			c.connected.Store(true)
			s.tellState()
			if c.connWatch.warned {
				s.log.Info().Dur("after", time.Since(c.connWatch.since)).Msg("connected to publisher")
			} else {
				s.log.Debug().Msg("connected to publisher")
			}
			continue
		}
		// After the subscriber's own reset of a lost session, a source
		// with replay checks the batch at A as after any reconnection;
		// one without replay takes a jump as the gap it is (the stale
		// rules), not as a restart, since the publisher kept running.
		if s.seq.started && (!selfReset || s.rec.replay != nil) {
			c.reconnected = true
		}
		s.log.Debug().Int("connections", c.connects).Msg("reconnected to publisher")
	}
}

// closeIfStale drops the SUB and DEALER sockets of a stale source that will
// not recover by itself: its messages are ignored anyway, and the publisher
// then stops queueing them. One that will recover keeps its SUB.
func (s *Subscriber) closeIfStale() {
	if s.State() != Stale || s.conn.sub == nil {
		return
	}
	if !s.willRecover() {
		s.rx.batch.discard()
		s.conn.closeSub(s.shared)
	}
	s.rec.close()
}

// onEvent follows the session through one monitor event other than
// EVENT_CONNECTED (which onMonitor handles and which also clears a loss).
func (w *sessionWatch) onEvent(ev zmq.Event) {
	switch ev {
	case zmq.EVENT_DISCONNECTED:
		w.lostAt = time.Now()
	case zmq.EVENT_CONNECT_RETRIED:
		w.lostAt = time.Time{} // libzmq reconnects by itself
		w.handshakeFailed = false
	case zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH:
		w.handshakeFailed = true
	}
}

// noteReceived records that the session delivers messages, which ends the
// backoff between resets.
func (c *session) noteReceived() { c.watch.inARow = 0 }

// sessionDeadline is when a lost session is reconnected; zero when none is
// lost, or when the SUB socket is gone (a stale source that closed it),
// so the run loop never waits on a deadline nothing will clear.
func (c *session) sessionDeadline() time.Time {
	w := &c.watch
	if w.lostAt.IsZero() || c.sub == nil {
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
	c := &s.conn
	at := c.sessionDeadline()
	if at.IsZero() || now.Before(at) {
		return
	}
	w := &c.watch
	handshake := w.handshakeFailed
	w.lostAt, w.handshakeFailed = time.Time{}, false
	ep := s.cfg.Source.Endpoint
	if err := c.sub.Disconnect(ep); err != nil && zmq.AsErrno(err) != zmq.Errno(syscall.ENOENT) {
		s.log.Error().Err(err).Msg("cannot disconnect the lost session; the source receives nothing until it is registered again")
		return
	}
	if err := c.sub.Connect(ep); err != nil {
		s.log.Error().Err(err).Msg("cannot reconnect the lost session; the source receives nothing until it is registered again")
		return
	}
	w.resets++
	w.inARow++
	w.lastReset = now
	w.selfReset = true
	if !handshake {
		s.counters.add(MetricDropped, s.typ, events.DropOversize, 1)
	}
	ev := s.log.Debug()
	if w.resets == 1 && !handshake {
		// A failed handshake was already named by the link's WARN
		// (not a ZMQ publisher).
		ev = s.log.Warn()
	}
	if handshake {
		ev.Int("resets", w.resets).Msg("the publisher's endpoint failed the ZMTP handshake and libzmq does not retry; reconnected")
		return
	}
	ev.Int("max_message_bytes", c.maxMsg).Int("resets", w.resets).
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
	return s.conn.mon != nil && !s.conn.connected.Load() && !s.seq.hasSeq.Load() && s.State() == Connecting
}

// warnIfStillConnecting logs one WARN when the source has been connecting
// for Tuning.ConnectWarnAfter.
func (s *Subscriber) warnIfStillConnecting(now time.Time) {
	if !s.conn.connWatch.due(now, !s.knowsConnecting()) {
		return
	}
	s.log.Warn().Dur("after", s.tuning.ConnectWarnAfter).
		Msg("still not connected to the publisher's endpoint: check the host resolves, the port, and that the engine publishes there; said once, the subscriber keeps trying")
}
