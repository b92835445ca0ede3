package durable

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-conductor-go/conductor/internal/state/statedir"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
)

// stats are the durable state's figures for /metrics.
type stats struct {
	mu              sync.Mutex
	lastSuccess     time.Time
	lastDuration    time.Duration
	lastBytes       int64
	failures        map[string]uint64
	restoreStart    time.Time
	restoreDuration time.Duration // set once, at Start
	// origin is where the index came from at start: OriginPeer,
	// OriginStateDir or OriginNone. Set once, in Open.
	origin string

	restored      atomic.Int64 // sources restored from the snapshot
	restoredPairs atomic.Int64
	inOrder       atomic.Int64
	replayed      atomic.Int64
	cold          atomic.Int64
	restarted     atomic.Int64
	peer          atomic.Int64 // taken as confirmed from a live peer's snapshot
	lagging       atomic.Int64 // not settled at the catch-up timeout: restored entries dropped
}

func (st *stats) init() {
	st.failures = map[string]uint64{}
	for _, r := range []string{statedir.ReasonNoSpace, statedir.ReasonPermission, statedir.ReasonMissingDir, statedir.ReasonIO} {
		st.failures[r] = 0
	}
}

func (st *stats) success(at time.Time, took time.Duration, size int64) {
	st.mu.Lock()
	st.lastSuccess, st.lastDuration, st.lastBytes = at, took, size
	st.mu.Unlock()
}

func (st *stats) failure(reason string) {
	st.mu.Lock()
	st.failures[reason]++
	st.mu.Unlock()
}

func (st *stats) outcome(o streampos.Outcome) {
	switch o {
	case streampos.InOrder:
		st.inOrder.Add(1)
	case streampos.Replay:
		st.replayed.Add(1)
	case streampos.Cold:
		st.cold.Add(1)
	case streampos.Restarted:
		st.restarted.Add(1)
	case streampos.Lagging:
		st.lagging.Add(1)
	case streampos.Peer:
		st.peer.Add(1)
	}
}

// Origins of the index at start, as conductor_restore_origin labels them.
const (
	OriginPeer     = "peer"
	OriginStateDir = "state_dir"
	OriginNone     = "none"
)

// The metrics' descriptors; read-only after initialisation.
var (
	descLastSuccess = prometheus.NewDesc("conductor_snapshot_last_success_timestamp_seconds",
		"Unix time of the cut the last index snapshot written describes (0: none since start).", nil, nil)
	descDuration = prometheus.NewDesc("conductor_snapshot_duration_seconds",
		"How long the last successful snapshot took, cut to fsync.", nil, nil)
	descBytes = prometheus.NewDesc("conductor_snapshot_bytes",
		"Size of the last successful snapshot.", nil, nil)
	descFailures = prometheus.NewDesc("conductor_snapshot_failures_total",
		"Snapshot writes that failed, by reason (no_space, permission, missing_dir, io).", []string{"reason"}, nil)
	descRestoreDuration = prometheus.NewDesc("conductor_restore_duration_seconds",
		"Time from reading the snapshot to every start-up registration restored.", nil, nil)
	descOrigin = prometheus.NewDesc("conductor_restore_origin",
		"Where the index was restored from at start: 1 for the origin used (peer: a replica's GET /snapshot; state_dir: this replica's own snapshot; none: an empty index), 0 for the others.", []string{"origin"}, nil)
	descRestored = prometheus.NewDesc("conductor_restore_sources",
		"Sources restored from the snapshot at start, and how they settled: restored, in_order, replay, cold, restarted (the publisher restarted meanwhile: restored entries dropped, new stream indexed), peer (a live peer's position, taken as confirmed), lagging (not confirmed by the catch-up timeout: restored entries dropped).", []string{"outcome"}, nil)
)

// Collector exports the figures.
func (s *State) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *State }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLastSuccess, descDuration, descBytes, descFailures, descRestoreDuration, descRestored, descOrigin} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := &c.s.stats
	st.mu.Lock()
	last := 0.0
	if !st.lastSuccess.IsZero() {
		last = float64(st.lastSuccess.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(descLastSuccess, prometheus.GaugeValue, last)
	ch <- prometheus.MustNewConstMetric(descDuration, prometheus.GaugeValue, st.lastDuration.Seconds())
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.lastBytes))
	for r, n := range st.failures {
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(n), r)
	}
	restore, origin := st.restoreDuration, st.origin
	st.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descRestoreDuration, prometheus.GaugeValue, restore.Seconds())
	for _, o := range []string{OriginPeer, OriginStateDir, OriginNone} {
		v := 0.0
		if o == origin {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descOrigin, prometheus.GaugeValue, v, o)
	}
	for _, o := range []struct {
		name string
		v    *atomic.Int64
	}{{"restored", &st.restored}, {"in_order", &st.inOrder}, {"replay", &st.replayed}, {"cold", &st.cold}, {"restarted", &st.restarted}, {"peer", &st.peer}, {"lagging", &st.lagging}} {
		ch <- prometheus.MustNewConstMetric(descRestored, prometheus.GaugeValue, float64(o.v.Load()), o.name)
	}
}
