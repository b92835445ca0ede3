package subscriber

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/hashing"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// vllmTable is the fixtures' vllm-a registration, its hash profile and
// its table in an index of its own, closed when the test ends.
func vllmTable(t *testing.T, opts index.Options) (eventtest.Registration, hashing.Profile, *index.Table) {
	t.Helper()
	reg := eventtest.LoadManifest(t).Registration(t, "vllm-a")
	prof := eventtest.ResolveProfile(t, reg)
	ix := index.New(opts)
	t.Cleanup(ix.Close)
	return reg, prof, ix.EnsureTable(eventtest.ContextOf(reg))
}

// TestHostilePublisher: one publisher sends garbage at line rate, a batch
// of more events than a batch may hold, and a message over the size limit;
// the first two are counted and dropped, the last costs the publisher its
// session, which libzmq does not reconnect; the Go heap stays bounded, a
// second, well-behaved publisher's batches, sent meanwhile to the same
// index, are all applied, and the subscriber reconnects the first one by
// itself: the lost message is a gap (no replay: stale), after which the
// same publisher's batches are indexed again without a re-registration.
func TestHostilePublisher(t *testing.T) {
	reg, prof, tb := vllmTable(t, index.Options{MemoryLimit: 8 << 20})
	counters := NewCounters()
	start := func(key, endpoint string) *Subscriber {
		return mustStart(t, Config{
			Source:    SourceConfig{Key: key, Type: sourcetype.VLLM, Endpoint: endpoint},
			Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner(key, 0)},
			Tuning:    Tuning{StaleHoldOff: time.Nanosecond},
			Report:    ReportConfig{Logger: eventtest.Logger(t)},
			Resources: NewResources(ResourcesOptions{Counters: counters}),
		})
	}
	bad, good := newPublisher(t, ipcEndpoint(t, "bad")), newPublisher(t, ipcEndpoint(t, "good"))
	sBad, sGood := start("bad", bad.endpoint), start("good", good.endpoint)
	defer sBad.Stop()
	defer sGood.Stop()
	bad.waitSubscribed()
	good.waitSubscribed()

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap0 := ms.HeapAlloc

	// Garbage at line rate, interleaved with the good publisher's batches.
	r := rand.New(rand.NewPCG(7, 7))
	garbage := make([]byte, 4096)
	const rounds = 20000
	seq := uint64(0)
	for i := range rounds {
		for j := range garbage {
			garbage[j] = byte(r.Uint32())
		}
		seq++
		bad.send(seq, garbage)
		if i%100 == 0 {
			good.send(uint64(i/100+1), storedBatch([]uint64{uint64(1000 + i)}, reg.BlockSize, 0))
		}
	}
	waitSeq(t, sBad, seq)
	goodLast := uint64(rounds / 100)
	waitSeq(t, sGood, goodLast)

	// A batch of more events than MaxBatchEvents: empty maps, a byte each.
	evs := make([]any, events.MaxBatchEvents+1)
	for i := range evs {
		evs[i] = map[string]any{}
	}
	endless, err := msgpack.Marshal([]any{1789095808.5, evs, 0})
	if err != nil {
		t.Fatal(err)
	}
	seq++
	bad.send(seq, endless)
	waitSeq(t, sBad, seq)
	if n := counters.Value(MetricEnvelopeRejected, sourcetype.VLLM, events.EnvTooManyEvents); n != 1 {
		t.Errorf("too_many_events rejections %d, want 1", n)
	}
	rejected := counters.Total(MetricEnvelopeRejected, sourcetype.VLLM)
	if rejected < rounds {
		t.Errorf("%d envelopes rejected, want at least the %d garbage messages", rejected, rounds)
	}

	// A message over the size limit: libzmq drops the connection instead
	// of buffering the message (the publisher sees the subscription go),
	// and nothing of it is applied. libzmq does not reconnect after that
	// protocol error; the subscriber does, so the subscription comes back.
	if n := counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize); n != 0 {
		t.Fatalf("oversize drops %d before any, want 0", n)
	}
	bad.send(seq+1, make([]byte, zmqx.MaxMessageBytes+1))
	bad.waitUnsubscribedWithin(t, 10*time.Second)
	bad.subscribed = false
	bad.waitSubscribed()
	eventtest.WaitFor(t, "the oversize session counted", 10*time.Second, func() bool {
		return counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize) == 1
	})
	if got, _ := sBad.LastSeq(); got != seq {
		t.Errorf("last seq %d after the oversize message, want %d", got, seq)
	}

	// The good publisher carries on, and its blocks are all reported.
	good.send(goodLast+1, storedBatch([]uint64{7}, reg.BlockSize, 0))
	waitSeq(t, sGood, goodLast+1)
	if sGood.Stale() {
		t.Fatal("the well-behaved source went stale")
	}
	if got := tb.PrefixCount(); got != int(goodLast)+1 {
		t.Errorf("%d blocks indexed, want the good publisher's %d", got, goodLast+1)
	}

	// The reconnected publisher's next batch shows the lost message as a
	// gap: without replay, the stale rules apply (not a restart, since
	// the subscriber itself reconnected) ...
	bad.send(seq+2, storedBatch([]uint64{500}, reg.BlockSize, 0))
	eventtest.WaitFor(t, "the bad source stale after the gap", 10*time.Second, sBad.Stale)
	if n := counters.Value(MetricStale, sourcetype.VLLM, events.StaleGap); n != 1 {
		t.Errorf("gap stale transitions %d, want 1", n)
	}
	if n := sBad.Restarts(); n != 0 {
		t.Errorf("%d restarts detected, want 0: the publisher kept running", n)
	}
	// ... and the one after it is indexed again, no re-registration.
	bad.send(seq+3, storedBatch([]uint64{501}, reg.BlockSize, 0))
	waitSeq(t, sBad, seq+3)
	if sBad.Stale() {
		t.Error("the bad source is still stale after its new baseline")
	}
	if got := tb.PrefixCount(); got != int(goodLast)+2 {
		t.Errorf("%d blocks indexed, want the good publisher's %d and the healed one's 1", got, goodLast+1)
	}
	if n := counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize); n != 1 {
		t.Errorf("oversize drops %d, want 1", n)
	}

	runtime.GC()
	runtime.ReadMemStats(&ms)
	// Decoding 80 MiB of garbage, a 64 K-event batch and a refused 16 MiB
	// message leaves the heap where it was, but for the decoders' reused
	// buffers (a batch's events at most).
	if grown := int64(ms.HeapAlloc) - int64(heap0); grown > 64<<20 {
		t.Errorf("heap grew by %d MiB", grown>>20)
	}
}

// waitUnsubscribedWithin fails the test unless the subscriber's
// subscription goes (its connection dropped) within d.
func (p *publisher) waitUnsubscribedWithin(t *testing.T, d time.Duration) {
	t.Helper()
	poller := zmq.NewPoller()
	poller.Add(p.sock, zmq.POLLIN)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		polled, err := poller.Poll(time.Until(deadline))
		if err != nil || len(polled) == 0 {
			break
		}
		if b, err := p.sock.RecvBytes(0); err == nil && len(b) > 0 && b[0] == 0 {
			return
		}
	}
	t.Fatalf("the subscriber of %s kept its connection", p.endpoint)
}

// TestOversizeMessageWithReplay: a source with replay loses its session to
// a message over the size limit; the subscriber reconnects it, and the gap
// goes to the replay endpoint. Its record of the lost message is over the
// limit too (a publisher replays what it published), so the replay cannot
// deliver it: the source goes stale by the replay rules, not as a restart,
// and its next batch is indexed again without a re-registration.
func TestOversizeMessageWithReplay(t *testing.T) {
	reg, prof, tb := vllmTable(t, index.Options{})
	counters := NewCounters()
	pub := newPublisher(t, ipcEndpoint(t, "pub"))
	rs := startReplayService(t)
	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "svc", Type: sourcetype.VLLM, Endpoint: pub.endpoint, ReplayEndpoint: rs.endpoint},
		Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("svc", 0)},
		Tuning:    Tuning{StaleHoldOff: time.Nanosecond, ReplayReceiveTimeout: 200 * time.Millisecond, ReplayTotalTimeout: time.Second},
		Report:    ReportConfig{Logger: eventtest.Logger(t)},
		Resources: NewResources(ResourcesOptions{Counters: counters}),
	})
	defer s.Stop()
	pub.waitSubscribed()

	first := storedBatch([]uint64{1}, reg.BlockSize, 0)
	rs.put(1, first)
	pub.send(1, first)
	waitSeq(t, s, 1)

	oversize := make([]byte, zmqx.MaxMessageBytes+1)
	rs.put(2, oversize)
	pub.send(2, oversize)
	pub.waitUnsubscribedWithin(t, 10*time.Second)
	pub.subscribed = false
	pub.waitSubscribed()
	eventtest.WaitFor(t, "the oversize session counted", 10*time.Second, func() bool {
		return counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize) == 1
	})

	third := storedBatch([]uint64{3}, reg.BlockSize, 0)
	rs.put(3, third)
	pub.send(3, third)
	eventtest.WaitFor(t, "stale after the unreplayable gap", 20*time.Second, s.Stale)
	if n := counters.Total(MetricStale, sourcetype.VLLM); n != 1 {
		t.Errorf("%d stale transitions, want 1", n)
	}
	if n := counters.Value(MetricStale, sourcetype.VLLM, events.StaleGap); n != 0 {
		t.Errorf("%d plain gap stale transitions, want 0: the source has replay", n)
	}
	if n := s.Restarts(); n != 0 {
		t.Errorf("%d restarts detected, want 0: the replay endpoint still holds the applied batch", n)
	}
	if got := tb.PrefixCount(); got != 0 {
		t.Errorf("%d blocks indexed while stale, want 0", got)
	}

	fourth := storedBatch([]uint64{4}, reg.BlockSize, 0)
	rs.put(4, fourth)
	pub.send(4, fourth)
	waitSeq(t, s, 4)
	if s.Stale() {
		t.Error("still stale after the new baseline")
	}
	if got := tb.PrefixCount(); got != 1 {
		t.Errorf("%d blocks indexed, want the new baseline's 1", got)
	}
}

// TestHandshakeFailureReconnects: the endpoint is held by a peer that
// fails the ZMTP handshake (another mechanism), a protocol error after
// which libzmq does not retry either. The subscriber reconnects by itself,
// without counting an oversize message.
func TestHandshakeFailureReconnects(t *testing.T) {
	reg, prof, tb := vllmTable(t, index.Options{})
	counters := NewCounters()

	peer := eventtest.NewRawPeer(t, eventtest.BogusZMTPGreeting())

	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "svc", Type: sourcetype.VLLM, Endpoint: peer.Endpoint()},
		Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("svc", 0)},
		Report:    ReportConfig{Logger: eventtest.Logger(t)},
		Resources: NewResources(ResourcesOptions{Counters: counters}),
	})
	defer s.Stop()
	eventtest.WaitFor(t, "a second connection after the failed handshake", 20*time.Second, func() bool {
		return peer.Accepted() >= 2
	})
	if n := counters.Value(MetricDropped, sourcetype.VLLM, events.DropOversize); n != 0 {
		t.Errorf("%d oversize drops for a handshake failure, want 0", n)
	}
}
