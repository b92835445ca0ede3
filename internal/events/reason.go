package events

import "fmt"

// Reason names why a message, envelope, batch or event was dropped, ignored
// or rejected, why a source went stale, or how a replay ended. One enum keeps
// counter labels and log fields consistent across all of them.
type Reason uint8

// Reasons. Their String values are stable metric labels.
const (
	ReasonNone Reason = iota

	// Frame-level drops (docs/events.md#framing); sequence state untouched.
	DropFrameCount
	DropSeqLength
	DropSeqReserved
	DropReceiveError
	// Sequence-level drops (docs/events.md#sequence-state-machine).
	DropStale
	DropDuplicate
	// DropOversize: libzmq ended the session over a message larger than
	// ZMQ_MAXMSGSIZE and did not reconnect; the subscriber reconnected
	// itself, and the lost messages are a sequence gap
	// (docs/index-memory.md#other-limits).
	DropOversize

	// Envelope rejections (docs/events.md#envelope); the sequence advances.
	EnvEmpty
	EnvInvalid
	EnvTrailingBytes
	EnvNotArray
	EnvLength
	EnvTimestamp
	EnvEventsNotArray
	EnvTooManyEvents
	EnvDPRank

	// Batch rejection (docs/events.md#batch-dp-rank).
	BatchDPMismatch

	// Event rejections (docs/events.md#event-rules and the sections after it).
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
	EvLayout
	EvUnknownParent
	EvStdMapFull

	// Ignored / no-op events.
	IgnMedium
	// IgnUncachedGroup: a KV-cache group vLLM does not prefix-cache
	// (cross_attention, encoder_only_attention; docs/hybrid.md#events).
	IgnUncachedGroup
	// IgnUnknownKind: a KV-cache group of a kind this build has no rule
	// for (docs/hybrid.md#events).
	IgnUnknownKind
	NoBinding

	// Stale triggers (docs/events.md#stale-triggers).
	StaleGap
	StaleRegression
	StaleReplay
	StaleDeadline
	StaleBufferOverflow
	StaleBatchRejected
	StaleInternal

	// Replay outcomes (docs/events.md#recovery).
	ReplayRecovered
	ReplayRetried
	ReplayUnrecoverable
	ReplayDeadline
	ReplayStopped

	NumReasons // the number of reasons, for arrays indexed by Reason
)

// reasonNames are the reasons' metric labels; read-only, a table fixed at
// compile time.
var reasonNames = [NumReasons]string{
	ReasonNone:          "none",
	DropFrameCount:      "frame_count",
	DropSeqLength:       "sequence_length",
	DropSeqReserved:     "sequence_reserved",
	DropReceiveError:    "receive_error",
	DropStale:           "stale",
	DropDuplicate:       "duplicate",
	DropOversize:        "oversize",
	EnvEmpty:            "empty_payload",
	EnvInvalid:          "invalid_msgpack",
	EnvTrailingBytes:    "trailing_bytes",
	EnvNotArray:         "not_array",
	EnvLength:           "length",
	EnvTimestamp:        "timestamp",
	EnvEventsNotArray:   "events_not_array",
	EnvTooManyEvents:    "too_many_events",
	EnvDPRank:           "dp_rank",
	BatchDPMismatch:     "dp_rank_mismatch",
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
	EvLayout:            "layout_conflict",
	EvUnknownParent:     "unknown_parent",
	EvStdMapFull:        "standard_map_full",
	IgnMedium:           "medium",
	IgnUncachedGroup:    "uncached_group",
	IgnUnknownKind:      "unknown_kind",
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
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", r)
}
