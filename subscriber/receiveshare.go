package subscriber

import (
	"math/bits"
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
)

// Under a bounded memory budget every source's receive path shares one part
// of it (docs/index-memory.md#the-receive-path): what libzmq queues for the
// SUB socket (C heap, outside the Go runtime's soft limit) and the live and
// replayed batches a recovery holds. A source that falls behind then holds a
// bounded number of bytes: a full queue stops libzmq reading the
// connection, so a burst waits in the publisher's send queue, whose own
// high-water mark drops what does not fit, and the gap is recovered through
// replay or by stale recovery like any other.
const (
	// minReceiveHWM is the shortest receive queue a source gets, in
	// messages, whatever its share: with one message libzmq would signal
	// its I/O thread for every message read.
	minReceiveHWM = 2
	// sizeFloorDivisor: a queue is sized for messages of at least a
	// sixteenth of the message limit, however small the source's are, so
	// that one that starts sending larger ones overshoots its share by at
	// most that factor until its next drain.
	sizeFloorDivisor = 16
	// minMessageBytes and the share's sixteenth bound the largest message
	// a bounded receive path takes (ZMQ_MAXMSGSIZE): 512 KiB is a batch of
	// about 90 K tokens with their ids, several engine steps' worth.
	minMessageBytes = 512 << 10
)

// ReceiveLimits are one source's receive bounds at a moment.
type ReceiveLimits struct {
	// HWM is the SUB socket's receive high-water mark, in messages.
	HWM int
	// MaxMessageBytes is the largest message the source's sockets take.
	MaxMessageBytes int
	// BufferedBytes bounds the payload bytes a recovery holds (live
	// batches buffered and replayed records together).
	BufferedBytes int
}

// receiveShare splits the receive part of the budget among the running
// sources. The split follows the number of sources: each one applies its
// current limits between drains (a changed high-water mark applies to the
// connection already made), so the sum stays within the part as sources
// come and go, but for the per-source floors (minReceiveHWM messages and
// one message's room for a recovery).
type receiveShare struct {
	total   int64 // 0: unbounded, every source takes Tuning's values
	maxMsg  int
	sources atomic.Int32
	held    atomic.Int64 // bytes the recoveries hold (recovery.report)
}

func newReceiveShare(total int64) *receiveShare {
	r := &receiveShare{total: total, maxMsg: zmqx.MaxMessageBytes}
	if total > 0 {
		r.maxMsg = int(min(max(total/16, minMessageBytes), zmqx.MaxMessageBytes))
	}
	return r
}

// bounded reports whether the budget sets the receive path's limits.
func (r *receiveShare) bounded() bool { return r.total > 0 }

func (r *receiveShare) join()  { r.sources.Add(1) }
func (r *receiveShare) leave() { r.sources.Add(-1) }

// limits are one source's bounds now, for messages of at most largest
// bytes (the largest the source has sent; 0 before the first): half its
// share for the queue, half for what a recovery holds, each at least its
// floor. The queue counts messages, so it is sized by the messages the
// source actually sends (rounded up to a power of two, at least a
// sixteenth of the message limit): sized by the limit itself, a source of
// small batches got a queue of two, and paid a wakeup of libzmq's I/O
// thread per message (BENCHMARKS.md, the receive path).
func (r *receiveShare) limits(largest int) ReceiveLimits {
	per := r.total / int64(max(r.sources.Load(), 1))
	size := max(int64(1)<<bits.Len(uint(max(largest-1, 0))), int64(r.maxMsg/sizeFloorDivisor))
	size = min(size, int64(r.maxMsg))
	return ReceiveLimits{
		HWM:             int(max(per/2/size, minReceiveHWM)),
		MaxMessageBytes: r.maxMsg,
		BufferedBytes:   int(max(per/2, int64(r.maxMsg))),
	}
}

// receiveLimits are the source's receive bounds now: its share of the
// budget's receive part when that is bounded, else its Tuning.
func (s *Subscriber) receiveLimits() ReceiveLimits {
	if lim, bounded := s.shared.ReceiveLimits(s.conn.largest); bounded {
		return lim
	}
	return ReceiveLimits{HWM: s.tuning.RcvHWM, MaxMessageBytes: zmqx.MaxMessageBytes, BufferedBytes: s.tuning.MaxBufferedBytes}
}
