// Package zmqx holds the ZMQ plumbing the event subscriber and the replay
// client share, and the process-wide settings that belong to neither: the
// socket options every event socket gets, receiving one multipart message,
// libzmq's socket limit, and trimming the C heap that libzmq's receive
// buffers live in.
package zmqx

import (
	"fmt"

	zmq "github.com/pebbe/zmq4"
)

// MaxMessageBytes is ZMQ_MAXMSGSIZE on every event socket when the memory
// budget is unbounded (under a bounded one the receive path's share sets a
// smaller limit, subscriber.ReceiveLimits): libzmq drops
// the connection of a peer that sends a larger message (it never buffers
// it) and, that being a protocol error, does not reconnect; the subscriber
// sees that through its connection monitor and reconnects the endpoint
// itself, the messages lost meanwhile a sequence gap (subscriber/session.go).
// The largest real batch, a vLLM step that stores a very long prompt's
// blocks with their token ids, fits well within it; the limit bounds what
// one message may cost before it is decoded (docs/index-memory.md#other-limits).
const MaxMessageBytes = 16 << 20

// NewSocket creates a socket with the options every event socket gets:
// linger 0 (a closing socket never waits for unsent requests, so Stop and
// Close are prompt), IPv6 enabled (endpoints may name IPv6 hosts), messages
// of at most maxMsg bytes (0: MaxMessageBytes), and the given receive
// high-water mark in messages (0 means no limit). Together the two bound
// what libzmq may queue for the socket: about rcvhwm+1 messages of maxMsg
// bytes (the one being decoded when the queue filled).
func NewSocket(t zmq.Type, rcvhwm, maxMsg int) (*zmq.Socket, error) {
	s, err := zmq.NewSocket(t)
	if err != nil {
		return nil, fmt.Errorf("create %v socket: %w", t, err)
	}
	if maxMsg <= 0 {
		maxMsg = MaxMessageBytes
	}
	if err := configure(s, rcvhwm, maxMsg); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("configure %v socket: %w", t, err)
	}
	return s, nil
}

func configure(s *zmq.Socket, rcvhwm, maxMsg int) error {
	if err := s.SetLinger(0); err != nil {
		return fmt.Errorf("set linger: %w", err)
	}
	if err := s.SetRcvhwm(rcvhwm); err != nil {
		return fmt.Errorf("set receive high-water mark: %w", err)
	}
	if err := s.SetIpv6(true); err != nil {
		return fmt.Errorf("enable IPv6: %w", err)
	}
	if err := s.SetMaxmsgsize(int64(maxMsg)); err != nil {
		return fmt.Errorf("set maximum message size: %w", err)
	}
	return nil
}

// ReserveSockets raises libzmq's per-process socket limit (1023 by default)
// to at least sockets plus a margin of 64 for the process's other sockets.
// Call it before the sockets are created; it never lowers the limit.
func ReserveSockets(sockets int) error {
	want := sockets + 64
	if cur, err := zmq.GetMaxSockets(); err == nil && cur >= want {
		return nil
	}
	if err := zmq.SetMaxSockets(want); err != nil {
		return fmt.Errorf("raise the ZMQ socket limit to %d: %w", want, err)
	}
	return nil
}

// RecvMessage reads one whole multipart message without blocking and
// appends its frames to frames, keeping at most keep of them. Frames past
// keep are still read, so an oversized message is consumed as a unit, and
// one nil frame stands for all of them: the result then has keep+1 frames,
// which every caller's frame-count check rejects. An error before the
// first frame is returned as is (EAGAIN when nothing is queued).
func RecvMessage(s *zmq.Socket, frames [][]byte, keep int) ([][]byte, error) {
	flags := zmq.DONTWAIT
	n := 0
	for {
		b, err := s.RecvBytes(flags)
		if err != nil {
			if n == 0 {
				return frames, err
			}
			return frames, fmt.Errorf("receive frame %d: %w", n, err)
		}
		flags = 0 // the rest of a multipart message is already here
		if n < keep {
			frames = append(frames, b)
		}
		n++
		more, err := s.GetRcvmore()
		if err != nil {
			return frames, fmt.Errorf("read RCVMORE: %w", err)
		}
		if !more {
			if n > keep {
				frames = append(frames, nil)
			}
			return frames, nil
		}
	}
}
