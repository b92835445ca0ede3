package subscriber

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// resumeEnv is a vLLM source restored at seq 10, with its outcome recorded.
type resumeEnv struct {
	*env
	mu       sync.Mutex
	outcomes []streampos.Outcome
}

func newResumeEnv(t *testing.T, endpoint, replayEP string, r *streampos.Resume) *resumeEnv {
	re := &resumeEnv{env: vllmEnv(t, endpoint, replayEP)}
	re.cfg.Durable.Gate = &sync.RWMutex{}
	re.cfg.Durable.Restore = streampos.NewRestore(*r, func(o streampos.Outcome) {
		re.mu.Lock()
		re.outcomes = append(re.outcomes, o)
		re.mu.Unlock()
	})
	return re
}

func (re *resumeEnv) outcome() []streampos.Outcome {
	re.mu.Lock()
	defer re.mu.Unlock()
	return slices.Clone(re.outcomes)
}

// kinds lists the recorded sink calls by kind, with stored keys.
func kinds(ops []eventtest.Op) []string {
	var out []string
	for _, o := range ops {
		if o.Kind == "store" {
			out = append(out, "store "+string(rune('0'+o.Key%10)))
			continue
		}
		out = append(out, o.Kind)
	}
	return out
}

func position(s *Subscriber, gate *sync.RWMutex) streampos.Position {
	gate.Lock()
	defer gate.Unlock()
	return s.Position()
}

// The first live message follows the recorded sequence: the restored
// entries stay, nothing is cleared, the source is caught up.
func TestResumeInOrder(t *testing.T) {
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	re := newResumeEnv(t, pub.endpoint, "", &streampos.Resume{Seq: 10})
	s := mustStart(t, re.cfg)
	defer s.Stop()
	if s.Resumed() {
		t.Error("resumed before any message")
	}
	if got := position(s, re.cfg.Durable.Gate); !cmp.Equal(got, streampos.Position{Seq: 10, HasSeq: true, CatchingUp: true}) {
		t.Errorf("position before any message %+v", got)
	}
	pub.waitSubscribed()
	pub.send(11, storedBatch([]uint64{1}, 4, 0))
	waitSeq(t, s, 11)
	if diff := cmp.Diff([]streampos.Outcome{streampos.InOrder}, re.outcome()); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"store 1"}, kinds(re.engine.Snapshot())); diff != "" {
		t.Errorf("sink calls (-want +got):\n%s", diff)
	}
	if !s.Resumed() || s.State() != Live {
		t.Errorf("resumed %v, state %v", s.Resumed(), s.State())
	}
}

// The downtime's gap is recovered through replay exactly like a live gap.
func TestResumeThroughReplay(t *testing.T) {
	rs := startReplayService(t)
	for seq := uint64(11); seq <= 14; seq++ {
		rs.put(seq, storedBatch([]uint64{seq}, 4, 0))
	}
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	re := newResumeEnv(t, pub.endpoint, rs.endpoint, &streampos.Resume{Seq: 10})
	s := mustStart(t, re.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	pub.send(15, storedBatch([]uint64{15}, 4, 0))
	waitSeq(t, s, 15)
	eventtest.WaitFor(t, "resumed", 5*time.Second, s.Resumed)
	if diff := cmp.Diff([]uint64{11, 12, 13, 14, 15}, re.appliedOrder()); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]streampos.Outcome{streampos.Replay}, re.outcome()); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	for _, o := range re.engine.Snapshot() {
		if o.Kind == "clear" {
			t.Errorf("restored entries cleared: %v", o)
		}
	}
}

// Where the gap cannot be recovered the source resumes cold: the restored
// entries go, the first message received is its baseline, and it is not
// stale.
func TestResumeCold(t *testing.T) {
	for name, tc := range map[string]struct {
		replay  bool
		first   uint64
		outcome streampos.Outcome
	}{
		"no replay endpoint":             {false, 15, streampos.Cold},
		"replay no longer holds the gap": {true, 15, streampos.Cold},
		"publisher restarted":            {false, 1, streampos.Restarted},
		"publisher restarted, replay":    {true, 3, streampos.Restarted},
	} {
		t.Run(name, func(t *testing.T) {
			replayEP := ""
			if tc.replay {
				replayEP = startReplayService(t).endpoint // holds nothing
			}
			pub := newPublisher(t, "tcp://127.0.0.1:*")
			re := newResumeEnv(t, pub.endpoint, replayEP, &streampos.Resume{Seq: 10})
			s := mustStart(t, re.cfg)
			defer s.Stop()
			pub.waitSubscribed()
			pub.send(tc.first, storedBatch([]uint64{tc.first}, 4, 0))
			waitSeq(t, s, tc.first)
			pub.send(tc.first+1, storedBatch([]uint64{tc.first + 1}, 4, 0))
			waitSeq(t, s, tc.first+1)
			if diff := cmp.Diff([]streampos.Outcome{tc.outcome}, re.outcome()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]uint64{tc.first, tc.first + 1}, re.appliedOrder()); diff != "" {
				t.Errorf("applied (-want +got):\n%s", diff)
			}
			ops := re.engine.Snapshot()
			if len(ops) == 0 || ops[0].Kind != "clear" {
				t.Errorf("the restored entries were not dropped first: %v", ops)
			}
			if s.State() != Live || s.Stale() {
				t.Errorf("state %v", s.State())
			}
			if got := position(s, re.cfg.Durable.Gate); !cmp.Equal(got, streampos.Position{Seq: tc.first + 1, HasSeq: true}, cmpopts.IgnoreFields(streampos.Position{}, "Digest", "HasDigest")) {
				t.Errorf("position %+v", got)
			}
			// Live gaps after that follow the usual rules.
			pub.send(tc.first+5, storedBatch([]uint64{9}, 4, 0))
			if !tc.replay {
				eventtest.WaitFor(t, "stale after a live gap", 5*time.Second, s.Stale)
			}
		})
	}
}

// A source that was stale stays stale, holding nothing.
func TestResumeStale(t *testing.T) {
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	re := newResumeEnv(t, pub.endpoint, "", &streampos.Resume{Seq: 10, Stale: true})
	s := mustStart(t, re.cfg)
	defer s.Stop()
	if !s.Stale() || !s.Resumed() {
		t.Errorf("stale %v resumed %v", s.Stale(), s.Resumed())
	}
	if got := position(s, re.cfg.Durable.Gate); !cmp.Equal(got, streampos.Position{Stale: true}) {
		t.Errorf("position %+v", got)
	}
}

// A Mooncake source takes its bindings back at start, reports them in its
// position, and releases them when it resumes cold (it has no replay).
func TestResumeMooncakeBindings(t *testing.T) {
	m := eventtest.LoadManifest(t)
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := newEnv(t, m, "pool-a-sub", []string{"vllm-a"}, pub.endpoint, "")
	ctx := eventtest.ContextOf(m.Registrations["vllm-a"])
	bindings := []events.Binding{
		{Backend: "be", Tenant: ctx.Tenant, Identity: "obj-1", Tier: uint8(index.CPUShare), Model: ctx.Model, Lora: ctx.Lora, BlockSize: ctx.BlockSize, Prefix: 5, FullHash: "00aa"},
		{Backend: "be", Tenant: ctx.Tenant, Identity: "obj-2", Tier: uint8(index.Disk), Model: ctx.Model, Lora: ctx.Lora, BlockSize: ctx.BlockSize, Prefix: 6, FullHash: "00bb"},
		// a context no engine binds any more: dropped
		{Backend: "be", Tenant: ctx.Tenant, Identity: "obj-3", Tier: uint8(index.Disk), Model: "gone", BlockSize: ctx.BlockSize, Prefix: 7, FullHash: "00cc"},
	}
	gate := &sync.RWMutex{}
	e.cfg.Durable.Gate = gate
	var outcome []streampos.Outcome
	var mu sync.Mutex
	e.cfg.Durable.Restore = streampos.NewRestore(streampos.Resume{Seq: 4, Bindings: bindings},
		func(o streampos.Outcome) { mu.Lock(); outcome = append(outcome, o); mu.Unlock() })
	s := mustStart(t, e.cfg)
	defer s.Stop()
	want := []eventtest.Op{{Kind: "acquire", Tier: index.CPUShare, Key: 5}, {Kind: "acquire", Tier: index.Disk, Key: 6}}
	if diff := cmp.Diff(eventtest.SortOps(want), eventtest.SortOps(e.shared.Snapshot())); diff != "" {
		t.Errorf("restored references (-want +got):\n%s", diff)
	}
	pos := position(s, gate)
	slices.SortFunc(pos.Bindings, func(a, b events.Binding) int { return int(a.Prefix) - int(b.Prefix) })
	if diff := cmp.Diff(streampos.Position{Seq: 4, HasSeq: true, Bindings: bindings[:2], CatchingUp: true}, pos); diff != "" {
		t.Errorf("position (-want +got):\n%s", diff)
	}
	pub.waitSubscribed()
	pub.send(9, emptyBatch("Mooncake"))
	waitSeq(t, s, 9)
	mu.Lock()
	if diff := cmp.Diff([]streampos.Outcome{streampos.Cold}, outcome); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	mu.Unlock()
	if bal := eventtest.SharedBalance(e.shared.Snapshot()); len(bal) != 0 {
		t.Errorf("references left after a cold resume: %v", bal)
	}
}
