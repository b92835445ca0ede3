package subscriber

import (
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// checkFixture compares what one fixture message did with its manifest
// expectation. prior are the ops its requires recorded, got the ops it
// recorded itself.
func checkFixture(t *testing.T, f *eventtest.Fixture, e *env, s *Subscriber, seq uint64, prior, got []eventtest.Op, envRejectedBefore uint64, exactSeq bool) {
	t.Helper()
	typ, _ := sourcetype.Parse(f.SourceType)
	outcomes := e.outcomesOf(seq)
	switch {
	case f.Expect.Envelope == "reject":
		if n := e.counters.Total(MetricEnvelopeRejected, typ); n != envRejectedBefore+1 {
			t.Errorf("envelope rejections = %d, want %d", n, envRejectedBefore+1)
		}
		if len(outcomes) != 0 || len(got) != 0 {
			t.Errorf("rejected envelope produced outcomes %v / ops %v", outcomes, got)
		}
	case f.Expect.Batch == "reject":
		if s.State() != Stale {
			t.Errorf("state = %v, want stale", s.State())
		}
		if len(outcomes) != 0 {
			t.Errorf("rejected batch produced outcomes %v", outcomes)
		}
		want := []eventtest.Op{{Kind: "clear", Owner: eventtest.Owner, Mask: index.AllEngineTiers}}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("stale retraction ops (-want +got):\n%s", diff)
		}
	default:
		var results []string
		for _, o := range outcomes {
			results = append(results, o.Result.String())
		}
		eventtest.CheckApplied(t, f, results, outcomes, prior, got)
		if s.State() == Stale {
			t.Errorf("source became stale")
		}
	}
	if last, ok := s.LastSeq(); !ok || last < seq || (exactSeq && last != seq) {
		t.Errorf("last applied = %d,%v, want %d (sequence advances)", last, ok, seq)
	}
}

// TestFixturesOverZMQ replays every fixture through a real PUB socket on ipc
// (requires first, consecutive sequences) and checks the same expectations,
// plus that the sequence moved on normally afterwards.
func TestFixturesOverZMQ(t *testing.T) {
	m := eventtest.LoadManifest(t)
	for i := range m.Fixtures {
		f := &m.Fixtures[i]
		if f.Expect.Role != "" {
			continue // replay frame layouts, covered by the replay tests
		}
		t.Run(f.ID, func(t *testing.T) {
			t.Parallel()
			runFixtureOverZMQ(t, m, f)
		})
	}
}

func runFixtureOverZMQ(t *testing.T, m *eventtest.Manifest, f *eventtest.Fixture) {
	pub := newPublisher(t, ipcEndpoint(t, "pub"))
	e := newEnv(t, m, f.Registration, f.AlsoRegistered, pub.endpoint, "")
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	typ, _ := sourcetype.Parse(f.SourceType)

	if f.FramesFile != "" {
		frames := eventtest.Frames(t, f)
		if f.Expect.Message == "drop" {
			// baseline, the malformed message, then the next sequence: if
			// the drop touched sequence state, seq 11 would not be in order.
			pub.send(10, emptyBatch(f.SourceType))
			pub.sendFrames(frames...)
			pub.send(11, emptyBatch(f.SourceType))
			waitSeq(t, s, 11)
			if got := e.counters.Total(MetricDropped, typ); got != 1 {
				t.Errorf("dropped = %d, want 1", got)
			}
			if st := s.State(); st != Live {
				t.Errorf("state = %v, want live", st)
			}
			if got := e.appliedOrder(); !slices.Equal(got, []uint64{10, 11}) {
				t.Errorf("applied %v, want [10 11]", got)
			}
			return
		}
		pub.sendFrames(frames...)
		seq := uint64(0)
		eventtest.WaitFor(t, "first message", 5*time.Second, func() bool { var ok bool; seq, ok = s.LastSeq(); return ok })
		got := e.engine.Take()
		checkFixture(t, f, e, s, seq, nil, got, 0, true)
		return
	}

	seq := uint64(100)
	for _, r := range f.Requires {
		pub.send(seq, eventtest.Payload(t, m.Fixture(t, r)))
		seq++
	}
	if len(f.Requires) > 0 {
		waitSeq(t, s, seq-1)
	}
	prior := append(e.engine.Take(), e.shared.Take()...)
	before := e.counters.Total(MetricEnvelopeRejected, typ)
	topic, err := hex.DecodeString(f.TopicHex)
	if err != nil {
		t.Fatalf("topic_hex: %v", err)
	}
	pub.sendFrames(topic, seqFrame(seq), eventtest.Payload(t, f)) // the fixture's own topic
	if f.Expect.SourceState == "stale" {
		eventtest.WaitFor(t, "stale", 5*time.Second, s.Stale)
	} else {
		// a following empty batch proves the fixture was consumed in order
		pub.send(seq+1, emptyBatch(f.SourceType))
		waitSeq(t, s, seq+1)
	}
	got := append(e.engine.Take(), e.shared.Take()...)
	if f.Expect.SourceState != "stale" {
		// the trailing empty batch adds nothing
		e.mu.Lock()
		e.applied = e.applied[:len(e.applied)-1]
		e.mu.Unlock()
		last, _ := s.LastSeq()
		if last != seq+1 {
			t.Errorf("last applied %d, want %d", last, seq+1)
		}
		checkFixture(t, f, e, s, seq, prior, got, before, false)
	} else {
		checkFixture(t, f, e, s, seq, prior, got, before, true)
	}
	checkHashMismatches(t, f, e)
	s.Stop()
	if st := s.State(); st != Stopped {
		t.Errorf("state after Stop = %v", st)
	}
	all := append(append(prior, got...), e.engine.Take()...)
	all = append(all, e.shared.Take()...)
	if bal := eventtest.SharedBalance(all); len(bal) != 0 {
		t.Errorf("shared references left after Stop: %v", bal)
	}
	if typ != sourcetype.Mooncake {
		if ops := all[len(all)-1]; ops.Kind != "clear" || ops.Mask != index.AllEngineTiers {
			t.Errorf("Stop did not clear the engine owner: last op %v", ops)
		}
	}
}

// mismatchFixtures are the payload fixtures whose published hashes the
// registered profile does not reproduce (a salt, a LoRA name, bigram pairs
// or a partial page under a plain chain's hash: they test decoding). The
// events package checks every fixture's exact counts; over ZMQ, every
// engine fixture runs with a checker and exactly these mismatch; the same
// event in a batch rejected for its dp_rank (sglang_stored_salt_session)
// is never applied, so never checked.
var mismatchFixtures = map[string]bool{
	"vllm_stored_newest_fields":      true,
	"vllm_lora_stored":               true,
	"sglang_stored_salt_session_dp0": true,
	"sglang_stored_bigram_tokens":    true,
	"sglang_stored_partial_page":     true,
	// the metadata map's cache_salt of array-encoded SGLang stores
	"sglang_legacy_array_events":     true,
	"sglang_array_layout_30827":      true,
	"sglang_array_longer_than_known": true,
}

func checkHashMismatches(t *testing.T, f *eventtest.Fixture, e *env) {
	t.Helper()
	if e.check == nil {
		return
	}
	if _, mm := e.check.Counts(); (mm > 0) != mismatchFixtures[f.ID] {
		t.Errorf("%d hash-check mismatches; want some: %v", mm, mismatchFixtures[f.ID])
	}
}
