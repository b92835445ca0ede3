package subscriber

import (
	"fmt"
	"github.com/mooncake-conductor-go/conductor/source"
	"sync/atomic"
)

// Reason names why a message, envelope, batch or event was dropped, ignored
// or rejected, why a source went stale, or how a replay ended. One enum keeps
// counter labels and log fields consistent across all of them.
type Reason uint8

// Reasons. Their String values are stable metric labels.
const (
	ReasonNone Reason = iota

	// Frame-level drops (§1.2, §1.4); sequence state untouched.
	DropFrameCount
	DropSeqLength
	DropSeqReserved
	DropReceiveError
	// Sequence-level drops (§1.5).
	DropStale
	DropDuplicate

	// Envelope rejections (§3.1); the sequence advances.
	EnvEmpty
	EnvInvalid
	EnvTrailingBytes
	EnvNotArray
	EnvLength
	EnvTimestamp
	EnvEventsNotArray
	EnvDPRank

	// Batch rejection (§3.10).
	BatchDPMismatch

	// Event rejections (§3.2–§4.10).
	EvArrayEncoded
	EvNotMap
	EvNonStringKey
	EvDuplicateKey
	EvMissingKey
	EvWrongType
	EvUnknownTag
	EvForeignKey
	EvHash
	EvBlockSize
	EvLora
	EvGroup
	EvAttention
	EvExtraKeys
	EvTokenRange
	EvTimestamp
	EvTypeConflict
	EvDPRank
	EvBackend
	EvContext
	EvObjectKey
	EvSeqHashes
	EvConflict
	EvAssertion

	// Ignored / no-op events.
	IgnMedium
	NoBinding

	// Stale triggers (§5.1).
	StaleGap
	StaleRegression
	StaleReplay
	StaleDeadline
	StaleBufferOverflow
	StaleBatchRejected
	StaleInternal

	// Replay outcomes (§2.6).
	ReplayRecovered
	ReplayRetried
	ReplayUnrecoverable
	ReplayDeadline
	ReplayStopped

	numReasons
)

var reasonNames = [numReasons]string{
	ReasonNone:          "none",
	DropFrameCount:      "frame_count",
	DropSeqLength:       "sequence_length",
	DropSeqReserved:     "sequence_reserved",
	DropReceiveError:    "receive_error",
	DropStale:           "stale",
	DropDuplicate:       "duplicate",
	EnvEmpty:            "empty_payload",
	EnvInvalid:          "invalid_msgpack",
	EnvTrailingBytes:    "trailing_bytes",
	EnvNotArray:         "not_array",
	EnvLength:           "length",
	EnvTimestamp:        "timestamp",
	EnvEventsNotArray:   "events_not_array",
	EnvDPRank:           "dp_rank",
	BatchDPMismatch:     "dp_rank_mismatch",
	EvArrayEncoded:      "array_encoded_event",
	EvNotMap:            "not_map",
	EvNonStringKey:      "non_string_key",
	EvDuplicateKey:      "duplicate_key",
	EvMissingKey:        "missing_key",
	EvWrongType:         "wrong_type",
	EvUnknownTag:        "unknown_tag",
	EvForeignKey:        "foreign_key",
	EvHash:              "hash",
	EvBlockSize:         "block_size",
	EvLora:              "lora",
	EvGroup:             "group",
	EvAttention:         "attention_kind",
	EvExtraKeys:         "extra_keys",
	EvTokenRange:        "token_range",
	EvTimestamp:         "timestamp",
	EvTypeConflict:      "type_conflict",
	EvDPRank:            "dp_rank",
	EvBackend:           "backend",
	EvContext:           "context",
	EvObjectKey:         "object_key",
	EvSeqHashes:         "seq_hashes",
	EvConflict:          "binding_conflict",
	EvAssertion:         "assertion",
	IgnMedium:           "medium",
	NoBinding:           "no_binding",
	StaleGap:            "gap",
	StaleRegression:     "regression",
	StaleReplay:         "replay_unrecoverable",
	StaleDeadline:       "replay_deadline",
	StaleBufferOverflow: "buffer_overflow",
	StaleBatchRejected:  "batch_rejected",
	StaleInternal:       "internal_error",
	ReplayRecovered:     "recovered",
	ReplayRetried:       "retried",
	ReplayUnrecoverable: "unrecoverable",
	ReplayDeadline:      "deadline",
	ReplayStopped:       "stopped",
}

// String returns the stable label used in metrics and logs.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", r)
}

// Metric is one counter family of Counters.
type Metric uint8

// Counter families.
const (
	MetricReceived         Metric = iota // messages received (any framing)
	MetricDropped                        // messages dropped before decoding, by reason
	MetricEnvelopeRejected               // payloads rejected as a whole, by reason
	MetricBatchRejected                  // decoded batches rejected as a whole, by reason
	MetricApplied                        // events applied
	MetricIgnored                        // events ignored or no-op, by reason
	MetricRejected                       // events rejected, by reason
	MetricGaps                           // sequence gaps detected
	MetricReplays                        // replay attempts by outcome
	MetricStale                          // transitions to stale, by reason
	numMetrics
)

var metricNames = [numMetrics]string{
	"messages_received", "messages_dropped", "envelopes_rejected", "batches_rejected",
	"events_applied", "events_ignored", "events_rejected", "sequence_gaps",
	"replays", "stale_transitions",
}

// String returns the metric's snake_case name.
func (m Metric) String() string {
	if m < numMetrics {
		return metricNames[m]
	}
	return fmt.Sprintf("Metric(%d)", m)
}

// Counters aggregates ingestion statistics across all subscribers so a
// metrics endpoint can export them; every rejection and drop is counted,
// which is what makes silent failures (e.g. a legacy engine whose every event
// is rejected) visible. All methods are safe for concurrent use and on a nil
// receiver (counting disabled).
type Counters struct {
	v [numMetrics][source.NumTypes][numReasons]atomic.Uint64
}

// NewCounters returns a zeroed counter set.
func NewCounters() *Counters { return &Counters{} }

func (c *Counters) add(m Metric, t source.Type, r Reason, n uint64) {
	if c == nil || t >= source.NumTypes {
		return
	}
	c.v[m][t][r].Add(n)
}

// Value returns one counter; reason is ReasonNone for families without a
// reason (received, applied, gaps).
func (c *Counters) Value(m Metric, t source.Type, r Reason) uint64 {
	if c == nil || m >= numMetrics || t >= source.NumTypes || r >= numReasons {
		return 0
	}
	return c.v[m][t][r].Load()
}

// Total sums a family over all reasons for one source type.
func (c *Counters) Total(m Metric, t source.Type) uint64 {
	var n uint64
	for r := Reason(0); r < numReasons; r++ {
		n += c.Value(m, t, r)
	}
	return n
}

// Sample is one non-zero counter in a snapshot.
type Sample struct {
	Metric string // e.g. "events_rejected"
	Source string // "vLLM", "SGLang", "Mooncake"
	Reason string // "" for families without a reason
	Value  uint64
}

// Snapshot returns every non-zero counter in a stable order (metric, source,
// reason). Values are read individually, so a snapshot taken during traffic
// is not an atomic cut — fine for monitoring.
func (c *Counters) Snapshot() []Sample {
	if c == nil {
		return nil
	}
	var out []Sample
	for m := Metric(0); m < numMetrics; m++ {
		for t := source.Type(0); t < source.NumTypes; t++ {
			for r := Reason(0); r < numReasons; r++ {
				v := c.v[m][t][r].Load()
				if v == 0 {
					continue
				}
				reason := ""
				if r != ReasonNone {
					reason = r.String()
				}
				out = append(out, Sample{Metric: m.String(), Source: t.String(), Reason: reason, Value: v})
			}
		}
	}
	return out
}
