package subscriber

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
)

// A restored source with a replay endpoint and a digest confirms its
// position by asking the endpoint for the restored batch right after it
// subscribes, without waiting for a live message: an idle engine publishes
// none (docs/state.md#what-survives-a-restart). Every case here publishes
// nothing live.
func TestConfirmAtSubscription(t *testing.T) {
	const restored = 10
	old := storedBatch([]uint64{restored}, 4, 0)
	for _, tc := range []struct {
		name  string
		store map[uint64][]byte // the replay endpoint's buffer
		// deadline, when set, is the catch-up deadline from the start
		deadline time.Duration
		silent   bool // the replay endpoint never answers
		outcome  streampos.Outcome
		applied  []uint64 // sequences applied
		held     []uint64 // keys held at the end
		restarts uint64
	}{
		{name: "idle, same process", store: map[uint64][]byte{9: storedBatch([]uint64{9}, 4, 0), restored: old},
			outcome: streampos.InOrder, held: []uint64{1, 2}},
		{name: "same process went on", store: map[uint64][]byte{restored: old, 11: storedBatch([]uint64{11}, 4, 0), 12: storedBatch([]uint64{12}, 4, 0)},
			outcome: streampos.Replay, applied: []uint64{11, 12}, held: []uint64{1, 2, 11, 12}},
		// Its window starts at 9: the oldest record it holds starts the
		// new stream.
		{name: "another process at A", store: map[uint64][]byte{9: storedBatch([]uint64{209}, 4, 0), restored: storedBatch([]uint64{210}, 4, 0), 11: storedBatch([]uint64{211}, 4, 0)},
			outcome: streampos.Restarted, applied: []uint64{9, restored, 11}, held: []uint64{209, 210, 211}, restarts: 1},
		{name: "another process not that far yet", store: map[uint64][]byte{0: storedBatch([]uint64{200}, 4, 0), 1: storedBatch([]uint64{201}, 4, 0)},
			outcome: streampos.Restarted, applied: []uint64{0, 1}, held: []uint64{200, 201}, restarts: 1},
		{name: "A gone from the window", store: map[uint64][]byte{12: storedBatch([]uint64{12}, 4, 0)},
			outcome: streampos.Cold},
		{name: "endpoint silent until the catch-up deadline", silent: true, deadline: 300 * time.Millisecond,
			outcome: streampos.Lagging},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := startReplayService(t)
			for s, p := range tc.store {
				rs.put(s, p)
			}
			if tc.silent {
				rs.mu.Lock()
				rs.hold = make(chan struct{})
				rs.mu.Unlock()
			}
			pub := newPublisher(t, "tcp://127.0.0.1:*")
			re := newResumeEnv(t, pub.endpoint, rs.endpoint, &streampos.Resume{Seq: restored, Digest: digestOf(old), HasDigest: true})
			// The restored entries: keys 1 and 2.
			re.cfg.Durable.Restore.Deadline = time.Now().Add(time.Hour)
			if tc.deadline > 0 {
				re.cfg.Durable.Restore.Deadline = time.Now().Add(tc.deadline)
			}
			s := mustStart(t, re.cfg)
			defer s.Stop()
			eventtest.WaitFor(t, "settled without a live message", 10*time.Second, s.Resumed)
			// A new process's buffer is indexed after it settles.
			if n := len(tc.applied); n > 0 {
				waitSeq(t, s, tc.applied[n-1]) // published after the batch's effects
			}
			if diff := cmp.Diff([]streampos.Outcome{tc.outcome}, re.outcome()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.applied, re.appliedOrder()); diff != "" {
				t.Errorf("applied (-want +got):\n%s", diff)
			}
			ops := re.engine.Snapshot()
			cleared := slices.ContainsFunc(ops, func(o eventtest.Op) bool { return o.Kind == "clear" })
			if keep := tc.outcome == streampos.InOrder || tc.outcome == streampos.Replay; cleared == keep {
				t.Errorf("restored entries cleared %v, ops %v", cleared, ops)
			}
			if got := s.Restarts(); got != tc.restarts {
				t.Errorf("restarts %d, want %d", got, tc.restarts)
			}
			// The applied keys on top of the restored ones (which the
			// recorder did not see stored).
			want := tc.held
			if !cleared && len(want) >= 2 {
				want = want[2:]
			}
			if diff := cmp.Diff(want, heldKeys(ops), cmp.Comparer(func(a, b []uint64) bool { return len(a)+len(b) == 0 || slices.Equal(a, b) })); diff != "" {
				t.Errorf("held keys (-want +got):\n%s", diff)
			}
			pos := position(s, re.cfg.Durable.Gate)
			if pos.CatchingUp {
				t.Errorf("position still catching up after settling: %+v", pos)
			}
			if keep := tc.outcome == streampos.InOrder; keep && (!pos.HasSeq || pos.Seq != restored || pos.Digest != digestOf(old)) {
				t.Errorf("a confirmed position is not kept for the next snapshot: %+v", pos)
			}
		})
	}
}

// Live messages arriving while the confirmation is under way are ordered
// with the replayed records: each sequence applied once, none skipped.
func TestConfirmOrdersLiveMessages(t *testing.T) {
	const restored = 10
	old := storedBatch([]uint64{restored}, 4, 0)
	rs := startReplayService(t)
	rs.put(restored, old)
	rs.mu.Lock()
	hold := make(chan struct{})
	rs.hold = hold
	rs.mu.Unlock()
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	re := newResumeEnv(t, pub.endpoint, rs.endpoint, &streampos.Resume{Seq: restored, Digest: digestOf(old), HasDigest: true})
	s := mustStart(t, re.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	eventtest.WaitFor(t, "the confirmation asked", 5*time.Second, func() bool { return rs.requestCount() > 0 })
	// While the endpoint holds its answer: 11-13 are published (kept in
	// its buffer too), only 12 and 13 reach the live socket.
	for seq := uint64(11); seq <= 13; seq++ {
		p := storedBatch([]uint64{seq}, 4, 0)
		rs.put(seq, p)
		if seq > 11 {
			pub.send(seq, p)
		}
	}
	close(hold)
	eventtest.WaitFor(t, "settled", 5*time.Second, s.Resumed)
	pub.send(14, storedBatch([]uint64{14}, 4, 0))
	waitSeq(t, s, 14)
	if diff := cmp.Diff([]uint64{11, 12, 13, 14}, re.appliedOrder()); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]streampos.Outcome{streampos.Replay}, re.outcome()); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
}

// A position a live peer vouched for settles at once, before any message.
// With a replay endpoint it is still asked once subscribed, so a publisher
// that restarted since the peer's cut is a new epoch; one that restarts
// later is one by the usual rules.
func TestPeerConfirmedPosition(t *testing.T) {
	const restored = 10
	old := storedBatch([]uint64{restored}, 4, 0)
	for _, tc := range []struct {
		name     string
		atA      []byte // the replay endpoint's record at A
		first    uint64 // the first live sequence
		restarts uint64
	}{
		{"same process", old, restored + 1, 0},
		{"restarted since the cut", storedBatch([]uint64{310}, 4, 0), restored + 1, 1},
		{"restarted later", old, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := startReplayService(t)
			rs.put(restored, tc.atA)
			pub := newPublisher(t, "tcp://127.0.0.1:*")
			re := newResumeEnv(t, pub.endpoint, rs.endpoint, &streampos.Resume{Seq: restored, Digest: digestOf(old), HasDigest: true, Confirmed: true})
			s := mustStart(t, re.cfg)
			defer s.Stop()
			if !s.Resumed() {
				t.Fatal("a peer-confirmed source is catching up")
			}
			if diff := cmp.Diff([]streampos.Outcome{streampos.Peer}, re.outcome()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			// (The confirmation may already have started the stream
			// over when the publisher restarted.)
			if got := position(s, re.cfg.Durable.Gate); tc.name != "restarted since the cut" && (got.CatchingUp || got.Seq != restored || !got.HasSeq) {
				t.Errorf("position %+v", got)
			}
			pub.waitSubscribed()
			eventtest.WaitFor(t, "the replay endpoint asked", 5*time.Second, func() bool { return rs.requestCount() > 0 && s.State() == Live })
			next := storedBatch([]uint64{tc.first + 100}, 4, 0)
			rs.put(tc.first, next)
			pub.send(tc.first, next)
			waitSeq(t, s, tc.first)
			if got := s.Restarts(); got != tc.restarts {
				t.Errorf("restarts %d, want %d", got, tc.restarts)
			}
			cleared := slices.ContainsFunc(re.engine.Snapshot(), func(o eventtest.Op) bool { return o.Kind == "clear" })
			if cleared != (tc.restarts > 0) {
				t.Errorf("entries cleared %v", cleared)
			}
			if diff := cmp.Diff([]streampos.Outcome{streampos.Peer}, re.outcome()); diff != "" {
				t.Errorf("outcome after the first message (-want +got):\n%s", diff)
			}
		})
	}
}

// A peer's position stands when the replay endpoint does not answer: the
// entries stay, and the stream goes on in order.
func TestPeerConfirmedPositionSilentReplay(t *testing.T) {
	const restored = 10
	old := storedBatch([]uint64{restored}, 4, 0)
	rs := startReplayService(t)
	rs.mu.Lock()
	rs.hold = make(chan struct{})
	rs.mu.Unlock()
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	re := newResumeEnv(t, pub.endpoint, rs.endpoint, &streampos.Resume{Seq: restored, Digest: digestOf(old), HasDigest: true, Confirmed: true})
	re.cfg.Tuning.ReplayReceiveTimeout, re.cfg.Tuning.ReplayTotalTimeout = 100*time.Millisecond, 300*time.Millisecond
	s := mustStart(t, re.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	eventtest.WaitFor(t, "the confirmation given up", 5*time.Second, func() bool { return rs.requestCount() > 0 && s.State() == Live })
	pub.send(restored+1, storedBatch([]uint64{11}, 4, 0))
	waitSeq(t, s, restored+1)
	if ops := re.engine.Snapshot(); slices.ContainsFunc(ops, func(o eventtest.Op) bool { return o.Kind == "clear" }) {
		t.Errorf("the peer's entries were dropped: %v", ops)
	}
	if diff := cmp.Diff([]uint64{restored + 1}, re.appliedOrder()); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]streampos.Outcome{streampos.Peer}, re.outcome()); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
}
