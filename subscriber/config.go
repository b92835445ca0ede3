package subscriber

import (
	"sync"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/contexts"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/hashing/hashcheck"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/replay"
	"github.com/rs/zerolog"
)

// Config is everything Start needs for one registration, grouped by the
// concern that reads it.
type Config struct {
	Source  SourceConfig  // what is subscribed to
	Index   IndexConfig   // where its events go
	Verify  VerifyConfig  // checks of what is applied
	Session SessionConfig // connection and stale behaviour
	Tuning  Tuning        // transport and recovery limits
	Durable DurableConfig // snapshot consistency and restore
	Report  ReportConfig  // logs and state changes
	// Resources are what the process's subscribers ration together; nil
	// gives the subscriber one of its own (tests, a lone source).
	Resources *Resources

	test testHooks
}

// SourceConfig names the publisher.
type SourceConfig struct {
	Key            string          // service key "instance|tenant|rank", for logs
	Type           sourcetype.Type // selects the decoder, never topic/shape
	Endpoint       string
	ReplayEndpoint string // "" = none; ignored for Mooncake
	DPRank         int
}

// IndexConfig is where the source's events are applied.
type IndexConfig struct {
	Context index.ContextKey // the registration's own context
	Profile hashing.Profile
	Engine  events.EngineSink // the registration's table (engine types)
	Owner   index.OwnerID     // engine owner in that table
	Lookup  events.LookupFunc // Mooncake: event context -> table
	// OwnerRemovedAfterStop says the caller removes the engine owner, and
	// with it every entry, right after Stop (the registry does, through
	// index.Table.RemoveEngineOwner), so Stop leaves the engine entries to
	// it instead of clearing them first: the removal can then reclaim them
	// in the background without slowing queries. Mooncake sources always
	// release their shared references on Stop, and a stale source has
	// retracted already.
	OwnerRemovedAfterStop bool
}

// VerifyConfig are the checks run on applied events.
type VerifyConfig struct {
	// HashCheck, for vLLM and SGLang sources, is the service's hash
	// checker: the decoder samples applied BlockStored events and checks
	// their hashes against the profile. nil checks nothing. The
	// subscriber's goroutine is its only user (its counts are atomic).
	HashCheck *hashcheck.Checker
	// Links, for vLLM sources, receives the links of the blocks ingest
	// verifies (events.Config.Links); nil records none. The verification
	// waits until the source is idle (LinkDefer), so that stored blocks
	// are visible without waiting for their SHA-256.
	Links *hashing.Links
	// LinkDefer bounds, in bytes, what the subscriber holds of applied
	// events waiting for verification; 0 means DefaultLinkDefer and a
	// negative value verifies each event as it is applied. The waiting
	// events are held in fixed-size chunks, so a bound below one chunk
	// sheds every event.
	LinkDefer int
}

// SessionConfig is how the connection is watched and what a stale source
// does.
type SessionConfig struct {
	// WatchConnection says readiness waits for this source: it always
	// gets a connection monitor (two extra sockets until the first
	// TCP/IPC connection), so Connected and State report the connection
	// as soon as it is up. Other sources get one while fewer than
	// MaxOptionalMonitors are held; beyond that Connected turns true with
	// the first message.
	WatchConnection bool
	// StaleRecovery says whether a stale source takes a later message as
	// a new baseline by itself (the default) or waits for a
	// re-registration (docs/events.md#stale-recovery).
	StaleRecovery StaleRecovery
}

// DurableConfig connects the source to the durable state, the stage that
// snapshots the index and restores it (package durable hands these out).
type DurableConfig struct {
	// Gate, when set, is held for reading while the source changes the
	// index or its sequence state (one batch, a retraction), so a snapshot
	// holding it for writing sees every source between two batches.
	Gate *sync.RWMutex
	// Restore, when set, restores the source from a snapshot: its stream
	// continues after Restore.Seq, and the source tells the handle how it
	// settled (resume.go).
	Restore *streampos.Restore
}

// ReportConfig is where the source tells what happens to it.
type ReportConfig struct {
	Logger zerolog.Logger
	// OnState, when set, is told every change of the source's State
	// (Connected, Live, Recovering, Stale, Stopped; Connecting is where
	// every source starts), in order, on the goroutine making the change,
	// which may hold the Gate; it must not block. A stale transition is
	// told after the retraction, so a listener that sees Stale also sees
	// the index without the source's entries.
	OnState func(State)
}

// testHooks let the package's tests observe the run goroutine.
type testHooks struct {
	// onEvent is told the outcome of every decoded event so fixture
	// expectations can be checked per event.
	onEvent func(seq uint64, o events.Outcome)
	// onApply is told every sequence applied, in order, including empty
	// and rejected batches.
	onApply func(seq uint64)
	// onEpoch is told every publisher restart detected, before the new
	// stream's first batch is applied.
	onEpoch func()
}

// Tuning holds limits that default to upstream's values; zero fields take the
// default.
type Tuning struct {
	RcvHWM               int           // SUB receive high-water mark, in messages (defaultRcvHWM)
	ReplayReceiveTimeout time.Duration // per reply (replay.DefaultReceiveTimeout)
	ReplayTotalTimeout   time.Duration // per recovery (replay.DefaultTotalTimeout)
	MaxBufferedMessages  int           // live + replayed messages held during recovery (replay.DefaultMaxMessages)
	MaxBufferedBytes     int           // their payload bytes (replay.DefaultMaxBytes)
	StaleHoldOff         time.Duration // stale, messages ignored before the next is a baseline (DefaultStaleHoldOff)
	ConnectWarnAfter     time.Duration // still connecting after this long: one WARN (DefaultConnectWarnAfter)
	HandshakeWarnAfter   time.Duration // a TCP peer without a ZMTP handshake after this long is not a ZMQ publisher (DefaultHandshakeWarnAfter)
}

// DefaultConnectWarnAfter is how long a source may stay connecting (its
// monitor has seen no connection and nothing was received) before it logs
// one WARN: an endpoint that never connects (a host that does not resolve,
// a port nobody binds) would otherwise show only as a state.
const DefaultConnectWarnAfter = 30 * time.Second

// defaultRcvHWM is the SUB receive high-water mark, upstream's value as
// docs/events.md#sockets describes. A short queue (libzmq's default) moves a
// burst's backlog into the publisher's send queue, which for the Mooncake
// master (no replay) makes the source stale on overflow; since the C heap is
// trimmed once a burst drains (zmqx.Trimmer), the long queue costs memory
// only while the burst lasts (BENCHMARKS.md).
const defaultRcvHWM = 200000

func (t Tuning) withDefaults() Tuning {
	if t.RcvHWM <= 0 {
		t.RcvHWM = defaultRcvHWM
	}
	if t.ReplayReceiveTimeout <= 0 {
		t.ReplayReceiveTimeout = replay.DefaultReceiveTimeout
	}
	if t.ReplayTotalTimeout <= 0 {
		t.ReplayTotalTimeout = replay.DefaultTotalTimeout
	}
	if t.MaxBufferedMessages <= 0 {
		t.MaxBufferedMessages = replay.DefaultMaxMessages
	}
	if t.MaxBufferedBytes <= 0 {
		t.MaxBufferedBytes = replay.DefaultMaxBytes
	}
	if t.StaleHoldOff <= 0 {
		t.StaleHoldOff = DefaultStaleHoldOff
	}
	if t.ConnectWarnAfter <= 0 {
		t.ConnectWarnAfter = DefaultConnectWarnAfter
	}
	if t.HandshakeWarnAfter <= 0 {
		t.HandshakeWarnAfter = DefaultHandshakeWarnAfter
	}
	return t
}

// ContextLookup adapts a registry lookup that returns registered contexts
// to the LookupFunc a Mooncake source needs, so callers need not write the
// glue.
func ContextLookup(lookup func(index.ContextKey) (*contexts.Entry, bool)) events.LookupFunc {
	return func(ctx index.ContextKey) (events.SharedSink, *hashing.Profile, bool) {
		c, ok := lookup(ctx)
		if !ok || c == nil {
			return nil, nil, false
		}
		return c.Table, &c.Profile, true
	}
}
