package eventtest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// BogusZMTPGreeting is a ZMTP 3.0 greeting that offers a security
// mechanism libzmq lacks: a peer sending it fails the handshake.
func BogusZMTPGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "BOGUS")
	return g
}

// RawPeer is a TCP peer on loopback that is not a ZMQ publisher: it
// writes the same bytes on every connection and reads until the other
// side closes. Close (also run at the test's cleanup) stops accepting,
// closes every connection and waits for their goroutines.
type RawPeer struct {
	ln       net.Listener
	accepted atomic.Int32
	conns    sync.WaitGroup
	done     chan struct{}
	mu       sync.Mutex
	open     []net.Conn
	once     sync.Once
}

// NewRawPeer starts a peer writing msg on each connection.
func NewRawPeer(t testing.TB, msg []byte) *RawPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &RawPeer{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			p.mu.Lock()
			p.open = append(p.open, c)
			p.mu.Unlock()
			_, _ = c.Write(msg)
			p.conns.Add(1)
			go func() { defer p.conns.Done(); _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(p.Close)
	return p
}

// Endpoint is the peer's address as a ZMQ endpoint.
func (p *RawPeer) Endpoint() string { return "tcp://" + p.ln.Addr().String() }

// Accepted is how many connections the peer accepted.
func (p *RawPeer) Accepted() int { return int(p.accepted.Load()) }

// Close stops the peer; idempotent.
func (p *RawPeer) Close() {
	p.once.Do(func() {
		_ = p.ln.Close()
		<-p.done
		p.mu.Lock()
		for _, c := range p.open {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.conns.Wait()
	})
}
