// Package replay fetches the batches a subscriber missed from a vLLM or SGLang
// publisher's replay ROUTER socket.
//
// The publisher keeps its last few thousand batches and streams every one at
// or after a requested sequence, oldest first, followed by an end marker. The
// stream has no upper bound, so this package applies the subscriber's
// sequencing rules while reading (ignore what is not needed, detect holes that
// replay cannot fill) and gives back only the contiguous run the caller asked
// for. It owns one DEALER socket and must be used from a single goroutine,
// like every ZMQ socket.
package replay

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
)

// EndMarker is the sequence value of the reply that ends a replay stream
// (the 8-byte two's-complement encoding of -1). It is never a data sequence.
const EndMarker = ^uint64(0)

// Default limits follow upstream Conductor, so recovery behaves the same way
// operators already expect from it.
const (
	DefaultReceiveTimeout = 5 * time.Second
	DefaultTotalTimeout   = 30 * time.Second
	DefaultMaxMessages    = 10000
	DefaultMaxBytes       = 64 << 20
)

// ErrUnrecoverable means the publisher cannot supply the missing range any
// more (its window moved past it, it restarted, or its stream conflicts with
// what the subscriber already holds). Retrying cannot help; the caller should
// mark the source stale.
var ErrUnrecoverable = errors.New("replay unrecoverable")

// ErrDeadline means the total recovery deadline passed before a complete
// replay was received (every attempt timed out or was malformed).
var ErrDeadline = errors.New("replay deadline exceeded")

// ErrAnotherProcess means the publisher's record at the anchor sequence
// (the last one the caller applied) is not the one the caller applied:
// the replay endpoint now belongs to another process, whose records would
// be phantoms if applied as a continuation (docs/events.md#restarts).
var ErrAnotherProcess = errors.New("replay endpoint holds another process's record at the last applied sequence")

// ErrBehind means an anchored request without an upper bound (Until) found
// nothing at or after the anchor: the publisher's newest record is older
// than the caller's last applied sequence. The process that published that
// sequence would still hold it, or newer records if its window moved on, so
// the replay endpoint belongs to another process that has not yet got as
// far (docs/state.md#what-survives-a-restart). It wraps ErrUnrecoverable.
var ErrBehind = fmt.Errorf("%w: the replay endpoint holds nothing at or after the last applied sequence", ErrUnrecoverable)

// ErrBudget means the replayed records would exceed the caller's buffer
// limits. It wraps ErrUnrecoverable: a range that does not fit never will.
var ErrBudget = fmt.Errorf("%w: buffer limit exceeded", ErrUnrecoverable)

// Record is one replayed batch. Payload is byte-identical to the live frame 2
// of the same sequence.
type Record struct {
	Seq     uint64
	Payload []byte
}

// Budget bounds how much a recovery may hold in memory, shared between live
// messages buffered by the caller and records kept by Fetch, so one limit
// covers both (upstream counts them together). It is not safe for concurrent
// use; the zero value is unlimited.
type Budget struct {
	MaxMessages int
	MaxBytes    int
	messages    int
	bytes       int
}

// Take reserves room for one message of n bytes and reports whether it fit;
// on false nothing is reserved.
func (b *Budget) Take(n int) bool {
	if b == nil {
		return true
	}
	if b.MaxMessages > 0 && b.messages+1 > b.MaxMessages {
		return false
	}
	if b.MaxBytes > 0 && b.bytes+n > b.MaxBytes {
		return false
	}
	b.messages++
	b.bytes += n
	return true
}

// Give returns the room of one message of n bytes taken earlier. Room
// taken before a Reset is not given back below zero: the reset already
// freed it.
func (b *Budget) Give(n int) {
	if b == nil {
		return
	}
	b.messages = max(b.messages-1, 0)
	b.bytes = max(b.bytes-n, 0)
}

// Reset forgets every reservation, for the start of a new recovery.
func (b *Budget) Reset() {
	if b != nil {
		b.messages, b.bytes = 0, 0
	}
}

// Used reports the reserved message count and bytes (for logs and tests).
func (b *Budget) Used() (messages, bytes int) { return b.messages, b.bytes }

// Request describes one recovery: the missing range and how to wait for it.
type Request struct {
	// From is the first sequence wanted (last applied + 1).
	From uint64
	// Until, when HasUntil, is the lowest sequence the caller already holds
	// from the live stream; replies at or after it are not kept. Without
	// it every reply up to the end marker is kept (a caller that holds no
	// live message yet, such as a restored source confirming its position).
	Until    uint64
	HasUntil bool
	// Deadline bounds the whole recovery, across retries; zero means
	// DefaultTotalTimeout from the call.
	Deadline time.Time
	// ReceiveTimeout bounds each wait for the next reply; zero means
	// DefaultReceiveTimeout.
	ReceiveTimeout time.Duration
	// Anchor, when set, is called with the publisher's record at From-1
	// (the caller's last applied sequence) before anything else is kept:
	// false means that record is not the one the caller applied, and
	// Fetch fails with ErrAnotherProcess. The request then starts at
	// From-1 instead of From. A publisher that no longer holds From-1 (its
	// window moved on) proves nothing either way: the replay goes on as
	// without an anchor. From must be at least 1.
	Anchor func(payload []byte) bool
	// FromFirst takes the first reply at or after From, whatever its
	// sequence, as the start of the range instead of failing when it is
	// later than From: for a stream being started over (a new publisher
	// process), whose oldest buffered record is the best start there is.
	FromFirst bool
	// Budget, if set, is charged for every kept record.
	Budget *Budget
	// Beyond, if set, is called for replies at or after Until so the caller
	// can compare them with what it buffered; an error aborts the replay as
	// unrecoverable (conflicting payloads for one sequence).
	Beyond func(seq uint64, payload []byte) error
	// Watch are other sockets to poll while waiting (the live SUB socket so
	// live traffic keeps being buffered, a stop socket so Stop is prompt).
	// OnWatch is called when one is readable; an error aborts Fetch and is
	// returned unchanged.
	Watch   []*zmq.Socket
	OnWatch func(*zmq.Socket) error
	// OnRetry, if set, is told about every retryable failure (for counters
	// and logs).
	OnRetry func(err error)
}

// Client requests replays from one publisher's replay endpoint over a DEALER
// socket. A REQ socket cannot be used: the publisher answers one request with
// many replies and REQ accepts only the first.
type Client struct {
	endpoint string
	maxMsg   int
	dealer   *zmq.Socket
	req      [8]byte
}

// NewClient returns a client for endpoint whose DEALER takes messages of at
// most maxMsg bytes (0: zmqx.MaxMessageBytes), the live socket's limit; the
// socket is created lazily by Fetch so an idle source holds no replay
// connection.
func NewClient(endpoint string, maxMsg int) *Client {
	return &Client{endpoint: endpoint, maxMsg: maxMsg}
}

// Endpoint is the replay endpoint the client talks to.
func (c *Client) Endpoint() string { return c.endpoint }

// Close releases the DEALER socket. The client can still be used afterwards;
// the next Fetch reconnects.
func (c *Client) Close() {
	if c.dealer != nil {
		_ = c.dealer.Close()
		c.dealer = nil
	}
}

func (c *Client) open() error {
	if c.dealer != nil {
		return nil
	}
	// Linger 0 (zmqx's default): abandoned requests must never delay Close
	// or Stop. No receive limit: the reply stream is bounded by the
	// publisher's buffer.
	d, err := zmqx.NewSocket(zmq.DEALER, 0, c.maxMsg)
	if err != nil {
		return fmt.Errorf("replay DEALER: %w", err)
	}
	if err := d.Connect(c.endpoint); err != nil {
		_ = d.Close()
		return fmt.Errorf("connect replay DEALER to %s: %w", c.endpoint, err)
	}
	c.dealer = d
	return nil
}

// retryable marks failures after which a fresh DEALER and a new request may
// succeed (timeouts, malformed replies, send errors).
type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

// Fetch runs one recovery: it sends ["", From] and reads replies until the end
// marker, retrying with a fresh DEALER after a timeout or malformed reply until
// req.Deadline. It returns the records From, From+1, ... (stopping before
// Until), which may be empty when the publisher had nothing newer.
//
// Records received by a failed attempt are kept, and the next attempt asks
// from the first sequence still missing. A publisher's ROUTER silently drops
// replies past its send high-water mark when this reader falls behind, so a
// large gap tends to break off at about the same depth on every attempt;
// restarting from From would then never finish, while resuming gains that
// depth each time. The budget and the deadline bound the whole recovery.
//
// Errors: ErrUnrecoverable (wrapped, with the reason), ErrDeadline (wrapped,
// with the last retryable failure), or whatever OnWatch returned. On error no
// record is returned and every reservation in req.Budget is given back.
func (c *Client) Fetch(req Request) ([]Record, error) {
	recvTimeout := req.ReceiveTimeout
	if recvTimeout <= 0 {
		recvTimeout = DefaultReceiveTimeout
	}
	if req.Deadline.IsZero() {
		req.Deadline = time.Now().Add(DefaultTotalTimeout)
	}
	var (
		records []Record
		lastErr error
	)
	// The anchor is checked once per Fetch: a retry resumes after what
	// an earlier attempt kept, and a checked anchor stays checked.
	anchored := req.Anchor == nil || req.From == 0
	fail := func(err error) ([]Record, error) {
		for _, r := range records {
			req.Budget.Give(len(r.Payload))
		}
		c.Close()
		return nil, err
	}
	for {
		if !time.Now().Before(req.Deadline) {
			if lastErr == nil {
				lastErr = errors.New("no attempt completed")
			}
			return fail(fmt.Errorf("%w: from %d (%d of the range received): %w", ErrDeadline, req.From, len(records), lastErr))
		}
		var err error
		records, err = c.attempt(&req, recvTimeout, records, &anchored)
		if err == nil {
			return records, nil
		}
		var rt retryable
		if !errors.As(err, &rt) {
			return fail(err)
		}
		// A late reply to the abandoned request must not be taken for an
		// answer to the next one, so the socket goes with the request.
		c.Close()
		lastErr = rt.err
		if req.OnRetry != nil {
			req.OnRetry(rt.err)
		}
	}
}

// sendFrame sends one frame, again when a signal interrupted the call (the
// Go runtime's preemption signals reach cgo calls). Left as an error, an
// interruption between the two frames of the request would cost a whole
// retry with a fresh socket for nothing.
func sendFrame(s *zmq.Socket, b []byte, flags zmq.Flag) error {
	for {
		_, err := s.SendBytes(b, flags)
		if err == nil || zmq.AsErrno(err) != zmq.Errno(syscall.EINTR) {
			return err
		}
	}
}

func (c *Client) attempt(req *Request, recvTimeout time.Duration, records []Record, anchored *bool) ([]Record, error) {
	if err := c.open(); err != nil {
		return records, retryable{err}
	}
	// Resume after what earlier attempts kept: records holds a run
	// without holes, so the first missing sequence follows its last.
	next := req.From
	if len(records) > 0 {
		next = records[len(records)-1].Seq + 1
	}
	start := next
	if !*anchored {
		start = req.From - 1
	}
	binary.BigEndian.PutUint64(c.req[:], start)
	if err := sendFrame(c.dealer, nil, zmq.SNDMORE|zmq.DONTWAIT); err != nil {
		return records, retryable{fmt.Errorf("send replay request: %w", err)}
	}
	if err := sendFrame(c.dealer, c.req[:], zmq.DONTWAIT); err != nil {
		return records, retryable{fmt.Errorf("send replay request: %w", err)}
	}
	poller := zmq.NewPoller()
	poller.Add(c.dealer, zmq.POLLIN)
	for _, s := range req.Watch {
		poller.Add(s, zmq.POLLIN)
	}
	var frames [][]byte
	// The receive timeout runs from the last reply, not from the last
	// wake-up: live traffic on watched sockets must not keep a silent
	// replay alive.
	replyBy := time.Now().Add(recvTimeout)
	for {
		now := time.Now()
		until := replyBy
		if req.Deadline.Before(until) {
			until = req.Deadline
		}
		wait := until.Sub(now)
		if wait <= 0 {
			if !now.Before(req.Deadline) {
				return records, retryable{fmt.Errorf("no reply within the recovery deadline (next %d)", next)}
			}
			return records, retryable{fmt.Errorf("replay receive timeout after %s (next %d)", recvTimeout, next)}
		}
		polled, err := poller.Poll(wait)
		if err != nil {
			if zmq.AsErrno(err) == zmq.Errno(syscall.EINTR) {
				continue
			}
			return records, retryable{fmt.Errorf("poll replay socket: %w", err)}
		}
		if len(polled) == 0 {
			continue // the timeouts are checked at the top of the loop
		}
		dealerReady := false
		for _, p := range polled {
			if p.Socket == c.dealer {
				dealerReady = true
				continue
			}
			if req.OnWatch != nil {
				if err := req.OnWatch(p.Socket); err != nil {
					return records, err
				}
			}
		}
		if !dealerReady {
			continue
		}
		replyBy = time.Now().Add(recvTimeout)
		// Drain what is queued so a long reply stream costs one poll per
		// burst, not one per reply.
		for range 1024 {
			frames, err = zmqx.RecvMessage(c.dealer, frames[:0], keepFrames)
			if err != nil {
				if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
					break
				}
				return records, retryable{fmt.Errorf("receive replay reply: %w", err)}
			}
			seq, payload, perr := parseReply(frames)
			if perr != nil {
				return records, retryable{perr}
			}
			if seq == EndMarker {
				if len(payload) != 0 {
					return records, retryable{errors.New("replay end marker with a non-empty payload")}
				}
				if !*anchored && !req.HasUntil {
					return records, fmt.Errorf("%w (seq %d)", ErrBehind, req.From-1)
				}
				// A stream started over with nothing buffered before
				// Until starts at Until.
				if req.HasUntil && next < req.Until && !(req.FromFirst && len(records) == 0) {
					return records, fmt.Errorf("%w: end marker before seq %d (needed up to %d)", ErrUnrecoverable, next, req.Until-1)
				}
				return records, nil
			}
			if !*anchored && seq >= req.From-1 {
				// The first reply at or after the anchor: the anchor
				// itself, checked, or a later one (the anchor is gone
				// from the window, which proves nothing).
				*anchored = true
				if seq == req.From-1 {
					if !req.Anchor(payload) {
						return records, fmt.Errorf("%w (seq %d)", ErrAnotherProcess, seq)
					}
					continue
				}
			}
			switch {
			case seq < req.From:
				// older than asked: ignore
			case req.HasUntil && seq >= req.Until:
				if req.Beyond != nil {
					if err := req.Beyond(seq, payload); err != nil {
						return records, fmt.Errorf("%w: %w", ErrUnrecoverable, err)
					}
				}
			case seq < next:
				// duplicate reply: ignore
			case seq > next && req.FromFirst && len(records) == 0:
				// A stream started over: its oldest record is its start.
				if !req.Budget.Take(len(payload)) {
					return records, fmt.Errorf("%w at seq %d", ErrBudget, seq)
				}
				records = append(records, Record{Seq: seq, Payload: payload})
				next = seq + 1
			case seq > next:
				return records, fmt.Errorf("%w: replay skipped a sequence (got %d, expected %d)", ErrUnrecoverable, seq, next)
			default:
				if !req.Budget.Take(len(payload)) {
					return records, fmt.Errorf("%w at seq %d", ErrBudget, seq)
				}
				records = append(records, Record{Seq: seq, Payload: payload})
				next++
			}
		}
	}
}

// keepFrames is how many frames of a reply are kept: a well-formed one has
// three or four, and more are counted so that parseReply rejects them.
const keepFrames = 8

// parseReply extracts sequence and payload from a reply as received on the
// DEALER: ["", seq8, payload] (SGLang, older vLLM) or ["", topic, seq8,
// payload] (vLLM with the topic frame). Reading from the end covers both.
func parseReply(frames [][]byte) (uint64, []byte, error) {
	if len(frames) != 3 && len(frames) != 4 {
		return 0, nil, fmt.Errorf("malformed replay reply: %d frames, want 3 or 4", len(frames))
	}
	if len(frames[0]) != 0 {
		return 0, nil, fmt.Errorf("malformed replay reply: first frame has %d bytes, want empty delimiter", len(frames[0]))
	}
	seqFrame := frames[len(frames)-2]
	if len(seqFrame) != 8 {
		return 0, nil, fmt.Errorf("malformed replay reply: sequence frame has %d bytes, want 8", len(seqFrame))
	}
	return binary.BigEndian.Uint64(seqFrame), frames[len(frames)-1], nil
}

// ParseReply is parseReply for callers that decode captured replies (tests,
// tools); it applies the same frame rules Fetch does.
func ParseReply(frames [][]byte) (seq uint64, payload []byte, err error) {
	return parseReply(frames)
}

// EncodeRequest returns the two frames a subscriber sends to ask for every
// batch at or after from: an empty delimiter and the 8-byte big-endian start.
func EncodeRequest(from uint64) [][]byte {
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, from)
	return [][]byte{{}, seq}
}
