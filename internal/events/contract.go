package events

import (
	"fmt"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/rs/zerolog"
)

// Decoder is the one contract every wire decoder implements, whatever the
// publisher: decode a batch payload, then apply its events against the
// sinks the decoder was built with, reporting each event as applied,
// ignored, rejected or no-op. Decoding and applying are two steps because
// a batch's dp_rank follows its events on the wire and a malformed tail
// rejects the whole envelope: nothing is applied until the whole payload
// decoded, and the caller may still reject the batch in between.
//
// A Decoder belongs to one source and is used by one goroutine; its
// buffers are reused from batch to batch so that steady-state decoding does
// not allocate.
type Decoder interface {
	// Decode reads one payload into the decoder's buffers and returns
	// ReasonNone, or why the envelope was rejected (then nothing of it is
	// applied). Views into payload are kept until Forget.
	Decode(payload []byte) Reason
	// DPRank is the decoded batch's dp_rank, when it carried one.
	DPRank() (dp uint64, ok bool)
	// Apply applies the decoded batch's events in order and returns how
	// many the batch had. The decoder keeps each one's outcome: the caller
	// reads them with Outcome, so nothing of the decoder calls back up.
	Apply() int
	// Outcome is the outcome of the applied batch's event i, valid until
	// the next Decode.
	Outcome(i int) (Result, Reason)
	// Retract removes everything the source contributed to the index.
	Retract()
	// Forget drops every view into the last payload, which the caller is
	// about to release.
	Forget()
}

// RejectDetailer is a Decoder that can name, for a rejected event of the
// batch it is applying, the values the rule judged and what the
// registration or layout expected (e.g. block_size 32 against 16
// registered), for the rejection's log line. Call it between Apply and
// Forget.
type RejectDetailer interface {
	RejectDetail(i int, e *zerolog.Event)
}

// Config is what a decoder needs of one registration.
type Config struct {
	Type    sourcetype.Type
	Profile hashing.Profile  // the registration's resolved hash profile
	Context index.ContextKey // the registration's own context
	Engine  EngineSink       // engine types: the registration's table
	Owner   index.OwnerID    // engine types: the owner in that table
	Lookup  LookupFunc       // Mooncake: event context -> table
	Logger  zerolog.Logger
	// Check, for engine types, is the service's hash checker: applied
	// BlockStored events are sampled (Checker.Sample) and the sampled
	// blocks hashed again under Profile. nil checks nothing. The checker
	// is used from the decoder's goroutine only, like the decoder.
	Check *hashcheck.Checker
	// Links, for vLLM, receives the verified links of applied
	// BlockStored events (links.go); nil records none.
	Links *hashing.Links
	// LinkDefer, when positive, lets the verification of applied events
	// wait, in at most this many bytes copied from their payloads, until
	// the caller runs it (Verifier): the blocks are in the index at once
	// and the SHA-256 is off the path that makes them visible. Past half
	// the bound, events are verified as they arrive (Verifier.CatchUp);
	// one that does not fit is left unverified and counted
	// (hashing.Links.Shed). 0 verifies each event as it is applied.
	LinkDefer int
	// Stats receives the figures every decoder of the process adds to;
	// nil counts nothing.
	Stats *Stats
}

// Verifier is implemented by the decoders whose link verification can wait
// (Config.LinkDefer). The caller runs it when no message is waiting, from
// the decoder's goroutine, between batches.
type Verifier interface {
	// VerifyPending verifies waiting events, oldest first, until at
	// least maxBlocks blocks were verified or none waits, and reports
	// whether any still waits.
	VerifyPending(maxBlocks int) bool
	// CatchUp verifies waiting events while they hold more than half
	// the bound; the caller runs it after each batch.
	CatchUp()
	// PendingLinks is the number of blocks whose verification waits.
	PendingLinks() int
	// DropPending forgets the waiting verification (the source stops).
	DropPending()
}

// New returns the decoder of cfg.Type.
func New(cfg Config) (Decoder, error) {
	switch cfg.Type {
	case sourcetype.VLLM:
		return newEngine(&vllmRules, cfg), nil
	case sourcetype.SGLang:
		return newEngine(&sglangRules, cfg), nil
	case sourcetype.Mooncake:
		return newMooncake(cfg), nil
	}
	return nil, fmt.Errorf("no decoder for publisher type %v", cfg.Type)
}

// batch is the state every decoder shares: the reader and the envelope of
// the batch under decoding.
type batch struct {
	r   msgp.Reader
	env envelope
}

// DPRank implements Decoder.
func (b *batch) DPRank() (uint64, bool) { return b.env.dp, b.env.dpPresent }

// EngineSink is the part of an index table an engine (vLLM/SGLang) source
// writes to. *index.Table satisfies it; tests substitute a recorder so fixture
// effects can be asserted exactly. Store's hint is where the block lies,
// which verified links keep beside the block so that a query's walk reads
// it without a probe (index/locate.go); a sink that cannot tell returns 0.
type EngineSink interface {
	Store(id index.OwnerID, p index.Put) (hint uint32, added bool)
	Remove(id index.OwnerID, p index.Put) bool
	ClearOwner(id index.OwnerID, tiers index.TierMask)
}

// SharedSink is the part of an index table a Mooncake source writes to:
// shared-tier presence is reference counted, one reference per object
// binding, because several objects (TP ranks, K/V parts) can carry one block.
// Each binding's reference is an index.SharedRef, which charges the
// binding's bytes to the index's budget and which the index may evict
// (docs/index-memory.md#mooncake-bindings).
type SharedSink interface {
	Acquire(r *index.SharedRef) bool
	Release(r *index.SharedRef)
	Adjust(r *index.SharedRef, delta int64) bool
}

// LookupFunc resolves a Mooncake event's context to the table that holds it
// and the hash profile it was registered with; ok=false when no engine
// registered the context. Mooncake events pick their context per event, so
// the subscriber cannot be handed a single table.
type LookupFunc func(index.ContextKey) (sink SharedSink, profile *hashing.Profile, ok bool)

// Outcome is what happened to one event of a batch.
type Outcome struct {
	Index  int
	Result Result
	Reason Reason
}

// Result classifies an event outcome.
type Result uint8

// Event results (docs/events.md#event-outcomes): applied changed or confirmed
// index state; ignored is well-formed but deliberately not indexed; rejected
// failed validation; noop had nothing to act on (e.g. removing an unknown
// object).
const (
	Applied Result = iota
	Ignored
	Rejected
	NoOp
)

// String returns the result as fixture expectations spell it ("applied",
// "ignored", "rejected", "no-op").
func (r Result) String() string {
	switch r {
	case Applied:
		return "applied"
	case Ignored:
		return "ignored"
	case Rejected:
		return "rejected"
	case NoOp:
		return "no-op"
	}
	return "unknown"
}
