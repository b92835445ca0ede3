package server

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// A body over the limit is refused from its headers: fasthttp answers
// before reading the body and closes the connection. Closing a socket with
// unread data makes the kernel send a reset, and a client still sending
// the body (one that does not ask Expect: 100-continue, as curl does for
// large bodies, e.g. Python's urllib) gets ECONNRESET instead of the 413.
// So a connection refused that way closes lingering, as HTTP servers do:
// it half-closes (the 413 and a FIN are on their way), reads and discards
// what the client still sends, bounded in bytes and time, then closes
// (docs/api.md#errors).

// Lingering bounds: the bytes discarded (beyond them the client gets the
// reset after all), the whole linger, and the wait for each read.
const (
	lingerMaxBytes = 1 << 30
	lingerIdle     = 5 * time.Second
)

// lingerListener hands out lingerConns and finds them again by their
// client's address: fasthttp hands a handler the connection wrapped in its
// own per-IP type when MaxConnsPerIP is set, so the type is out of reach
// there, while the address is not (one map entry per open connection).
type lingerListener struct {
	net.Listener
	total time.Duration // the longest a connection lingers
	conns *lingerSet
}

// lingerSet is a server's open lingerConns by remote address.
type lingerSet struct {
	m       sync.Map
	stopped atomic.Bool // Shutdown: lingering ends at once
}

// stop ends every linger under way and any that would start: a shutting
// down server does not wait for clients' bodies.
func (l *lingerSet) stop() {
	l.stopped.Store(true)
	l.m.Range(func(_, v any) bool {
		if c := v.(*lingerConn); c.lingering.Load() {
			_ = c.Conn.SetReadDeadline(time.Now())
		}
		return true
	})
}

func newLingerListener(ln net.Listener, total time.Duration, set *lingerSet) lingerListener {
	return lingerListener{Listener: ln, total: total, conns: set}
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &lingerConn{Conn: c, total: l.total, conns: l.conns, key: c.RemoteAddr().String()}
	l.conns.m.Store(lc.key, lc)
	return lc, nil
}

// lingerConn is a connection that can be told to linger when it closes.
type lingerConn struct {
	net.Conn
	total time.Duration
	conns *lingerSet
	key   string
	// pending is the body bytes still to come (-1: unknown, a chunked
	// body) once lingering is asked for; 0 closes at once.
	pending   atomic.Int64
	linger    atomic.Bool
	lingering atomic.Bool // Close is discarding
}

// lingerOnClose asks c to discard up to n more bytes (-1: unknown) before
// it closes.
func (c *lingerConn) lingerOnClose(n int64) {
	c.pending.Store(n)
	c.linger.Store(true)
}

// Close lingers when asked to, then closes. It runs on the connection's
// own goroutine (fasthttp's worker), which it holds for at most total.
func (c *lingerConn) Close() error {
	defer c.conns.m.CompareAndDelete(c.key, c)
	if !c.linger.Swap(false) || c.conns.stopped.Load() {
		return c.Conn.Close()
	}
	c.lingering.Store(true)
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
	left := c.pending.Load()
	if left < 0 || left > lingerMaxBytes {
		left = lingerMaxBytes
	}
	end := time.Now().Add(c.total)
	buf := make([]byte, 32<<10)
	for left > 0 {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		_ = c.Conn.SetReadDeadline(minTime(end, now.Add(lingerIdle)))
		if c.conns.stopped.Load() {
			break // after the deadline is set: stop's or this check ends it
		}
		n, err := c.Conn.Read(buf)
		left -= int64(n)
		if err != nil {
			break
		}
	}
	return c.Conn.Close()
}

// lingerAfter413 makes ctx's connection linger on close for the body the
// request announced.
func (l *lingerSet) lingerAfter413(ctx *fasthttp.RequestCtx) {
	v, ok := l.m.Load(ctx.RemoteAddr().String())
	if !ok {
		return
	}
	lc := v.(*lingerConn)
	n := int64(ctx.Request.Header.ContentLength())
	if n < 0 {
		n = -1 // chunked: as much as comes, within the bounds
	}
	lc.lingerOnClose(n)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
