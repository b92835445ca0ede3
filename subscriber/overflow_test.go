package subscriber

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	zmq "github.com/pebbe/zmq4"
)

// gateSink holds the first store until released, so the subscriber reads
// nothing while the publisher bursts.
type gateSink struct {
	inner   *eventtest.Recorder
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (s *gateSink) Store(id index.OwnerID, p index.Put) (uint32, bool) {
	s.once.Do(func() {
		close(s.entered)
		<-s.release
	})
	return s.inner.Store(id, p)
}
func (s *gateSink) Remove(id index.OwnerID, p index.Put) bool     { return s.inner.Remove(id, p) }
func (s *gateSink) ClearOwner(id index.OwnerID, m index.TierMask) { s.inner.ClearOwner(id, m) }

// TestHWMOverflowIsRecoveredAsGap: a publisher that bursts while its
// subscriber reads nothing overflows the high-water marks, so ZMQ silently
// drops messages; the subscriber sees that as a sequence gap and recovers
// it through replay, ending with every block, in order.
//
// The overflow is certain rather than hoped for: the subscriber is held
// inside its first batch for the whole burst, and what the path can queue
// meanwhile (4 messages at each end and a Unix socket buffer of a few KiB)
// is far below the burst (600 messages of 3 KiB).
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
	e.cfg.Index.Context.BlockSize = 1024
	e.cfg.Tuning.RcvHWM = 4
	// Replay timeouts long enough for any machine: the test waits for the
	// recovery, it does not time it.
	e.cfg.Tuning.ReplayReceiveTimeout = time.Minute
	e.cfg.Tuning.ReplayTotalTimeout = 2 * time.Minute
	gate := &gateSink{inner: e.engine, entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gate.release) }) }
	e.cfg.Index.Engine = gate
	s := mustStart(t, e.cfg)
	defer s.Stop()
	defer release() // before Stop, which waits for the goroutine
	pub.waitSubscribed()

	const n = 600
	var want []uint64
	payloads := make([][]byte, n+1)
	for seq := uint64(1); seq <= n; seq++ {
		key := seq*7919 + 1
		want = append(want, key)
		// ~3 KB a message, so socket buffers cannot absorb the burst.
		payloads[seq] = storedBatch([]uint64{key}, 1024, 0)
		rs.put(seq, payloads[seq])
	}
	pub.send(1, payloads[1])
	select {
	case <-gate.entered:
	case <-time.After(time.Minute):
		t.Fatal("the first batch never reached the index")
	}
	for seq := uint64(2); seq <= n; seq++ {
		pub.send(seq, payloads[seq])
	}
	release()
	// Empty batches after the burst, also in the replay store, until the
	// subscriber has applied past it: a loss at the tail then shows as a
	// gap too. They are spaced out so that a long recovery does not fill
	// its buffer with them.
	hb := uint64(n)
	empty := emptyBatch("vLLM")
	eventtest.WaitFor(t, "the subscriber to apply past the burst", 3*time.Minute, func() bool {
		if last, ok := s.LastSeq(); ok && last > n && s.State() == Live {
			return true
		}
		if s.State() == Stale {
			t.Fatalf("source went stale: %v", e.counters.Snapshot())
		}
		hb++
		rs.put(hb, empty)
		pub.send(hb, empty)
		time.Sleep(20 * time.Millisecond)
		return false
	})
	var got []uint64
	for _, o := range e.engine.Snapshot() {
		if o.Kind == "store" {
			got = append(got, o.Key)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("stored %d keys, want %d", len(got), len(want))
	}
	gaps := e.counters.Total(MetricGaps, sourcetype.VLLM)
	if gaps == 0 || rs.requestCount() == 0 {
		t.Fatalf("%d gaps, %d replay requests: the burst must have overflowed the queues", gaps, rs.requestCount())
	}
	t.Logf("%d gaps recovered through %d replay requests", gaps, rs.requestCount())
}
