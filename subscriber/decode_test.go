package subscriber

import (
	"testing"

	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// direct builds an offline subscriber for a manifest registration.
func direct(t *testing.T, reg string, also ...string) (*Subscriber, *env) {
	t.Helper()
	e := newEnv(t, eventtest.LoadManifest(t), reg, also, "inproc://unused", "")
	s, err := newSubscriber(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.seq.started = true
	s.setState(Live)
	return s, e
}

// TestEnvelopeEdges: how the subscriber answers the decoder's verdicts on
// a whole batch: an engine batch of another dp rank makes the source stale,
// rejected envelopes are counted and do not.
func TestEnvelopeEdges(t *testing.T) {
	s, e := direct(t, "vllm-a")
	// batch rank beyond int: mismatch -> stale
	s.applyBatch(1, eventtest.Encode(t, []any{1.5, []any{}, uint64(1) << 40}))
	if s.State() != Stale || e.counters.Value(MetricBatchRejected, sourcetype.VLLM, events.BatchDPMismatch) != 1 {
		t.Errorf("state %v counters %v", s.State(), e.counters.Snapshot())
	}
	s2, e2 := direct(t, "pool-a-sub", "vllm-a")
	for i, p := range [][]byte{
		eventtest.Encode(t, []any{int64(-1), []any{}, 0}),                   // negative ms
		eventtest.Encode(t, []any{uint64(1), []any{}, -1}),                  // negative dp
		append(eventtest.Encode(t, []any{uint64(1), []any{}, 0})[:3], 0xc1), // invalid byte inside
	} {
		s2.applyBatch(uint64(i+1), p)
	}
	if n := e2.counters.Total(MetricEnvelopeRejected, sourcetype.Mooncake); n != 3 {
		t.Errorf("rejected %d envelopes: %v", n, e2.counters.Snapshot())
	}
	if s2.State() != Live {
		t.Errorf("envelope rejections must not make the source stale")
	}
}
