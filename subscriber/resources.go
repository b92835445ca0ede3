package subscriber

import (
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
)

// MaxOptionalMonitors bounds the connection monitors held at once by
// sources that watch their connection only to report it (the registry's
// state, sources registered at run time) rather than for readiness
// (SessionConfig.WatchConnection, the config file's). A monitor lives as
// long as its source, because reconnections are evidence of publisher
// restarts (docs/events.md#restarts): without the bound, the most sources
// the registry takes would hold more descriptors than docs/operations.md's limits
// budget. A source started beyond the bound reports connected with its first
// batch instead, sees no reconnections, and so checks every gap against its
// replay endpoint; nor does it see a session libzmq ended for good (an
// oversize message, session.go), so it stays deaf until registered again. A
// slot that frees is not handed to such a source: a monitor attached late
// would miss the connection under way, and count its connections from a
// point it cannot know.
const MaxOptionalMonitors = 1024

// Resources is what every subscriber of a process shares: the counters the
// metrics export, the receive part of the memory budget, the budget of
// optional connection monitors (what it
// rations, libzmq's socket limit, counts every socket of the process), the
// free list of C receive batches, and the C heap trimmer. The app creates
// one and passes it to every Start; its methods are safe for concurrent
// use.
type Resources struct {
	counters *Counters
	events   *events.Stats
	trim     *zmqx.Trimmer
	batches  batchPool
	// monitors counts the monitors held under maxMonitors.
	monitors    atomic.Int32
	maxMonitors int32
	receive     *receiveShare
}

// ResourcesOptions configure NewResources; zero fields take defaults.
type ResourcesOptions struct {
	Counters *Counters     // nil: NewCounters()
	Events   *events.Stats // the decoders' process-wide figures; nil: a new set
	Trimmer  *zmqx.Trimmer // nil: one trimming the C heap
	// MaxOptionalMonitors overrides MaxOptionalMonitors (tests).
	MaxOptionalMonitors int
	// ReceiveBytes is the memory budget's receive part, which every
	// source's receive queue and recovery buffer share
	// (docs/index-memory.md#the-receive-path); 0 (an unbounded budget):
	// each source takes its Tuning's values.
	ReceiveBytes int64
}

// NewResources returns the state the process's subscribers share.
func NewResources(o ResourcesOptions) *Resources {
	if o.Counters == nil {
		o.Counters = NewCounters()
	}
	if o.Events == nil {
		o.Events = &events.Stats{}
	}
	if o.Trimmer == nil {
		o.Trimmer = zmqx.NewTrimmer(nil)
	}
	if o.MaxOptionalMonitors <= 0 {
		o.MaxOptionalMonitors = MaxOptionalMonitors
	}
	return &Resources{counters: o.Counters, events: o.Events, trim: o.Trimmer, maxMonitors: int32(o.MaxOptionalMonitors),
		receive: newReceiveShare(o.ReceiveBytes)}
}

// ReceiveHeld is what the recoveries of every source hold now, in payload
// bytes: the part of the receive path this process can read (libzmq's
// queues it cannot), as of each recovery's last step.
func (sh *Resources) ReceiveHeld() int64 { return sh.receive.held.Load() }

// ReceiveLimits are the bounds a running source whose largest message so
// far is largest bytes gets under the receive part, and whether the part
// bounds them at all.
func (sh *Resources) ReceiveLimits(largest int) (ReceiveLimits, bool) {
	return sh.receive.limits(largest), sh.receive.bounded()
}

// Counters are the ingest counters every subscriber adds to.
func (sh *Resources) Counters() *Counters { return sh.counters }

// Events are the decoders' figures summed over every source.
func (sh *Resources) Events() *events.Stats { return sh.events }

// Trimmer is the C heap trimmer the receivers ask after a backlog drained.
func (sh *Resources) Trimmer() *zmqx.Trimmer { return sh.trim }

// takeMonitor takes a slot among the optional monitors, if one is free.
func (sh *Resources) takeMonitor() bool {
	if sh.monitors.Add(1) <= sh.maxMonitors {
		return true
	}
	sh.monitors.Add(-1)
	return false
}

func (sh *Resources) giveMonitor() { sh.monitors.Add(-1) }

// Close frees the idle C receive batches; call it after every subscriber
// using sh has stopped.
func (sh *Resources) Close() { sh.batches.close() }
