package events

import (
	"math"

	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

// envelope is the decoded outer batch [timestamp, events, dp_rank]
// (docs/events.md#envelope).
type envelope struct {
	tsFloat   float64 // vLLM/SGLang: seconds
	tsInt     uint64  // Mooncake: milliseconds
	dpPresent bool
	dp        uint64
}

// eventReader decodes the events of one batch into its own buffers; the
// envelope walker calls it once per element of the events array. It returns
// an error only for malformed MessagePack, which rejects the whole envelope;
// a well-formed but invalid event is recorded as rejected and decoding goes
// on with its siblings.
type eventReader interface {
	beginBatch()
	readEvent(r *msgp.Reader, env *envelope, i int) error
}

// MaxBatchEvents bounds the events of one batch: an event can take one
// byte on the wire (an empty map) and a hundred or more decoded, so a
// batch of millions of them, inside the message size limit, would cost
// gigabytes before a single one is applied. Real batches are far shorter
// (a vLLM or SGLang step has an event per request that changed the cache;
// the Mooncake master sends at most max_batch_size, 50 by default); a
// longer one is rejected whole as too_many_events
// (docs/index-memory.md#other-limits).
const MaxBatchEvents = 65536

// decode walks one payload, handing each event to er. Nothing is applied
// here: the batch dp_rank follows the events on the wire and a truncated
// tail must reject the envelope, so effects wait until the whole payload
// decoded.
func (b *batch) decode(typ sourcetype.Type, payload []byte, er eventReader) Reason {
	r, env := &b.r, &b.env
	*env = envelope{}
	er.beginBatch()
	if len(payload) == 0 {
		return EnvEmpty
	}
	r.Reset(payload)
	k, err := r.Peek()
	if err != nil {
		return EnvInvalid
	}
	if k != msgp.Array {
		if k == msgp.Invalid {
			return EnvInvalid
		}
		return EnvNotArray
	}
	n, err := r.ArrayLen()
	if err != nil {
		return EnvInvalid
	}
	if n != 3 {
		return EnvLength
	}
	// timestamp: float seconds for engines, integer milliseconds for the master
	if k, err = r.Peek(); err != nil {
		return EnvInvalid
	}
	if typ == sourcetype.Mooncake {
		if k != msgp.Int {
			return EnvTimestamp
		}
		u, neg, err := r.Integer()
		if err != nil {
			return EnvInvalid
		}
		if neg {
			return EnvTimestamp
		}
		env.tsInt = u
	} else {
		if k != msgp.Float {
			return EnvTimestamp
		}
		f, err := r.Float()
		if err != nil {
			return EnvInvalid
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return EnvTimestamp
		}
		env.tsFloat = f
	}
	// events
	if k, err = r.Peek(); err != nil {
		return EnvInvalid
	}
	if k != msgp.Array {
		return EnvEventsNotArray
	}
	m, err := r.ArrayLen()
	if err != nil {
		return EnvInvalid
	}
	if m > MaxBatchEvents {
		return EnvTooManyEvents
	}
	for i := 0; i < m; i++ {
		if err := er.readEvent(r, env, i); err != nil {
			return EnvInvalid
		}
	}
	// dp_rank
	if k, err = r.Peek(); err != nil {
		return EnvInvalid
	}
	switch {
	case k == msgp.Nil:
		if r.Nil() != nil {
			return EnvInvalid
		}
	case k == msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return EnvInvalid
		}
		if neg {
			return EnvDPRank
		}
		env.dpPresent, env.dp = true, u
	default:
		return EnvDPRank
	}
	if r.Remaining() != 0 {
		return EnvTrailingBytes
	}
	return ReasonNone
}
