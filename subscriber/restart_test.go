package subscriber

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/streampos"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	zmq "github.com/pebbe/zmq4"
)

// engineProcess is one publisher process: an XPUB on an endpoint, its own
// sequence counter and, with replay, a ROUTER serving its own buffer. A
// process started on the endpoints of a killed one is a restart in place:
// same endpoints, fresh sequence, empty buffer.
type engineProcess struct {
	t    *testing.T
	pub  *publisher
	rs   *replayService // nil without replay
	next uint64
}

func startProcess(t *testing.T, pubEP, replayEP string, first uint64) *engineProcess {
	t.Helper()
	p := &engineProcess{t: t, pub: newPublisher(t, pubEP), next: first}
	if replayEP != "" {
		p.rs = startReplayServiceAt(t, replayEP, map[uint64][]byte{})
	}
	return p
}

func (p *engineProcess) replayEndpoint() string {
	if p.rs == nil {
		return ""
	}
	return p.rs.endpoint
}

// publish sends one batch storing key live (and keeps it for replay).
func (p *engineProcess) publish(key uint64) uint64 {
	seq, payload := p.put(key)
	p.pub.send(seq, payload) // the bytes the replay buffer holds
	return seq
}

// miss is a batch the process published while no subscriber was
// connected: only its replay buffer has it.
func (p *engineProcess) miss(key uint64) uint64 {
	seq, _ := p.put(key)
	return seq
}

// put takes the next sequence for a batch storing key; encoding a map
// twice need not give the same bytes, so the payload is encoded once.
func (p *engineProcess) put(key uint64) (uint64, []byte) {
	seq := p.next
	p.next++
	payload := storedBatch([]uint64{key}, 4, 0)
	if p.rs != nil {
		p.rs.put(seq, payload)
	}
	return seq, payload
}

// reconnect closes the XPUB and binds a new one on the same endpoint, in
// the same process (same sequence, same replay buffer): what a subscriber
// sees of a network break.
func (p *engineProcess) reconnect() {
	p.t.Helper()
	ep := p.pub.endpoint
	p.closePub()
	p.pub = newPublisher(p.t, ep)
	p.pub.waitSubscribed()
}

func (p *engineProcess) closePub() {
	p.pub.subscribed = false // the cleanup then closes without waiting
	_ = p.pub.sock.Close()
}

// kill ends the process: its sockets close and its buffer is gone.
func (p *engineProcess) kill() {
	p.closePub()
	if p.rs != nil {
		p.rs.close()
	}
}

// heldKeys replays an engine recorder's operations into the device-tier
// keys the source holds at the end.
func heldKeys(ops []eventtest.Op) []uint64 {
	held := map[uint64]bool{}
	for _, o := range ops {
		switch o.Kind {
		case "store":
			held[o.Key] = true
		case "remove":
			delete(held, o.Key)
		case "clear":
			if o.Mask&index.AllEngineTiers == index.AllEngineTiers {
				clear(held)
			}
		}
	}
	return slices.Sorted(maps.Keys(held))
}

func keyRange(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

// TestPublisherRestartIsNewEpoch restarts a vLLM publisher in place after
// it published seqs 0-9 (keys 100-109). The new process publishes some
// batches before the subscriber is back (missed: only its own replay buffer
// has them), then live ones, so that its first live number is lower than,
// equal to, next after or higher than the old last. Every case must end
// with the old keys gone and the new stream indexed — all of it where the
// new process's replay buffer can supply what was missed — with one restart
// counted and no re-registration.
func TestPublisherRestartIsNewEpoch(t *testing.T) {
	const oldLast = 9
	for _, tc := range []struct {
		name     string
		replay   bool
		missed   uint64 // batches the new process published before the subscriber was back
		evidence Evidence
	}{
		{"lower", false, 0, EvidenceRegression},
		{"lower, replay", true, 0, EvidenceRegression},
		{"lower with missed, replay", true, 3, EvidenceRegression},
		{"equal", false, oldLast, EvidenceRegression},
		{"equal, replay", true, oldLast, EvidenceRegression},
		{"next number, replay", true, oldLast + 1, EvidenceReplayMismatch},
		{"higher", false, 15, EvidenceReconnectJump},
		{"higher, replay", true, 15, EvidenceReplayMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replayEP := ""
			if tc.replay {
				replayEP = "tcp://127.0.0.1:*"
			}
			p1 := startProcess(t, "tcp://127.0.0.1:*", replayEP, 0)
			e := vllmEnv(t, p1.pub.endpoint, p1.replayEndpoint())
			e.cfg.Session.WatchConnection = true
			s := mustStart(t, e.cfg)
			defer s.Stop()
			p1.pub.waitSubscribed()
			for k := range keyRange(100, oldLast+1) {
				p1.publish(100 + uint64(k))
			}
			waitSeq(t, s, oldLast)
			if got := heldKeys(e.engine.Snapshot()); !slices.Equal(got, keyRange(100, oldLast+1)) {
				t.Fatalf("before the restart the source holds %v", got)
			}

			p1.kill()
			p2 := startProcess(t, p1.pub.endpoint, p1.replayEndpoint(), 0)
			p2.pub.waitSubscribed()
			for i := range tc.missed {
				p2.miss(200 + i)
			}
			start := time.Now()
			var last uint64
			for i := tc.missed; i < tc.missed+3; i++ {
				last = p2.publish(200 + i)
			}
			eventtest.WaitFor(t, "new stream indexed", 10*time.Second, func() bool {
				seq, ok := s.LastSeq()
				return s.Restarts() == 1 && ok && seq == last && s.State() == Live
			})
			t.Logf("restart (%s) handled %v after the new process's first live message", tc.evidence, time.Since(start))
			first := tc.missed // without replay, what was missed is gone
			if tc.replay {
				first = 0
			}
			want := keyRange(200+first, tc.missed+3-first)
			if diff := cmp.Diff(want, heldKeys(e.engine.Snapshot())); diff != "" {
				t.Errorf("held keys after the restart (-want +got):\n%s", diff)
			}
			if got := e.epochOrder(); !slices.Equal(got, keyRange(first, tc.missed+3-first)) {
				t.Errorf("new epoch applied %v", got)
			}
			if s.Stale() || e.counters.Total(MetricStale, sourcetype.VLLM) != 0 {
				t.Errorf("stale %v, stale transitions %d", s.Stale(), e.counters.Total(MetricStale, sourcetype.VLLM))
			}
			// libzmq reconnected by itself: the subscriber reset nothing.
			if n := e.counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize); n != 0 {
				t.Errorf("%d sessions taken for oversize losses, want 0", n)
			}
		})
	}
}

// TestGapsInOneProcessAreNotRestarts is the false-positive measurement:
// hundreds of gaps in one publisher process, some right after a
// reconnection, must all be recovered by replay with nothing dropped and
// no restart counted. With a connection monitor the last applied batch is
// checked against the replay endpoint after each reconnection; without
// one (a source beyond MaxOptionalMonitors) at every gap.
func TestGapsInOneProcessAreNotRestarts(t *testing.T) {
	for _, monitored := range []bool{true, false} {
		t.Run(fmt.Sprintf("monitor=%v", monitored), func(t *testing.T) { gapsInOneProcess(t, monitored) })
	}
}

func gapsInOneProcess(t *testing.T, monitored bool) {
	p := startProcess(t, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 0)
	e := vllmEnv(t, p.pub.endpoint, p.replayEndpoint())
	e.cfg.Session.WatchConnection = monitored
	if !monitored {
		// Every optional monitor taken, as by unreachable publishers.
		e.cfg.Resources = NewResources(ResourcesOptions{Counters: e.counters, MaxOptionalMonitors: 1})
		e.cfg.Resources.monitors.Add(1)
	}
	s := mustStart(t, e.cfg)
	defer s.Stop()
	p.pub.waitSubscribed()
	const n = 900
	reconnections := 0
	var want []uint64
	var lastSent uint64
	for seq := uint64(0); seq < n; seq++ {
		key := 1000 + seq
		want = append(want, key)
		switch {
		case seq > 0 && seq%150 == 0:
			// A network break in the same process: everything sent is
			// applied, the connection drops and comes back, and this
			// batch (every other time) is lost meanwhile.
			waitSeq(t, s, lastSent)
			p.reconnect()
			reconnections++
			if reconnections%2 == 1 {
				p.miss(key)
			} else {
				lastSent = p.publish(key)
			}
		case seq%3 == 2 && seq != n-1:
			p.miss(key) // lost on the way
		default:
			lastSent = p.publish(key)
			if seq%3 == 0 {
				// Each gap is recovered on its own, so every one
				// is a recovery (and, without a monitor, a check of
				// the batch at A) of its own.
				waitSeq(t, s, seq)
			}
		}
	}
	waitSeq(t, s, n-1)
	eventtest.WaitFor(t, "live", 5*time.Second, func() bool { return s.State() == Live })
	var stored []uint64
	for _, o := range e.engine.Snapshot() {
		switch o.Kind {
		case "store":
			stored = append(stored, o.Key)
		case "clear":
			t.Fatalf("entries dropped: %v", o)
		}
	}
	if diff := cmp.Diff(want, stored); diff != "" {
		t.Errorf("stored keys (-want +got):\n%s", diff)
	}
	gaps := e.counters.Total(MetricGaps, sourcetype.VLLM)
	rounds := e.counters.Value(MetricReplays, sourcetype.VLLM, events.ReplayRecovered)
	if s.Restarts() != 0 || gaps < 250 || rounds < 250 || reconnections < 5 {
		t.Errorf("restarts %d over %d gaps (%d replay rounds) and %d reconnections", s.Restarts(), gaps, rounds, reconnections)
	}
	// A lost batch has seq%3 == 2, so a request from A+1 asks for such a
	// seq, one anchored on A for the seq before it.
	p.rs.mu.Lock()
	anchored := 0
	for _, from := range p.rs.requests {
		if from%3 == 1 {
			anchored++
		}
	}
	requests := len(p.rs.requests)
	p.rs.mu.Unlock()
	if monitored && anchored > reconnections || !monitored && anchored < 250 {
		t.Errorf("monitor=%v: %d of %d replay requests anchored on the last applied batch", monitored, anchored, requests)
	}
	if (s.conn.mon != nil) != monitored {
		t.Errorf("monitor %v, want %v", s.conn.mon != nil, monitored)
	}
	t.Logf("monitor=%v: false positives: %d restarts over %d gaps (%d reconnections), %d recovered by replay rounds of their own, %d of %d requests anchored",
		monitored, s.Restarts(), gaps, reconnections, rounds, anchored, requests)
}

// TestMooncakeMasterRestart: the master restarting (its sequence starts
// again at 1) drops every object binding of the old process and indexes the
// new stream.
func TestMooncakeMasterRestart(t *testing.T) {
	m := eventtest.LoadManifest(t)
	first := eventtest.Payload(t, m.Fixture(t, "mooncake_stored_vllm_cpu_disk"))
	second := eventtest.Payload(t, m.Fixture(t, "mooncake_stored_vllm_block2_cpu"))
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := newEnv(t, m, "pool-a-sub", []string{"vllm-a"}, pub.endpoint, "")
	e.cfg.Session.WatchConnection = true
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	pub.send(1, first)
	waitSeq(t, s, 1)
	afterFirst := eventtest.SharedBalance(e.shared.Snapshot())
	pub.send(2, second)
	waitSeq(t, s, 2)
	if len(afterFirst) == 0 || len(eventtest.SharedBalance(e.shared.Snapshot())) <= len(afterFirst) {
		t.Fatalf("fixtures bind nothing new: %v", e.shared.Snapshot())
	}

	ep := pub.endpoint
	pub.subscribed = false
	_ = pub.sock.Close()
	pub2 := newPublisher(t, ep)
	pub2.waitSubscribed()
	pub2.send(1, first)
	eventtest.WaitFor(t, "restart handled", 10*time.Second, func() bool {
		seq, ok := s.LastSeq()
		return s.Restarts() == 1 && ok && seq == 1
	})
	if diff := cmp.Diff(afterFirst, eventtest.SharedBalance(e.shared.Snapshot())); diff != "" {
		t.Errorf("bindings after the restart (-want +got):\n%s", diff)
	}
	if s.Stale() {
		t.Error("stale after a master restart")
	}
}

// TestStaleRecovery: a gap on a stream without replay makes the source
// stale and drops its entries. Under auto the first message after the
// hold-off is a new baseline; under off the subscription is closed and
// nothing is taken until the service is registered again (a new
// subscriber), which then works.
func TestStaleRecovery(t *testing.T) {
	for _, typ := range []string{"vLLM", "Mooncake"} {
		for _, mode := range []StaleRecovery{StaleRecoveryAuto, StaleRecoveryOff} {
			t.Run(typ+"/"+mode.String(), func(t *testing.T) {
				m := eventtest.LoadManifest(t)
				pub := newPublisher(t, "tcp://127.0.0.1:*")
				var e *env
				var batch func(seq uint64) []byte
				if typ == "vLLM" {
					e = vllmEnv(t, pub.endpoint, "")
					batch = func(seq uint64) []byte { return storedBatch([]uint64{500 + seq}, 4, 0) }
				} else {
					e = newEnv(t, m, "pool-a-sub", []string{"vllm-a"}, pub.endpoint, "")
					p := eventtest.Payload(t, m.Fixture(t, "mooncake_stored_vllm_cpu_disk"))
					batch = func(uint64) []byte { return p }
				}
				e.cfg.Session.StaleRecovery = mode
				e.cfg.Tuning.StaleHoldOff = 20 * time.Millisecond
				s := mustStart(t, e.cfg)
				defer func() { s.Stop() }() // s is replaced by a re-registration
				pub.waitSubscribed()
				for seq := uint64(1); seq <= 3; seq++ {
					pub.send(seq, batch(seq))
				}
				waitSeq(t, s, 3)
				pub.send(6, batch(6)) // 4 and 5 lost, no replay
				eventtest.WaitFor(t, "stale", 5*time.Second, s.Stale)
				assertRetracted(t, e)

				if mode == StaleRecoveryOff {
					// The SUB closes: the publisher sees the
					// unsubscription, and nothing sent reaches it.
					waitUnsubscription(t, pub)
					for seq := uint64(7); seq < 12; seq++ {
						pub.send(seq, batch(seq))
					}
					if seq, _ := s.LastSeq(); !s.Stale() || seq != 3 || s.StaleRecoveries() != 0 {
						t.Fatalf("off: stale %v, last seq %d, recoveries %d", s.Stale(), seq, s.StaleRecoveries())
					}
					s.Stop()
					// Registering again starts a fresh subscription.
					s = mustStart(t, e.cfg)
					pub.waitSubscribed()
					pub.send(20, batch(20))
					waitSeq(t, s, 20)
					if s.State() != Live {
						t.Errorf("after re-registration: state %v", s.State())
					}
					return
				}
				// Auto: messages keep coming; once the hold-off has
				// passed one of them is the new baseline.
				next := uint64(7)
				eventtest.Poll(t, "recovered", 10*time.Second, 5*time.Millisecond, func() bool {
					pub.send(next, batch(next))
					next++
					return s.State() == Live
				})
				pub.send(next, batch(next))
				waitSeq(t, s, next)
				if s.StaleRecoveries() != 1 || s.Restarts() != 0 {
					t.Errorf("recoveries %d, restarts %d", s.StaleRecoveries(), s.Restarts())
				}
				if typ == "vLLM" {
					held := heldKeys(e.engine.Snapshot())
					if len(held) < 2 || held[0] < 507 || held[len(held)-1] != 500+next {
						t.Errorf("held after recovery %v (want only keys from 507 on, through %d)", held, 500+next)
					}
				} else if len(eventtest.SharedBalance(e.shared.Snapshot())) == 0 {
					t.Error("Mooncake source holds nothing after recovering")
				}
			})
		}
	}
}

// TestRestartWhileConductorDown: a source restored from a snapshot (its
// position and the digest of its last batch, as Position reports them)
// whose publisher restarted meanwhile must drop the restored entries and
// index the new stream, whatever the new process's first number; one that
// merely went on in the same process resumes through replay with nothing
// dropped.
func TestRestartWhileConductorDown(t *testing.T) {
	for _, tc := range []struct {
		name      string
		restarted bool
		missed    uint64 // batches published while the conductor was down
	}{
		{"restarted, first number next", true, 10},
		{"restarted, higher", true, 14},
		{"restarted, lower", true, 2},
		{"same process", false, 4},
		{"same process, next number", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p1 := startProcess(t, "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", 0)
			e1 := vllmEnv(t, p1.pub.endpoint, p1.replayEndpoint())
			e1.cfg.Durable.Gate = &sync.RWMutex{}
			s1 := mustStart(t, e1.cfg)
			p1.pub.waitSubscribed()
			for i := range uint64(10) {
				p1.publish(100 + i)
			}
			waitSeq(t, s1, 9)
			pos := position(s1, e1.cfg.Durable.Gate)
			s1.Stop() // the conductor goes down
			waitUnsubscription(t, p1.pub)
			if !pos.HasDigest || pos.Seq != 9 {
				t.Fatalf("position %+v", pos)
			}

			p := p1
			firstKey := uint64(110)
			if tc.restarted {
				p1.kill()
				p = startProcess(t, p1.pub.endpoint, p1.replayEndpoint(), 0)
				firstKey = 200
			}
			for i := range tc.missed {
				p.miss(firstKey + i)
			}
			re := newResumeEnv(t, p.pub.endpoint, p.replayEndpoint(), &streampos.Resume{Seq: pos.Seq, Digest: pos.Digest, HasDigest: pos.HasDigest})
			s := mustStart(t, re.cfg)
			defer s.Stop()
			p.pub.waitSubscribed()
			var last uint64
			for i := tc.missed; i < tc.missed+2; i++ {
				last = p.publish(firstKey + i)
			}
			waitSeq(t, s, last)
			eventtest.WaitFor(t, "resumed", 5*time.Second, s.Resumed)
			ops := re.engine.Snapshot()
			if !tc.restarted {
				// Nothing missed settles in order, unless the replay
				// endpoint answered the confirmation after the live
				// batches were published: they then came through it
				// first (and live as duplicates).
				want := []streampos.Outcome{streampos.Replay}
				if got := re.outcome(); tc.missed == 0 && cmp.Equal(got, []streampos.Outcome{streampos.InOrder}) {
					want = got
				}
				if diff := cmp.Diff(want, re.outcome()); diff != "" {
					t.Errorf("outcome (-want +got):\n%s", diff)
				}
				if s.Restarts() != 0 || slices.ContainsFunc(ops, func(o eventtest.Op) bool { return o.Kind == "clear" }) {
					t.Errorf("same process: restarts %d, ops %v", s.Restarts(), ops)
				}
				if diff := cmp.Diff(keyRange(110, tc.missed+2), heldKeys(ops)); diff != "" {
					t.Errorf("caught up (-want +got):\n%s", diff)
				}
				return
			}
			if diff := cmp.Diff([]streampos.Outcome{streampos.Restarted}, re.outcome()); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if len(ops) == 0 || ops[0].Kind != "clear" {
				t.Errorf("restored entries not dropped first: %v", ops)
			}
			// Everything the new process published, from its own buffer.
			if diff := cmp.Diff(keyRange(200, tc.missed+2), heldKeys(ops)); diff != "" {
				t.Errorf("new stream (-want +got):\n%s", diff)
			}
			if s.Restarts() != 1 {
				t.Errorf("restarts %d", s.Restarts())
			}
		})
	}
}

func TestStaleRecoveryNames(t *testing.T) {
	for _, v := range []string{"auto", "off"} {
		m, ok := ParseStaleRecovery(v)
		if !ok || m.String() != v {
			t.Errorf("%q: %v %v", v, m, ok)
		}
	}
	if _, ok := ParseStaleRecovery("on"); ok {
		t.Error(`"on" accepted`)
	}
	if DefaultStaleHoldOff >= 5*time.Second {
		t.Errorf("hold-off %v: a message published 5 s after the gap must be indexed", DefaultStaleHoldOff)
	}
}

// waitUnsubscription fails the test unless the publisher sees its
// subscriber's subscription go within 5 s.
func waitUnsubscription(t *testing.T, p *publisher) {
	t.Helper()
	poller := zmq.NewPoller()
	poller.Add(p.sock, zmq.POLLIN)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		polled, err := poller.Poll(time.Until(deadline))
		if err != nil || len(polled) == 0 {
			continue
		}
		b, err := p.sock.RecvBytes(0)
		if err == nil && len(b) > 0 && b[0] == 0 {
			p.subscribed = false
			return
		}
	}
	t.Fatal("the subscription was not closed")
}

// TestStaleRecoveryDefaultHoldOff: with the default hold-off, a stream that
// keeps publishing after an unrecoverable gap is indexed again by itself;
// the time from the gap to the new baseline is logged (docs/api.md,
// "Choices where the contract is silent", promises that a message
// published 5 s after the gap is indexed).
func TestStaleRecoveryDefaultHoldOff(t *testing.T) {
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	e := vllmEnv(t, pub.endpoint, "")
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()
	pub.send(1, storedBatch([]uint64{1}, 4, 0))
	waitSeq(t, s, 1)
	gap := time.Now()
	pub.send(3, storedBatch([]uint64{3}, 4, 0))
	eventtest.WaitFor(t, "stale", 5*time.Second, s.Stale)
	next := uint64(4)
	eventtest.Poll(t, "recovered", 2*DefaultStaleHoldOff+5*time.Second, 10*time.Millisecond, func() bool {
		pub.send(next, storedBatch([]uint64{next}, 4, 0))
		next++
		seq, ok := s.LastSeq()
		return s.State() == Live && ok && seq >= 4
	})
	t.Logf("indexed again %v after the gap (hold-off %v)", time.Since(gap), DefaultStaleHoldOff)
	if s.StaleRecoveries() != 1 {
		t.Errorf("recoveries %d", s.StaleRecoveries())
	}
}
