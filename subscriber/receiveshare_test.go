package subscriber

import (
	"testing"
	"time"

	"github.com/mooncake-conductor-go/conductor/index"
	"github.com/mooncake-conductor-go/conductor/internal/events"
	"github.com/mooncake-conductor-go/conductor/internal/sourcetype"
	"github.com/mooncake-conductor-go/conductor/internal/testkit/eventtest"
	"github.com/mooncake-conductor-go/conductor/internal/zmqx"
)

// TestReceiveShare: the receive part is split among the running sources,
// half for the queue and half for a recovery, with each floor; the queue
// is counted in the source's own messages (at least a sixteenth of the
// message limit); an unbounded part leaves the Tuning's values.
func TestReceiveShare(t *testing.T) {
	const KiB, MiB = 1 << 10, 1 << 20
	for _, tc := range []struct {
		name    string
		total   int64
		sources int
		largest int
		want    ReceiveLimits
	}{
		{"256 MiB limit, 4 sources of small batches", 24 * MiB, 4, 2 * KiB, ReceiveLimits{HWM: 32, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB}},
		{"4 sources of 1 MiB batches", 24 * MiB, 4, MiB, ReceiveLimits{HWM: 3, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB}},
		{"a batch just over a power of two counts as the next", 24 * MiB, 4, 512*KiB + 1, ReceiveLimits{HWM: 3, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB}},
		{"1 source, before its first message", 24 * MiB, 1, 0, ReceiveLimits{HWM: 128, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 12 * MiB}},
		{"none running yet", 24 * MiB, 0, 0, ReceiveLimits{HWM: 128, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 12 * MiB}},
		{"many sources: the floors", 24 * MiB, 64, 2 * KiB, ReceiveLimits{HWM: minReceiveHWM, MaxMessageBytes: 3 * MiB / 2, BufferedBytes: 3 * MiB / 2}},
		{"small part: the smallest message limit", 4 * MiB, 2, 0, ReceiveLimits{HWM: 32, MaxMessageBytes: minMessageBytes, BufferedBytes: MiB}},
		{"large part: the unbounded message limit", 1 << 30, 1, 0, ReceiveLimits{HWM: 512, MaxMessageBytes: zmqx.MaxMessageBytes, BufferedBytes: 512 * MiB}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReceiveShare(tc.total)
			for range tc.sources {
				r.join()
			}
			if got := r.limits(tc.largest); got != tc.want {
				t.Errorf("limits %+v, want %+v", got, tc.want)
			}
			if !r.bounded() {
				t.Error("a sized part is not bounded")
			}
		})
	}
	if newReceiveShare(0).bounded() {
		t.Error("an unsized part bounds the sources")
	}
}

// TestReceiveQueueFollowsShare: a running source's receive high-water mark
// follows the receive part as sources join, and the size of the messages
// it receives, from its next drain.
func TestReceiveQueueFollowsShare(t *testing.T) {
	reg, prof, tb := vllmTable(t, index.Options{})
	pub := newPublisher(t, "tcp://127.0.0.1:*")
	res := NewResources(ResourcesOptions{Counters: NewCounters(), ReceiveBytes: 24 << 20})
	s := mustStart(t, Config{
		Source:    SourceConfig{Key: "svc", Type: sourcetype.VLLM, Endpoint: pub.endpoint},
		Index:     IndexConfig{Context: eventtest.ContextOf(reg), Profile: prof, Engine: tb, Owner: tb.AddEngineOwner("svc", 0)},
		Report:    ReportConfig{Logger: eventtest.Logger(t)},
		Resources: res,
	})
	pub.waitSubscribed()
	for range 3 { // three more sources share the part
		res.receive.join()
	}
	const size = 100 << 10 // rounds up to 128 KiB, over the 96 KiB floor
	received := func(n uint64) func() bool {
		return func() bool { return s.counters.Value(MetricReceived, sourcetype.VLLM, events.ReasonNone) >= n }
	}
	pub.send(1, make([]byte, size))
	eventtest.WaitFor(t, "the message received", 10*time.Second, received(1))
	pub.send(2, []byte{0x90}) // the next drain sizes the queue by it
	eventtest.WaitFor(t, "the next message received", 10*time.Second, received(2))
	s.Stop() // the run goroutine has ended: its session can be read
	if s.conn.largest != size {
		t.Errorf("largest message %d, want %d", s.conn.largest, size)
	}
	// 24 MiB among four sources: 3 MiB for the queue, in 128 KiB messages.
	if want := 3 << 20 / (128 << 10); s.conn.hwm != want {
		t.Errorf("high-water mark %d after the drain, want %d", s.conn.hwm, want)
	}
}
