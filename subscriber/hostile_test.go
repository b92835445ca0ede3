package subscriber

import (
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/source"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"
)

// TestHostilePublisher: one publisher sends garbage at line rate, a batch
// of more events than a batch may hold, and a message over the size limit;
// the first two are counted and dropped, the last costs the publisher its
// connection; the Go heap stays bounded, and a second, well-behaved
// publisher's batches, sent meanwhile to the same index, are all applied.
func TestHostilePublisher(t *testing.T) {
	m := eventtest.LoadManifest(t)
	reg := m.Registration(t, "vllm-a")
	prof := eventtest.ResolveProfile(t, reg)
	ix := index.New(index.Options{MemoryLimit: 8 << 20})
	defer ix.Close()
	tb := ix.EnsureTable(eventtest.ContextOf(reg), prof)
	counters := NewCounters()
	start := func(key, endpoint string) *Subscriber {
		return mustStart(t, Config{Key: key, Type: source.VLLM, Endpoint: endpoint, Context: eventtest.ContextOf(reg),
			Profile: prof, Engine: tb, Owner: tb.AddEngineOwner(key, 0), Logger: eventtest.Logger(t), Counters: counters})
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
	if n := counters.Value(MetricEnvelopeRejected, source.VLLM, events.EnvTooManyEvents); n != 1 {
		t.Errorf("too_many_events rejections %d, want 1", n)
	}
	rejected := counters.Total(MetricEnvelopeRejected, source.VLLM)
	if rejected < rounds {
		t.Errorf("%d envelopes rejected, want at least the %d garbage messages", rejected, rounds)
	}

	// A message over the size limit: libzmq drops the connection instead
	// of buffering the message (the publisher sees the subscription go),
	// and nothing of it is applied.
	bad.send(seq+1, make([]byte, zmqx.MaxMessageBytes+1))
	bad.waitUnsubscribedWithin(t, 10*time.Second)
	bad.subscribed = false
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
