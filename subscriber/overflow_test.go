package subscriber

import (
	"github.com/mooncake-conductor-go/conductor/source"
	"slices"

	zmq "github.com/pebbe/zmq4"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
)

// lagSink delays every store, making the subscriber slower than its
// publisher.
type lagSink struct {
	inner *recorder
	delay time.Duration
}

func (s *lagSink) Store(id index.OwnerID, t index.Tier, k uint64) {
	time.Sleep(s.delay)
	s.inner.Store(id, t, k)
}
func (s *lagSink) Remove(id index.OwnerID, t index.Tier, k uint64) { s.inner.Remove(id, t, k) }
func (s *lagSink) ClearOwner(id index.OwnerID, m index.TierMask)   { s.inner.ClearOwner(id, m) }

// TestHWMOverflowIsRecoveredAsGap: a publisher faster than its subscriber
// overflows the high-water marks, so ZMQ silently drops messages; the
// subscriber sees that as a sequence gap and recovers it through replay,
// ending with every block, in order.
func TestHWMOverflowIsRecoveredAsGap(t *testing.T) {
	rs := startReplayService(t)
	// A PUB with a tiny high-water mark and socket buffer, set before
	// bind (a listener copies its options when it binds), over IPC, whose
	// Unix socket buffers little, unlike autotuned loopback TCP.
	sock, err := zmq.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = sock.SetLinger(0)
	if err := sock.SetSndhwm(4); err != nil {
		t.Fatal(err)
	}
	if err := sock.SetSndbuf(4096); err != nil {
		t.Fatal(err)
	}
	ep := ipcEndpoint(t, "overflow")
	if err := sock.Bind(ep); err != nil {
		t.Fatal(err)
	}
	pub := &publisher{t: t, sock: sock, endpoint: ep}
	t.Cleanup(func() {
		pub.waitUnsubscribed()
		_ = sock.Close()
	})
	e := vllmEnv(t, pub.endpoint, rs.endpoint)
	e.cfg.Context.BlockSize = 1024
	e.cfg.Tuning.RcvHWM = 4
	e.cfg.Engine = &lagSink{inner: e.engine, delay: 100 * time.Microsecond}
	s := mustStart(t, e.cfg)
	defer s.Stop()
	pub.waitSubscribed()

	const n = 1500
	var want []uint64
	payloads := make([][]byte, n+2)
	for seq := uint64(1); seq <= n+1; seq++ {
		key := seq*7919 + 1
		want = append(want, key)
		// ~3 KB a message, so kernel socket buffers cannot absorb the
		// burst and the high-water marks do overflow.
		payloads[seq] = storedBatch([]uint64{key}, 1024, 0)
		rs.put(seq, payloads[seq])
	}
	// Encoded up front, so the burst is as fast as ZMQ can send.
	for seq := uint64(1); seq <= n; seq++ {
		pub.send(seq, payloads[seq])
	}
	// Let the backlog drain, then send one more so any loss at the tail
	// shows up as a gap too.
	prev := uint64(0)
	waitFor(t, "backlog to drain", 90*time.Second, func() bool {
		time.Sleep(100 * time.Millisecond)
		got, _ := s.LastSeq()
		if testing.Verbose() {
			t.Logf("seq %d state %v", got, s.State())
		}
		idle := got == prev && s.State() == Live
		prev = got
		return idle
	})
	pub.send(n+1, payloads[n+1])
	waitSeq(t, s, n+1)
	waitFor(t, "live", 10*time.Second, func() bool { return s.State() == Live })
	var got []uint64
	for _, o := range e.engine.snapshot() {
		if o.Kind == "store" {
			got = append(got, o.Key)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %d keys, want %d", len(got), len(want))
	}
	gaps := e.counters.Total(MetricGaps, source.VLLM)
	if gaps == 0 {
		t.Fatal("no message was dropped: the test did not overflow the high-water marks")
	}
	t.Logf("%d gaps recovered through %d replay requests", gaps, rs.requestCount())
}
