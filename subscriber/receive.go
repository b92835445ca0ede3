package subscriber

import (
	"encoding/binary"
	"math"
	"syscall"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	zmq "github.com/pebbe/zmq4"
)

// drainBurst bounds how many queued messages are handled between two polls,
// so a stop request is noticed promptly even under full-speed traffic.
const drainBurst = 1024

// keepFrames is how many frames of a live message are kept: a well-formed
// one has three (docs/events.md#framing), and a fourth or more only needs
// to be seen to be counted as malformed.
const keepFrames = 4

// receiver owns what is received from the SUB socket and not yet handled:
// the C batch of messages (recv_cgo.go), the frames of the one being
// handled, and how deeply drains nest.
type receiver struct {
	batch  batchReceiver
	frames [][]byte
	depth  int // nested drains (a replay drains the SUB from inside one)
}

// next returns the next live message's frames, receiving from sock when
// nothing is queued; limit bounds how many a receive takes.
func (r *receiver) next(sock *zmq.Socket, limit int) ([][]byte, error) {
	frames, err := r.batch.recv(sock, r.frames[:0], limit)
	r.frames = frames
	return frames, err
}

// drain handles up to drainBurst queued live messages with handle. The
// frames handed to handle are valid only until it returns.
//
// Messages are received in batches (batchReceiver) and queued in the
// receiver until handled. A drain nested inside a handler (a replay
// watching the SUB) takes the outer drain's queued messages first, so the
// order of the live stream is kept; the C batch is given back when the
// outermost drain ends with nothing queued.
func (s *Subscriber) drain(handle func(frames [][]byte) error) error {
	s.rx.depth++
	defer func() {
		if s.rx.depth--; s.rx.depth == 0 {
			s.forgetPayloads()
			s.rx.batch.idle()
		}
	}()
	for i := range drainBurst {
		if s.conn.sub == nil {
			return nil
		}
		if s.stopping.Load() {
			return errStopped
		}
		frames, err := s.rx.next(s.conn.sub, drainBurst-i)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
				return nil
			}
			s.counters.add(MetricDropped, s.typ, events.DropReceiveError, 1)
			s.sampled.Warn().Err(err).Msg("receive failed")
			return nil
		}
		s.conn.noteReceived()
		if len(frames) == keepFrames-1 && len(frames[2]) > s.conn.largest {
			s.conn.largest = len(frames[2]) // sizes the queue (followShare)
		}
		if err := handle(frames); err != nil {
			return err
		}
		if s.apply.verifier != nil {
			s.apply.verifier.CatchUp()
		}
	}
	return nil
}

// forgetPayloads drops every view into received messages before their
// batch is released: the frames, the reader and the decoders' per-batch
// fields. Nothing reads them after the batch, but a Go pointer left aimed
// at freed C memory is a hazard should the Go heap ever map that range.
func (s *Subscriber) forgetPayloads() {
	clear(s.rx.frames[:cap(s.rx.frames)])
	s.apply.dec.Forget()
}

// frameSeq checks the framing rules of docs/events.md#framing and returns the
// sequence; ok=false means the message was dropped (and counted).
func (s *Subscriber) frameSeq(frames [][]byte) (uint64, bool) {
	s.counters.add(MetricReceived, s.typ, events.ReasonNone, 1)
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
	s.counters.add(MetricDropped, s.typ, why, 1)
	s.sampled.Warn().Str("reason", why.String()).Int("frames", len(frames)).Msg("malformed message dropped")
	return 0, false
}
