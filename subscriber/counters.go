package subscriber

import (
	"fmt"
	"sync/atomic"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
)

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

// metricNames are the families' names; read-only, a table fixed at compile
// time.
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
	v [numMetrics][sourcetype.NumTypes][events.NumReasons]atomic.Uint64
}

// NewCounters returns a zeroed counter set.
func NewCounters() *Counters { return &Counters{} }

func (c *Counters) add(m Metric, t sourcetype.Type, r events.Reason, n uint64) {
	if c == nil || t >= sourcetype.NumTypes {
		return
	}
	c.v[m][t][r].Add(n)
}

// Value returns one counter; reason is ReasonNone for families without a
// reason (received, applied, gaps).
func (c *Counters) Value(m Metric, t sourcetype.Type, r events.Reason) uint64 {
	if c == nil || m >= numMetrics || t >= sourcetype.NumTypes || r >= events.NumReasons {
		return 0
	}
	return c.v[m][t][r].Load()
}

// Total sums a family over all reasons for one source type.
func (c *Counters) Total(m Metric, t sourcetype.Type) uint64 {
	var n uint64
	for r := events.Reason(0); r < events.NumReasons; r++ {
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
	return c.samples(false)
}

// samples lists the counters in the order of Snapshot: the non-zero ones,
// and with zeros the series familyReasons declares.
func (c *Counters) samples(zeros bool) []Sample {
	if c == nil {
		return nil
	}
	var out []Sample
	for m := Metric(0); m < numMetrics; m++ {
		for t := sourcetype.Type(0); t < sourcetype.NumTypes; t++ {
			for r := events.Reason(0); r < events.NumReasons; r++ {
				v := c.v[m][t][r].Load()
				if v == 0 && !(zeros && familyReasons[m][r]) {
					continue
				}
				reason := ""
				if r != events.ReasonNone {
					reason = r.String()
				}
				out = append(out, Sample{Metric: m.String(), Source: t.String(), Reason: reason, Value: v})
			}
		}
	}
	return out
}

// familyReasons is, per family, every reason it counts by (ReasonNone for
// families without one): the series a metrics endpoint exports from
// start-up, at zero until something is counted, so that rates and alerts
// work before the first event. Read-only after initialisation.
var familyReasons = func() (t [numMetrics][events.NumReasons]bool) {
	span := func(m Metric, from, to events.Reason) {
		for r := from; r <= to; r++ {
			t[m][r] = true
		}
	}
	for _, m := range []Metric{MetricReceived, MetricApplied, MetricGaps} {
		t[m][events.ReasonNone] = true
	}
	span(MetricDropped, events.DropFrameCount, events.DropOversize)
	span(MetricEnvelopeRejected, events.EnvEmpty, events.EnvDPRank)
	span(MetricBatchRejected, events.BatchDPMismatch, events.BatchDPMismatch)
	span(MetricIgnored, events.IgnMedium, events.NoBinding)
	span(MetricRejected, events.EvNotMap, events.EvLayout)
	span(MetricStale, events.StaleGap, events.StaleInternal)
	span(MetricReplays, events.ReplayRecovered, events.ReplayStopped)
	return t
}()

// All returns every series a family can count, for every source type, zero
// or not, plus any other non-zero counter, in the order of Snapshot.
func (c *Counters) All() []Sample {
	return c.samples(true)
}

// ServiceOutcomes counts one source's rejected and ignored events by reason,
// so an operator sees which service sends what (docs/events.md#metrics);
// the shared Counters count the same events by source type. Safe for
// concurrent use and on a nil receiver.
type ServiceOutcomes struct {
	rejected, ignored [events.NumReasons]atomic.Uint64
}

func (o *ServiceOutcomes) add(rejected bool, r events.Reason) {
	if o == nil || r >= events.NumReasons {
		return
	}
	if rejected {
		o.rejected[r].Add(1)
	} else {
		o.ignored[r].Add(1)
	}
}

// Value returns one count: rejected events, or ignored (and no-op) ones,
// with reason r.
func (o *ServiceOutcomes) Value(rejected bool, r events.Reason) uint64 {
	if o == nil || r >= events.NumReasons {
		return 0
	}
	if rejected {
		return o.rejected[r].Load()
	}
	return o.ignored[r].Load()
}

// Each calls fn for every reason the rejected and ignored families count
// by, zero or not (the series a metrics endpoint exports from
// registration on), and for any other reason counted.
func (o *ServiceOutcomes) Each(fn func(rejected bool, reason string, n uint64)) {
	for _, rej := range [...]bool{true, false} {
		m := MetricIgnored
		if rej {
			m = MetricRejected
		}
		for r := events.Reason(1); r < events.NumReasons; r++ {
			if v := o.Value(rej, r); v != 0 || familyReasons[m][r] {
				fn(rej, r.String(), v)
			}
		}
	}
}
